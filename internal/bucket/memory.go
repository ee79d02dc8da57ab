package bucket

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// MemoryOptions configures NewMemory. The zero value selects every default.
type MemoryOptions struct {
	// Shards is the number of independently locked shards, rounded up to a power of two.
	// (Optional) default 8*GOMAXPROCS rounded up, at least 256.
	Shards int
	// MaxKeys caps the tracked keys, all algorithms together: never more are kept. The cap is
	// split across shards (fewer shards when MaxKeys is small, so each holds at least 16), so
	// with unevenly spread keys evictions can begin a few percent below MaxKeys.
	// (Optional) default 1_000_000.
	MaxKeys int
}

// Memory is the in-process Store: keyed algorithm state in sharded hash tables, each shard under
// its own mutex. Decisions are exact under concurrency: a group's shards are locked (in ascending
// order, so concurrent groups cannot deadlock) for the whole evaluate-and-commit.
//
// State is small: a token- or leaky-bucket key is one int64 (its tat), a fixed-window key a
// FixedState, each in an open-addressing table of its own (see table: one cache miss per lookup
// where a map takes two). A sliding-window key is kept in a compact form (16-bit counters, 48
// bytes with the key in a table of its own) when its counters and slot width fit, and as a
// SlidingState in a map otherwise (Count above 65535, a counter above 65535 left from
// such a Count, or a width without a 16-bit tag); a key moves between the two with its counts
// intact.
//
// Memory stays bounded without a background goroutine. A key is idle when its state equals a
// fresh key's (the bucket is full, every counted request has left its window); a shard forgets
// its idle keys when it has grown to twice its size after the previous sweep, which costs O(1)
// amortised per new key. Each shard also has a hard cap (MemoryOptions.MaxKeys split across
// shards): when a sweep leaves a shard within 1/16 of its cap, arbitrary live keys are evicted
// down to 15/16 of it and counted in Evicted. Forgetting a live key resets that client's quota,
// so the cap can only make a limit more lenient, never stricter.
//
// The zero Memory is not usable; create one with NewMemory. A Memory is safe for concurrent use.
type Memory struct {
	shards  []paddedShard
	mask    uint64
	evicted atomic.Uint64
}

var _ Releaser = (*Memory)(nil)

// minSweep is the smallest size at which a shard sweeps, so that small shards are not swept on
// every insert.
const minSweep = 64

// rebuildPeak is the smallest peak size from which a shard's tables and map are rebuilt to return
// memory.
const rebuildPeak = 8 * minSweep

type shard struct {
	mu      sync.Mutex
	gcra    table[int64]          // token- and leaky-bucket tats
	fixed   table[FixedState]     // fixed-window states
	sliding table[compactSliding] // sliding-window keys whose state fits the compact form
	wide    map[Key]SlidingState  // the other sliding-window keys; a key is in one of the two at most
	conc    table[int64]          // concurrency keys: requests in flight + 1 (see concStored)
	maxKeys int                   // hard cap on this shard's keys
	sweepAt int                   // sweep before inserting a new key when the shard holds this many
	peak    int                   // most keys seen by a sweep since the tables were last rebuilt
	sweeps  uint64                // sweeps so far: a pending state evaluated before one may be stale
}

// paddedShard keeps neighbouring shards' mutexes off each other's cache lines (128 bytes: the
// adjacent-line prefetcher pairs 64-byte lines).
type paddedShard struct {
	shard
	_ [(128 - unsafe.Sizeof(shard{})%128) % 128]byte
}

// NewMemory returns an empty Memory store configured by o.
func NewMemory(o MemoryOptions) *Memory {
	n := o.Shards
	if n <= 0 {
		n = max(256, 8*runtime.GOMAXPROCS(0))
	}
	n = 1 << bits.Len(uint(n-1))
	maxKeys := o.MaxKeys
	if maxKeys <= 0 {
		maxKeys = 1_000_000
	}
	for n > 1 && maxKeys/n < 16 {
		n /= 2
	}
	// Floor division with the remainder handed out one by one: the caps sum to exactly maxKeys.
	perShard, extra := maxKeys/n, maxKeys%n
	m := &Memory{shards: make([]paddedShard, n), mask: uint64(n - 1)}
	for i := range m.shards {
		limit := perShard
		if i < extra {
			limit++
		}
		m.shards[i].shard = shard{
			gcra:    newTable[int64](rand.Uint64()),
			fixed:   newTable[FixedState](rand.Uint64()),
			sliding: newTable[compactSliding](rand.Uint64()),
			wide:    make(map[Key]SlidingState),
			conc:    newTable[int64](rand.Uint64()),
			maxKeys: limit,
			sweepAt: min(minSweep, limit),
		}
	}
	return m
}

// shardOf picks a key's shard from its first 8 bytes: keys are already uniform digests.
func (m *Memory) shardOf(k Key) uint32 {
	return uint32(binary.LittleEndian.Uint64(k[:8]) & m.mask)
}

// groupStack is the group size Take handles without allocating.
const groupStack = 8

// pending is one charge's evaluated state, committed only if the group is admitted.
type pending struct {
	existed bool   // the key was already stored, so committing it adds no key
	sweeps  uint64 // the shard's sweep count when existed was read
	tat     int64  // GCRA tat, or a concurrency key's requests in flight
	fixed   FixedState
	sliding SlidingState
}

// Take implements Store. It evaluates the group at now and commits it as the Store contract
// describes. Charges on the same key (and the same kind of state) within one group are taken one
// after the other, so two such charges spend two requests. When the group is not admitted, the
// results of conforming charges still describe them as if taken, although nothing was committed.
// It returns an error only for a canceled ctx, too few results or an unknown algorithm.
//
// A ctx whose deadline has passed is still decided: the decision costs well under a microsecond
// and does no I/O, and a deadline that passed while the goroutine waited for a CPU would
// otherwise turn an overloaded gateway into one that forwards without limits (on_error: allow).
func (m *Memory) Take(ctx context.Context, now time.Time, charges []Charge, results []Result) (bool, error) {
	if err := ctx.Err(); err != nil && errors.Is(err, context.Canceled) {
		return false, fmt.Errorf("bucket: memory take: %w", err)
	}
	if len(results) < len(charges) {
		return false, fmt.Errorf("bucket: memory take: %d results for %d charges", len(results), len(charges))
	}
	for i := range charges {
		if a := charges[i].Limit.Algorithm; a < TokenBucket || a > Quota {
			return false, fmt.Errorf("bucket: memory take: charge %d: unknown algorithm %d", i, a)
		}
	}
	if len(charges) == 1 {
		if charges[0].Limit.Algorithm == Concurrency {
			return m.takeSlot(&charges[0], now, &results[0]), nil
		}
		return m.takeOne(&charges[0], now.UnixNano(), &results[0]), nil
	}
	ns := now.UnixNano()

	var (
		shardBuf, lockBuf [groupStack]uint32
		pendBuf           [groupStack]pending
	)
	// idx[i] is charge i's shard; locks holds the distinct shards in ascending order.
	idx, locks, pend := shardBuf[:0], lockBuf[:0], pendBuf[:0]
	if len(charges) > groupStack {
		idx = make([]uint32, 0, len(charges))
		locks = make([]uint32, 0, len(charges))
		pend = make([]pending, 0, len(charges))
	}
	for i := range charges {
		s := m.shardOf(charges[i].Key)
		idx = append(idx, s)
		if j, found := slices.BinarySearch(locks, s); !found {
			locks = slices.Insert(locks, j, s)
		}
	}
	pend = pend[:len(charges)]

	for _, s := range locks {
		m.shards[s].mu.Lock()
	}
	admitted := true
	for i := range charges {
		c := &charges[i]
		var prev *pending
		for j := i - 1; j >= 0; j-- {
			if results[j].Allowed && charges[j].Key == c.Key && sameState(charges[j].Limit.Algorithm, c.Limit.Algorithm) {
				prev = &pend[j]
				break
			}
		}
		m.shards[idx[i]].eval(c, ns, &pend[i], prev, &results[i])
		admitted = admitted && (results[i].Allowed || c.Shadow)
	}
	var evicted uint64
	if admitted {
		for i := range charges {
			if results[i].Allowed {
				evicted += m.shards[idx[i]].commit(&charges[i], ns, &pend[i])
			}
		}
	}
	for _, s := range locks {
		m.shards[s].mu.Unlock()
	}
	if evicted > 0 {
		m.evicted.Add(evicted)
	}
	return admitted, nil
}

// takeOne is Take for a group of one charge, the common case, without the group bookkeeping.
// Each algorithm has its own branch so that no pending value (about 100 bytes, mostly the
// sliding window's counters) is zeroed and copied per decision: for a token bucket that copy
// was about a third of the decision's cost.
func (m *Memory) takeOne(c *Charge, now int64, r *Result) bool {
	sh := &m.shards[m.shardOf(c.Key)]
	var evicted uint64
	sh.mu.Lock()
	switch c.Limit.Algorithm {
	case TokenBucket, LeakyBucket:
		i, existed := sh.gcra.find(&c.Key)
		var tat int64
		if existed {
			tat = sh.gcra.slots[i].st
		}
		next := gcraTo(tat, now, c.Limit.Rate, c.Limit.Burst, c.Limit.Algorithm, c.N(), r)
		if r.Allowed {
			r.Token = gcraToken(next)
			evicted = storeAt(&sh.shard, &sh.gcra, i, existed, &c.Key, &next, now)
		}
	case FixedWindow, Quota:
		// A quota's state is a FixedState that ends at the next period start: it shares the
		// fixed windows' table (keys of different policies never collide).
		i, existed := sh.fixed.find(&c.Key)
		var st FixedState
		if existed {
			st = sh.fixed.slots[i].st
		}
		if c.Limit.Algorithm == Quota {
			st, *r = QuotaN(st, now, c.Limit, c.N())
		} else {
			st, *r = FixedN(st, now, c.Limit, c.N())
		}
		if r.Allowed {
			evicted = storeAt(&sh.shard, &sh.fixed, i, existed, &c.Key, &st, now)
		}
	default: // SlidingWindow; Take has checked the algorithm and sent Concurrency to takeSlot
		evicted = sh.takeSliding(c, now, r)
	}
	sh.mu.Unlock()
	if evicted > 0 {
		m.evicted.Add(evicted)
	}
	return r.Allowed || c.Shadow
}

// takeSlot is takeOne for a concurrency charge. A slot count needs no clock: now is converted
// only when a new key is stored (a sweep that makes room for it needs the instant), not on
// every request. With Release's releaseSlot this is the whole limiter cost of a request under
// a concurrency limit, so it is kept to one lookup and one write under the shard's lock.
func (m *Memory) takeSlot(c *Charge, now time.Time, r *Result) bool {
	sh := &m.shards[m.shardOf(c.Key)]
	var evicted uint64
	sh.mu.Lock()
	i, existed := sh.conc.find(&c.Key)
	n := int64(concStored)
	if existed {
		n = sh.conc.slots[i].st
	}
	if concurrentTo(n-concStored, c.Limit.Count, r) {
		n++
		if existed {
			sh.conc.slots[i].st = n
		} else {
			evicted = storeAt(&sh.shard, &sh.conc, i, false, &c.Key, &n, now.UnixNano())
		}
	}
	sh.mu.Unlock()
	if evicted > 0 {
		m.evicted.Add(evicted)
	}
	return r.Allowed || c.Shadow
}

// takeSliding is takeOne for a sliding window. The common case, a key in compact form (or a new
// key) under a Count that fits it, is decided in the compact table; the rest goes through a
// SlidingState. It returns the number of live keys evicted. The caller holds sh.mu.
//
// A stored key of the same width is decided where it lies. When now is in its newest slot (or
// before it, after a clock stepped back) the ring needs no moving, and decide writes it only to
// count a request it takes: nothing is copied out and back. Otherwise the ring is moved to
// now's slot on a copy, which replaces the stored state only if the request is taken (a ring
// moved for a rejected request would forget slots that a clock stepping back still counts);
// when every counted request has left, which is where a key of many clients (each seen now and
// then) usually is, the copy is a fresh ring and the old counters are not read at all.
func (sh *shard) takeSliding(c *Charge, now int64, r *Result) (evicted uint64) {
	if c.Limit.Count > maxCompactCount {
		return sh.takeWide(c, now, r)
	}
	w, count, n := slotWidth(c.Limit.Window), c.Limit.Count, c.N()
	i, existed := sh.sliding.find(&c.Key)
	if existed {
		if p := &sh.sliding.slots[i].st; p.width() == w {
			if now-p.slot*w < w {
				decide(&p.counts, p.slot, now, w, count, n, r)
				return 0
			}
			cur := floorDiv(now, w)
			if cur-p.slot >= slidingRing && n <= count {
				*p = admitFresh(cur, now, w, count, n, p.tag, r)
				return 0
			}
			st := compactSliding{slot: cur, tag: p.tag}
			if cur-p.slot < slidingRing {
				st = *p
				rotate(&st.counts, &st.slot, cur)
			}
			decide(&st.counts, st.slot, now, w, count, n, r)
			if r.Allowed {
				*p = st
			}
			return 0
		}
	}
	// A fresh state, as SlidingState.take starts one for a new key or another width; a key
	// kept wide must be read from there instead, and a width without a tag stays wide.
	tag, ok := widthTag(w)
	if !ok {
		return sh.takeWide(c, now, r)
	}
	if _, wide := sh.wide[c.Key]; !existed && wide {
		return sh.takeWide(c, now, r)
	}
	cur := floorDiv(now, w)
	if n > count {
		st := compactSliding{slot: cur, tag: tag}
		decide(&st.counts, st.slot, now, w, count, n, r) // a rejection: nothing to store
		return 0
	}
	st := admitFresh(cur, now, w, count, n, tag, r)
	return storeAt(sh, &sh.sliding, i, existed, &c.Key, &st, now)
}

// admitFresh is decide on an empty ring (every counter 0) at slot cur of width w, for a request
// that fits (n <= count): it returns the ring with n counted in slot cur and sets r, without
// summing eleven zeros.
func admitFresh(cur, now, w, count, n int64, tag uint16, r *Result) compactSliding {
	st := compactSliding{slot: cur, tag: tag}
	st.counts[ring(cur)] = uint16(n)
	*r = Result{Allowed: true, Limit: count, Remaining: count - n, Reset: time.Duration((cur+slidingRing)*w - now)}
	return st
}

// storeAt stores st (not the zero S) for k in t, a table of sh, where t.find(k) returned i and
// existed: in place when k is stored, otherwise after making room (a sweep moves the table's
// keys, so insertNew probes again). It returns the number of live keys evicted. The caller holds
// sh.mu.
func storeAt[S comparable](sh *shard, t *table[S], i int, existed bool, k *Key, st *S, now int64) (evicted uint64) {
	if existed {
		t.slots[i].st = *st
		return 0
	}
	evicted = sh.makeRoom(false, now)
	t.insertNew(k, st)
	return evicted
}

// takeWide decides a sliding-window charge through a SlidingState, whichever map holds the key,
// and stores the new state in the form it fits. The caller holds sh.mu.
func (sh *shard) takeWide(c *Charge, now int64, r *Result) (evicted uint64) {
	st, existed := sh.slidingState(c.Key)
	st.take(now, &c.Limit, c.N(), r)
	if r.Allowed {
		evicted = sh.makeRoom(existed, now)
		sh.storeSliding(c.Key, &st, c.Limit.Count)
	}
	return evicted
}

// slidingState returns the key's sliding-window state from whichever map holds it.
func (sh *shard) slidingState(k Key) (SlidingState, bool) {
	if i, ok := sh.sliding.find(&k); ok {
		return sh.sliding.slots[i].st.wide(), true
	}
	st, ok := sh.wide[k]
	return st, ok
}

// storeSliding stores a key's sliding-window state, taken under a Limit of this Count, compact
// when it fits and the Count lets it stay so, wide otherwise, and removes it from the other map.
func (sh *shard) storeSliding(k Key, st *SlidingState, count int64) {
	if count <= maxCompactCount {
		if cs, ok := compactOf(st); ok {
			sh.sliding.put(&k, &cs)
			delete(sh.wide, k)
			return
		}
	}
	sh.wide[k] = *st
	sh.sliding.remove(&k)
}

// sameState reports whether two algorithms keep their state in the same map.
func sameState(a, b Algorithm) bool {
	gcra := func(x Algorithm) bool { return x == TokenBucket || x == LeakyBucket }
	fixed := func(x Algorithm) bool { return x == FixedWindow || x == Quota }
	return a == b || gcra(a) && gcra(b) || fixed(a) && fixed(b)
}

// eval evaluates c at now against the stored state, or against prev (an earlier conforming
// charge of the same group on the same key) when it is not nil, and leaves the new state in p.
// The verdict is written into *r. The caller holds sh.mu.
func (sh *shard) eval(c *Charge, now int64, p *pending, prev *pending, r *Result) {
	p.sweeps = sh.sweeps
	// With prev, the stored state is stale (the group has not committed yet): prev's wins. The
	// lookup it replaces is wasted, but a group charging one key twice is rare.
	switch c.Limit.Algorithm {
	case TokenBucket, LeakyBucket:
		tat, ok := sh.gcra.get(&c.Key)
		if prev != nil {
			tat, ok = prev.tat, true
		}
		p.existed = ok
		p.tat = gcraTo(tat, now, c.Limit.Rate, c.Limit.Burst, c.Limit.Algorithm, c.N(), r)
		if r.Allowed {
			r.Token = gcraToken(p.tat)
		}
	case FixedWindow, Quota:
		s, ok := sh.fixed.get(&c.Key)
		if prev != nil {
			s, ok = prev.fixed, true
		}
		p.existed = ok
		if c.Limit.Algorithm == Quota {
			p.fixed, *r = QuotaN(s, now, c.Limit, c.N())
		} else {
			p.fixed, *r = FixedN(s, now, c.Limit, c.N())
		}
	case SlidingWindow:
		s, ok := sh.slidingState(c.Key)
		if prev != nil {
			s, ok = prev.sliding, true
		}
		p.existed = ok
		p.sliding = s
		p.sliding.take(now, &c.Limit, c.N(), r)
	case Concurrency:
		n, ok := sh.conc.get(&c.Key)
		n -= concStored * int64(b2i(ok))
		if prev != nil {
			n, ok = prev.tat, true
		}
		p.existed = ok
		p.tat, *r = Concurrent(n, c.Limit)
	}
}

// commit stores c's evaluated state p, making room first when c adds a key, and returns the
// number of live keys the shard's cap evicted. The caller holds sh.mu.
func (sh *shard) commit(c *Charge, now int64, p *pending) (evicted uint64) {
	// A sweep for an earlier charge of the group may have forgotten this (then idle, so
	// fresh-equivalent) key: storing p is still right, but it adds a key again, so it must make
	// room like any new key or the shard would end over its cap. Sweeps are rare, so the key is
	// looked up again only after one.
	existed := p.existed
	if existed && sh.sweeps != p.sweeps {
		existed = sh.has(c)
	}
	evicted = sh.makeRoom(existed, now)
	switch c.Limit.Algorithm {
	case TokenBucket, LeakyBucket:
		sh.gcra.put(&c.Key, &p.tat)
	case FixedWindow, Quota:
		sh.fixed.put(&c.Key, &p.fixed)
	case SlidingWindow:
		sh.storeSliding(c.Key, &p.sliding, c.Limit.Count)
	case Concurrency:
		st := p.tat + concStored
		sh.conc.put(&c.Key, &st)
	}
	return evicted
}

// makeRoom sweeps before a key is added (existed is false) to a shard that has reached its
// sweep size, and returns the number of live keys evicted. The caller holds sh.mu.
func (sh *shard) makeRoom(existed bool, now int64) (evicted uint64) {
	if !existed && sh.len() >= sh.sweepAt {
		evicted = sh.sweep(now)
	}
	return evicted
}

// has reports whether c's key is stored in the state kind of c's algorithm.
func (sh *shard) has(c *Charge) bool {
	var ok bool
	switch c.Limit.Algorithm {
	case TokenBucket, LeakyBucket:
		_, ok = sh.gcra.find(&c.Key)
	case FixedWindow, Quota:
		_, ok = sh.fixed.find(&c.Key)
	case SlidingWindow:
		if _, ok = sh.sliding.find(&c.Key); !ok {
			_, ok = sh.wide[c.Key]
		}
	case Concurrency:
		_, ok = sh.conc.find(&c.Key)
	}
	return ok
}

func (sh *shard) len() int { return sh.gcra.n + sh.fixed.n + sh.sliding.n + len(sh.wide) + sh.conc.n }

// sweep forgets the keys that are idle at now; if the shard is still within 1/16 of its cap it
// evicts arbitrary live keys down to 15/16 of the cap, and returns how many. Tables and maps do not
// shrink when keys are deleted, so after a sweep that leaves under an eighth of a large peak they
// are rebuilt. The caller holds sh.mu.
func (sh *shard) sweep(now int64) (evicted uint64) {
	sh.sweeps++
	before := sh.len()
	never := func() bool { return false }
	sh.gcra.deleteWhile(func(tat *int64) bool { return GCRAIdle(*tat, now) }, never)
	sh.fixed.deleteWhile(func(s *FixedState) bool { return s.Idle(now) }, never)
	sh.sliding.deleteWhile(func(s *compactSliding) bool { return s.idle(now) }, never)
	for k, s := range sh.wide {
		if s.Idle(now) {
			delete(sh.wide, k)
		}
	}
	sh.conc.deleteWhile(func(n *int64) bool { return *n <= concStored }, never)
	n := sh.len()
	// Evicting to a low-water mark rather than to just below the cap keeps a shard full of live
	// keys from sweeping on every insert.
	if low := sh.maxKeys - max(sh.maxKeys/16, 1); n > low {
		evicted = uint64(n - low)
		done := func() bool { return n <= low }
		sh.gcra.deleteWhile(func(*int64) bool { n--; return true }, done)
		sh.fixed.deleteWhile(func(*FixedState) bool { n--; return true }, done)
		sh.sliding.deleteWhile(func(*compactSliding) bool { n--; return true }, done)
		evict(sh.wide, &n, low)
		sh.conc.deleteWhile(func(*int64) bool { n--; return true }, done)
	}
	// Small shards are not rebuilt: with keys that go idle between visits (many clients, few
	// requests each) they would be rebuilt and regrown on every sweep, allocating on the hot path,
	// to return a few kilobytes.
	sh.peak = max(sh.peak, before)
	if sh.peak >= rebuildPeak && n < sh.peak/8 {
		sh.gcra.shrink()
		sh.fixed.shrink()
		sh.sliding.shrink()
		sh.conc.shrink()
		sh.wide = rebuilt(sh.wide)
		sh.peak = n
	}
	sh.sweepAt = min(max(2*n, minSweep), sh.maxKeys)
	return evicted
}

// evict deletes entries of m in map iteration order (arbitrary) until *n <= low.
func evict[V any](m map[Key]V, n *int, low int) {
	for k := range m {
		if *n <= low {
			return
		}
		delete(m, k)
		*n--
	}
}

// rebuilt returns a copy of m sized for its current length.
func rebuilt[V any](m map[Key]V) map[Key]V {
	c := make(map[Key]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Len returns the number of keys tracked, for metrics.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.len()
		sh.mu.Unlock()
	}
	return n
}

// Evicted returns the number of live keys evicted by the MaxKeys cap since creation, for
// metrics. Idle keys forgotten by sweeps are not counted: forgetting them changes nothing.
func (m *Memory) Evicted() uint64 { return m.evicted.Load() }

// Release implements Releaser: each charge is given back under its shard's lock (see
// Store.Release for what is given back). A key that is no longer stored (idle and swept, or
// evicted) has nothing to give back. It never fails, and ignores ctx: a slot must come back
// even when the request's context has ended, and the work is a few lock-protected writes.
func (m *Memory) Release(_ context.Context, now time.Time, taken []Taken) error {
	for i := range taken {
		tk := &taken[i]
		sh := &m.shards[m.shardOf(tk.Charge.Key)]
		sh.mu.Lock()
		// A concurrency slot, the release of every request under a concurrency limit, is
		// given back here; refunds (charge_on, rarer and heavier) go through release.
		if tk.Charge.Limit.Algorithm == Concurrency {
			sh.releaseSlot(&tk.Charge.Key)
		} else {
			sh.release(tk, now.UnixNano())
		}
		sh.mu.Unlock()
	}
	return nil
}

// releaseSlot frees one concurrency slot of k. The caller holds sh.mu.
func (sh *shard) releaseSlot(k *Key) {
	if i, ok := sh.conc.find(k); ok {
		// A key with nothing in flight stays until the next sweep (it is idle then): a busy
		// key is not deleted and inserted again on every request.
		sh.conc.slots[i].st = ConcurrentRelease(sh.conc.slots[i].st-concStored) + concStored
	}
}

// release refunds one charge of an algorithm other than Concurrency. The caller holds sh.mu.
func (sh *shard) release(tk *Taken, now int64) {
	c := &tk.Charge
	switch c.Limit.Algorithm {
	case TokenBucket:
		if i, ok := sh.gcra.find(&c.Key); ok {
			sh.gcra.slots[i].st, _ = GCRARefundN(sh.gcra.slots[i].st, int64(tk.Token), c.Limit, c.N())
		}
	case FixedWindow:
		if i, ok := sh.fixed.find(&c.Key); ok {
			sh.fixed.slots[i].st, _ = FixedRefundN(sh.fixed.slots[i].st, tk.At.UnixNano(), c.Limit, c.N())
		}
	case Quota:
		if i, ok := sh.fixed.find(&c.Key); ok {
			sh.fixed.slots[i].st, _ = QuotaRefundN(sh.fixed.slots[i].st, tk.At.UnixNano(), c.Limit, c.N())
		}
	case SlidingWindow:
		st, ok := sh.slidingState(c.Key)
		if ok && st.refund(tk.At.UnixNano(), &c.Limit, c.N()) {
			sh.storeSliding(c.Key, &st, c.Limit.Count)
		}
	}
}

// gcraToken is the Result.Token of an admitted GCRA charge: the tat its write left, which
// GCRARefundN compares with the state to tell whether anything wrote since. A tat is positive for
// instants after 1970 and below 2^63 (see maxSpan), so the top bit stays clear for the fallback
// store's mark; an earlier instant's tat gives 0, "unknown", and its give-back gives nothing.
func gcraToken(tat int64) uint64 { return uint64(max(tat, 0)) }

// concStored is added to a concurrency key's in-flight count in its table: the table marks an
// empty slot with the zero state, and a key with nothing in flight stays stored (until a
// sweep finds it idle) so that a busy key is not deleted and inserted again per request.
const concStored = 1

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
