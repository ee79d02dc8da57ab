package memstore

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Options configures New. The zero value selects every default.
type Options struct {
	// Shards is the number of independently locked shards, rounded up to a power of two.
	// (Optional) default 8*GOMAXPROCS rounded up, at least 256.
	Shards int
	// MaxKeys caps the tracked keys, all algorithms together: never more are kept. The cap is
	// split across shards (fewer shards when MaxKeys is small, so each holds at least 16), so
	// with unevenly spread keys evictions can begin a few percent below MaxKeys. Each shard's
	// cap is split evenly between the pools (Charge.Pool). A shard or pool at its cap evicts
	// idle keys, then the least used, never a key at its limit: when only such keys are left,
	// new keys are judged in a count-min sketch of 8*MaxKeys cells per kind of limit (see
	// Store and sketch.go). (Optional) default 1_000_000.
	MaxKeys int
}

// Store is the in-process bucket.Store: keyed algorithm state in sharded hash tables, each shard under
// its own mutex. Decisions are exact under concurrency: a group's shards are locked (in ascending
// order, so concurrent groups cannot deadlock) for the whole evaluate-and-commit.
//
// State is small: a token- or leaky-bucket key is its tat, a fixed-window key a FixedState, each
// beside the room its Limit leaves (what eviction needs to tell a key at its limit), in an
// open-addressing table of its own (see table: one cache miss per lookup where a map takes two).
// A sliding-window key is kept in a compact form (16-bit counters, 56 bytes with the key in a
// table of its own) when its counters and slot width fit, and as a
// SlidingState in a map otherwise (Count above 65535, a counter above 65535 left from
// such a Count, or a width without a 16-bit tag); a key moves between the two with its counts
// intact.
//
// A Store stays bounded without a background goroutine. A key is idle when its state equals a
// fresh key's (the bucket is full, every counted request has left its window, nothing in
// flight); a shard forgets its idle keys when it has grown to twice its size after the previous
// sweep, which costs O(1) amortised per new key. Each shard also has a hard cap (MaxKeys split
// across shards): when a sweep leaves a shard within 1/16 of its cap, it evicts live keys down
// to 15/16 of it, the least used first (the smallest share of their limit in use), and never a
// key at its limit (one whose next request of the cost it was last charged would be rejected).
// Each shard's cap is split between the pools the store knows (a policy, an RLS domain: see
// pool.go), and a pool holds at most its share: when every key a new key could displace
// is at its limit, the new key is judged in the store's count-min sketch (sketch.go),
// which may refuse it early but never admits it past its own limit. So a flood of distinct
// keys, however many and however chosen, never resets a key at its limit, never refuses a new
// key of another pool, leaves most new keys of its own pool their own limits, and the store
// never holds more than MaxKeys entries (plus the sketch's fixed size). See docs/operations.md
// ("Memory store") for the trade-off.
//
// A key's shard is chosen by a hash keyed with a secret drawn per store (crypto/rand), so that
// no client can choose key values that land in one shard.
//
// The zero Store is not usable; create one with New. A Store is safe for concurrent use.
type Store struct {
	shards []paddedShard
	mask   uint64
	seed   [4]uint64 // keys the shard choice (see shardOf) and the GCRA tokens (gcraToken)
	pools  pools     // pool names to indexes (see pool.go)
	sk     sketch    // where new keys the shards cannot store are judged (sketch.go)
}

var _ bucket.Releaser = (*Store)(nil)

// minSweep is the smallest size at which a shard sweeps, so that small shards are not swept on
// every insert.
const minSweep = 64

// rebuildPeak is the smallest peak size from which a shard's tables and map are rebuilt to return
// memory.
const rebuildPeak = 8 * minSweep

type shard struct {
	mu      sync.Mutex
	gcra    table[gcraEntry]         // token- and leaky-bucket states
	fixed   table[fixedEntry]        // fixed-window and quota states
	sliding table[compactSliding]    // sliding-window keys whose state fits the compact form
	wide    map[bucket.Key]wideEntry // the other sliding-window keys; a key is in one of the two at most
	conc    table[concEntry]         // concurrency keys
	maxKeys int                      // hard cap on this shard's keys
	sweepAt int                      // sweep before inserting a new key when the shard holds this many
	peak    int                      // most keys seen by a sweep since the tables were last rebuilt
	// fullUntil is, after a sweep that left the shard full of keys at their limit, the first
	// instant one of them may be evicted (math.MaxInt64: only a slot's release frees one): new
	// keys are judged in the sketch until then without sweeping again. 0 when the shard is not
	// full.
	fullUntil int64
	stats     evictions // counted under mu, summed by Store.Evictions
	gen       uint64    // the last generation handed to a new entry (see admit)
	pools     []int32   // keys held per pool index
	// poolFull is, for a pool at its share of the shard after a sweep found nothing of it to
	// evict, the first instant one of its keys may go: its new keys go to the sketch until then.
	poolFull map[uint16]int64
}

// gcraEntry is a token- or leaky-bucket key's state: its tat, and the room the Limit leaves a
// request of the cost it was last charged (tau-cost*T: the key is at its limit while tat-now
// exceeds it). Every entry also carries its meta: its generation (unique in its shard, so that
// a give-back never lands in an entry created again after the one it was counted in was
// evicted) and its pool (see pool.go).
type gcraEntry struct {
	tat, room int64
	meta      uint64
}

// fixedEntry is a fixed-window or quota key's state, and the room its Limit leaves (Count-cost:
// the key is at its limit while its count exceeds it).
type fixedEntry struct {
	bucket.FixedState
	room int64
	meta uint64
}

// wideEntry is a sliding-window key's state kept as a SlidingState, and the room (Count-cost).
type wideEntry struct {
	bucket.SlidingState
	room int64
	meta uint64
}

// concEntry is a concurrency key's state: requests in flight + concStored, and its Count.
type concEntry struct {
	n, count int64
	meta     uint64
}

// paddedShard keeps neighbouring shards' mutexes off each other's cache lines (128 bytes: the
// adjacent-line prefetcher pairs 64-byte lines).
type paddedShard struct {
	shard
	_ [(128 - unsafe.Sizeof(shard{})%128) % 128]byte
}

// New returns an empty memory store configured by o.
func New(o Options) *Store {
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
	m := &Store{shards: make([]paddedShard, n), mask: uint64(n - 1)}
	m.pools.idx = make(map[string]uint16)
	m.sk.init(maxKeys)
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand: it crashes the program instead)
	for i := range m.seed {
		m.seed[i] = binary.LittleEndian.Uint64(seed[8*i:])
	}
	m.seed[3] |= 1
	for i := range m.shards {
		limit := perShard
		if i < extra {
			limit++
		}
		m.shards[i].shard = shard{
			gcra:    newTable[gcraEntry](rand.Uint64()),
			fixed:   newTable[fixedEntry](rand.Uint64()),
			sliding: newTable[compactSliding](rand.Uint64()),
			wide:    make(map[bucket.Key]wideEntry),
			conc:    newTable[concEntry](rand.Uint64()),
			maxKeys: limit,
			sweepAt: min(minSweep, limit),
		}
	}
	return m
}

// shardOf picks a key's shard with a hash keyed by the store's secret seed, drawn from
// crypto/rand by New. Keys are digests of the policy and the client's value, but the
// policy's name is public (429 bodies, RateLimit-Policy) and so is the digest: picking the shard
// from the key's own bits let a client craft values that all land in a victim's shard (256
// tries per key) and fill it. The hash is two rounds of a 64x64->128-bit multiply folded by xor
// (the mixing of wyhash and of Go's own map hash when it lacks AES), each with secret words, so
// where a value lands cannot be predicted without the seed; it costs two multiplications, where
// hash/maphash cost several times more per decision.
func (m *Store) shardOf(k bucket.Key) uint32 {
	hi, lo := bits.Mul64(binary.LittleEndian.Uint64(k[:8])^m.seed[0], binary.LittleEndian.Uint64(k[8:])^m.seed[1])
	hi, lo = bits.Mul64(hi^lo^m.seed[2], m.seed[3])
	return uint32((hi ^ lo) & m.mask)
}

// groupStack is the group size Take handles without allocating.
const groupStack = 8

// pending is one charge's evaluated state, committed only if the group is admitted.
type pending struct {
	tat     int64 // GCRA tat, or a concurrency key's requests in flight
	room    int64 // the entry's room (see gcraEntry, fixedEntry, wideEntry; a concurrency Count)
	fixed   bucket.FixedState
	sliding bucket.SlidingState
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
func (m *Store) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	if err := ctx.Err(); err != nil && errors.Is(err, context.Canceled) {
		return false, fmt.Errorf("memstore: take: %w", err)
	}
	if len(results) < len(charges) {
		return false, fmt.Errorf("memstore: take: %d results for %d charges", len(results), len(charges))
	}
	for i := range charges {
		if a := charges[i].Limit.Algorithm; a < bucket.TokenBucket || a > bucket.Quota {
			return false, fmt.Errorf("memstore: take: charge %d: unknown algorithm %d", i, a)
		}
	}
	if len(charges) == 1 {
		if charges[0].Limit.Algorithm == bucket.Concurrency {
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
	// Room first: each shard makes room for the keys the group adds before anything is
	// evaluated, so that no sweep runs between a charge's evaluation and its commit.
	for _, s := range locks {
		sh := &m.shards[s]
		// The common case: even if every charge on this shard added a key, it would stay below
		// its sweep size (never above its cap): no need to look the keys up twice.
		if sh.len()+len(charges) <= sh.sweepAt {
			continue
		}
		need := sh.newKeys(charges, idx, s)
		if need > 0 && sh.len()+need > sh.sweepAt && (sh.len()+need <= sh.maxKeys || ns >= sh.fullUntil) {
			// A sweep may forget or evict keys of the group itself, which it then adds again:
			// count again, and make more room if that is why there is too little.
			for range 3 {
				sh.sweep(ns, need, share(sh.maxKeys, m.Pools()))
				again := sh.newKeys(charges, idx, s)
				if again == need || sh.len()+again <= sh.maxKeys {
					break
				}
				need = again
			}
		}
	}
	var (
		howBuf   [groupStack]uint8
		ownerBuf [groupStack]int
		resvBuf  [groupStack]uint64
		usedBuf  [groupStack]bool
		addedBuf [groupStack]int
	)
	g := placement{how: howBuf[:0], owner: ownerBuf[:0], resv: resvBuf[:0], used: usedBuf[:0], added: addedBuf[:0]}
	if len(charges) > groupStack || len(locks) > groupStack {
		g = placement{how: make([]uint8, 0, len(charges)), owner: make([]int, 0, len(charges)),
			resv: make([]uint64, 0, len(charges)), used: make([]bool, 0, len(charges)), added: make([]int, 0, len(locks))}
	}
	g.how, g.owner, g.resv, g.used, g.added = g.how[:len(charges)], g.owner[:len(charges)], g.resv[:len(charges)], g.used[:len(charges)], g.added[:len(locks)]
	m.placeGroup(&g, charges, idx, locks, ns)
	admitted := true
	for i := range charges {
		c := &charges[i]
		var prev *pending
		for j := i - 1; j >= 0; j-- {
			if results[j].Allowed && g.how[j] == g.how[i] && charges[j].Key == c.Key && sameState(charges[j].Limit.Algorithm, c.Limit.Algorithm) {
				prev = &pend[j]
				break
			}
		}
		if g.how[i] == placeSketch {
			m.judgeSketch(c, ns, &pend[i], prev, &results[i])
		} else {
			m.shards[idx[i]].eval(c, ns, &pend[i], prev, &results[i])
		}
		admitted = admitted && (results[i].Allowed || c.Shadow)
	}
	if admitted {
		for i := range charges {
			c, r := &charges[i], &results[i]
			if !r.Allowed {
				continue
			}
			if g.how[i] == placeSketch {
				m.commitSketch(c, ns, &pend[i], r)
				continue
			}
			var meta uint64
			if o := g.owner[i]; o >= 0 && !g.used[o] {
				meta, g.used[o] = g.resv[o], true
			}
			meta = m.shards[idx[i]].commit(c, &pend[i], meta)
			r.Token = genToken(meta)
			if c.Limit.Algorithm == bucket.TokenBucket || c.Limit.Algorithm == bucket.LeakyBucket {
				r.Token = m.gcraToken(meta, pend[i].tat)
			}
		}
	}
	// Keys placed for the group and never stored give their place back.
	for i := range charges {
		if g.owner[i] == i && !g.used[i] {
			m.shards[idx[i]].forget(g.resv[i])
		}
	}
	if g.sketch {
		m.sk.mu.Unlock()
	}
	for _, s := range locks {
		m.shards[s].mu.Unlock()
	}
	return admitted, nil
}

// How a group's charge is placed: on its key's entry, stored or new (placeStore), or in the
// sketch (placeSketch).
const (
	placeStore = iota
	placeSketch
)

// placement is where each charge of a group goes (see placeGroup).
type placement struct {
	how    []uint8
	owner  []int    // for a new key: the first charge of the group on it (-1: the key is stored)
	resv   []uint64 // for a charge that owns a new key: the meta reserved for it
	used   []bool   // whether the owner's reserved meta was stored
	added  []int    // new keys placed per shard of locks
	sketch bool     // m.sk.mu is held
}

// placeGroup decides into g (its slices as long as the group, added as locks), before anything
// is evaluated, where each charge of a group goes: a new
// key takes a place in its shard when the shard is below its cap and the key's pool below its
// share (after a sweep of the pool's idle and least used keys: see poolRoom), counted at once so
// that the group's other new keys see it, unless the sketch still counts it; otherwise it is
// judged in the sketch. Every sweep runs before any key is looked up, so the placements stay
// true until the commit. The caller holds the shards' locks; placeGroup leaves m.sk.mu held
// when it reports sketch.
func (m *Store) placeGroup(g *placement, charges []bucket.Charge, idx []uint32, locks []uint32, ns int64) {
	// The pools' sweeps first.
	pools := m.Pools()
	for i := range charges {
		c, sh := &charges[i], &m.shards[idx[i]]
		if !sh.has(c) {
			p := m.poolIndex(c.Pool)
			pools = m.Pools()
			if sh.poolKeys(p) >= share(sh.maxKeys, pools) {
				sh.poolRoom(ns, p, pools)
			}
		}
	}
	for i := range charges {
		c, sh := &charges[i], &m.shards[idx[i]]
		g.owner[i] = -1
		if sh.has(c) {
			continue
		}
		for j := range i {
			if g.owner[j] >= 0 && idx[j] == idx[i] && charges[j].Key == c.Key && sameState(charges[j].Limit.Algorithm, c.Limit.Algorithm) {
				g.owner[i], g.how[i] = g.owner[j], g.how[j]
				break
			}
		}
		if g.owner[i] >= 0 {
			continue
		}
		g.how[i] = placeSketch
		if m.sk.active(kindOf(c.Limit.Algorithm), ns) {
			if !g.sketch {
				m.sk.mu.Lock()
				g.sketch = true
			}
			if m.inSketch(c, ns) {
				continue
			}
		}
		li, _ := slices.BinarySearch(locks, idx[i])
		p := m.poolIndex(c.Pool)
		if sh.len()+g.added[li] < sh.maxKeys && sh.poolKeys(p) < share(sh.maxKeys, pools) {
			g.how[i], g.owner[i], g.resv[i] = placeStore, i, sh.admit(p)
			g.added[li]++
			continue
		}
		if !g.sketch {
			m.sk.mu.Lock()
			g.sketch = true
		}
	}
}

// newKeys counts the entries that the charges on shard s (idx[i] is charge i's shard) would add
// to it: charges whose key is not stored in their algorithm's kind of state, each key and kind
// once. The caller holds sh.mu.
func (sh *shard) newKeys(charges []bucket.Charge, idx []uint32, s uint32) int {
	n := 0
	for i := range charges {
		if idx[i] != s || sh.has(&charges[i]) {
			continue
		}
		dup := false
		for j := range i {
			if idx[j] == s && charges[j].Key == charges[i].Key && sameState(charges[j].Limit.Algorithm, charges[i].Limit.Algorithm) {
				dup = true
				break
			}
		}
		if !dup {
			n++
		}
	}
	return n
}

// takeOne is Take for a group of one charge, the common case, without the group bookkeeping.
// Each algorithm has its own branch so that no pending value (about 100 bytes, mostly the
// sliding window's counters) is zeroed and copied per decision: for a token bucket that copy
// was about a third of the decision's cost.
func (m *Store) takeOne(c *bucket.Charge, now int64, r *bucket.Result) bool {
	sh := &m.shards[m.shardOf(c.Key)]
	sh.mu.Lock()
	switch c.Limit.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		i, existed := sh.gcra.find(&c.Key)
		var e gcraEntry
		if existed {
			e = sh.gcra.slots[i].st
		}
		e.tat, e.room = bucket.GCRAInto(e.tat, now, c.Limit.Rate, c.Limit.Burst, c.Limit.Algorithm, c.N(), r)
		if r.Allowed {
			stored := true
			if existed {
				sh.gcra.slots[i].st = e
			} else if e.meta, stored = m.admitNew(&sh.shard, c, now, r); stored {
				sh.gcra.insertNew(&c.Key, &e)
			}
			if stored {
				r.Token = m.gcraToken(e.meta, e.tat)
			}
		}
	case bucket.FixedWindow, bucket.Quota:
		// A quota's state is a FixedState that ends at the next period start: it shares the
		// fixed windows' table (keys of different policies never collide).
		i, existed := sh.fixed.find(&c.Key)
		var e fixedEntry
		if existed {
			e = sh.fixed.slots[i].st
		}
		if c.Limit.Algorithm == bucket.Quota {
			e.FixedState, *r = bucket.QuotaN(e.FixedState, now, c.Limit, c.N())
		} else {
			e.FixedState, *r = bucket.FixedN(e.FixedState, now, c.Limit, c.N())
		}
		if r.Allowed {
			e.room = c.Limit.Count - c.N()
			stored := true
			if existed {
				sh.fixed.slots[i].st = e
			} else if e.meta, stored = m.admitNew(&sh.shard, c, now, r); stored {
				sh.fixed.insertNew(&c.Key, &e)
			}
			if stored {
				r.Token = genToken(e.meta)
			}
		}
	default: // SlidingWindow; Take has checked the algorithm and sent Concurrency to takeSlot
		m.takeSliding(&sh.shard, c, now, r)
	}
	sh.mu.Unlock()
	return r.Allowed || c.Shadow
}

// takeSlot is takeOne for a concurrency charge. A slot count needs no clock: now is converted
// only when a new key is stored (a sweep that makes room for it needs the instant), not on
// every request. With Release's releaseSlot this is the whole limiter cost of a request under
// a concurrency limit, so it is kept to one lookup and one write under the shard's lock.
func (m *Store) takeSlot(c *bucket.Charge, now time.Time, r *bucket.Result) bool {
	sh := &m.shards[m.shardOf(c.Key)]
	sh.mu.Lock()
	i, existed := sh.conc.find(&c.Key)
	e := concEntry{n: concStored, count: c.Limit.Count}
	if existed {
		e.n, e.meta = sh.conc.slots[i].st.n, sh.conc.slots[i].st.meta
	}
	if bucket.ConcurrentInto(e.n-concStored, c.Limit.Count, r) {
		e.n++
		if existed {
			sh.conc.slots[i].st = e
			r.Token = genToken(e.meta)
		} else if meta, ok := m.admitNew(&sh.shard, c, now.UnixNano(), r); ok {
			e.meta = meta
			sh.conc.insertNew(&c.Key, &e)
			r.Token = genToken(meta)
		}
	}
	sh.mu.Unlock()
	return r.Allowed || c.Shadow
}

// takeSliding is takeOne for a sliding window. The common case, a key in compact form (or a new
// key) under a Count that fits it, is decided in the compact table; the rest goes through a
// SlidingState. The caller holds sh.mu.
//
// A stored key of the same width is decided where it lies. When now is in its newest slot (or
// before it, after a clock stepped back) the ring needs no moving, and decide writes it only to
// count a request it takes: nothing is copied out and back. Otherwise the ring is moved to
// now's slot on a copy, which replaces the stored state only if the request is taken (a ring
// moved for a rejected request would forget slots that a clock stepping back still counts);
// when every counted request has left, which is where a key of many clients (each seen now and
// then) usually is, the copy is a fresh ring and the old counters are not read at all.
func (m *Store) takeSliding(sh *shard, c *bucket.Charge, now int64, r *bucket.Result) {
	if c.Limit.Count > maxCompactCount {
		m.takeWide(sh, c, now, r)
		return
	}
	w, count, n := bucket.SlotWidth(c.Limit.Window), c.Limit.Count, c.N()
	room := uint16(max(count-n, 0)) // count <= 65535 here
	i, existed := sh.sliding.find(&c.Key)
	if existed {
		if p := &sh.sliding.slots[i].st; p.width() == w {
			p.room = room
			if now-p.slot*w < w {
				bucket.SlidingDecide(&p.counts, p.slot, now, w, count, n, r)
				if r.Allowed {
					r.Token = genToken(p.meta())
				}
				return
			}
			cur := bucket.FloorDiv(now, w)
			if cur-p.slot >= bucket.SlidingRing && n <= count {
				meta := p.meta()
				*p = admitFresh(cur, now, w, count, n, p.tag, r)
				p.room = room
				p.setMeta(meta)
				r.Token = genToken(meta)
				return
			}
			st := compactSliding{slot: cur, tag: p.tag, room: room, gen: p.gen, pool: p.pool}
			if cur-p.slot < bucket.SlidingRing {
				st = *p
				bucket.SlidingRotate(&st.counts, &st.slot, cur)
			}
			bucket.SlidingDecide(&st.counts, st.slot, now, w, count, n, r)
			if r.Allowed {
				*p = st
				r.Token = genToken(st.meta())
			}
			return
		}
	}
	// A fresh state, as SlidingState.take starts one for a new key or another width; a key
	// kept wide must be read from there instead, and a width without a tag stays wide.
	tag, ok := widthTag(w)
	if !ok {
		m.takeWide(sh, c, now, r)
		return
	}
	if _, wide := sh.wide[c.Key]; !existed && wide {
		m.takeWide(sh, c, now, r)
		return
	}
	cur := bucket.FloorDiv(now, w)
	if n > count {
		st := compactSliding{slot: cur, tag: tag}
		bucket.SlidingDecide(&st.counts, st.slot, now, w, count, n, r) // a rejection: nothing to store
		return
	}
	st := admitFresh(cur, now, w, count, n, tag, r)
	st.room = room
	if existed {
		st.setMeta(sh.sliding.slots[i].st.meta())
		sh.sliding.slots[i].st = st
	} else if meta, ok := m.admitNew(sh, c, now, r); ok {
		st.setMeta(meta)
		sh.sliding.insertNew(&c.Key, &st)
	} else {
		return
	}
	r.Token = genToken(st.meta())
}

// admitFresh is decide on an empty ring (every counter 0) at slot cur of width w, for a request
// that fits (n <= count): it returns the ring with n counted in slot cur and sets r, without
// summing eleven zeros.
func admitFresh(cur, now, w, count, n int64, tag uint16, r *bucket.Result) compactSliding {
	st := compactSliding{slot: cur, tag: tag}
	st.counts[bucket.SlidingIndex(cur)] = uint16(n)
	*r = bucket.Result{Allowed: true, Limit: count, Remaining: count - n, Reset: time.Duration((cur+bucket.SlidingRing)*w - now)}
	return st
}

// admitNew makes room for c's new key in sh and returns the new entry's meta, counted in c's
// pool: after making room (the pool's share first: a pool at its share makes room from its own
// keys, so that the shard's sweep does not take it from another pool's). When the sketch still
// counts c's key, or the pool's share or the shard has no room (every key that could go is at
// its limit), c is judged in the sketch instead, r becomes that verdict, and admitNew reports
// false. A sweep moves a table's keys: the caller inserts with insertNew, which probes again.
// The caller holds sh.mu.
func (m *Store) admitNew(sh *shard, c *bucket.Charge, now int64, r *bucket.Result) (uint64, bool) {
	if m.sk.active(kindOf(c.Limit.Algorithm), now) {
		m.sk.mu.Lock()
		in := m.inSketch(c, now)
		m.sk.mu.Unlock()
		if in {
			m.takeSketch(c, now, r)
			return 0, false
		}
	}
	p := m.poolIndex(c.Pool)
	if n := m.Pools(); !sh.poolRoom(now, p, n) || !sh.makeRoom(now, share(sh.maxKeys, n)) {
		m.takeSketch(c, now, r)
		return 0, false
	}
	return sh.admit(p), true
}

// takeWide decides a sliding-window charge through a SlidingState, whichever map holds the key,
// and stores the new state in the form it fits. The caller holds sh.mu.
func (m *Store) takeWide(sh *shard, c *bucket.Charge, now int64, r *bucket.Result) {
	st, meta, existed := sh.slidingState(c.Key)
	st.TakeInto(now, &c.Limit, c.N(), r)
	if !r.Allowed {
		return
	}
	if !existed {
		var ok bool
		if meta, ok = m.admitNew(sh, c, now, r); !ok {
			return
		}
	}
	sh.storeSliding(c.Key, &st, c.Limit.Count, c.Limit.Count-c.N(), meta)
	r.Token = genToken(meta)
}

// slidingState returns the key's sliding-window state and meta from whichever map holds it.
func (sh *shard) slidingState(k bucket.Key) (bucket.SlidingState, uint64, bool) {
	if i, ok := sh.sliding.find(&k); ok {
		return sh.sliding.slots[i].st.wide(), sh.sliding.slots[i].st.meta(), true
	}
	e, ok := sh.wide[k]
	return e.SlidingState, e.meta, ok
}

// storeSliding stores a key's sliding-window state and meta, taken under a Limit of this Count
// with this room (Count-cost), compact when it fits and the Count lets it stay so, wide
// otherwise, and removes it from the other map (a move keeps the key's meta: it is the same
// entry).
func (sh *shard) storeSliding(k bucket.Key, st *bucket.SlidingState, count, room int64, meta uint64) {
	if count <= maxCompactCount {
		if cs, ok := compactOf(st); ok {
			cs.room = uint16(max(room, 0))
			cs.setMeta(meta)
			sh.sliding.put(&k, &cs)
			delete(sh.wide, k)
			return
		}
	}
	sh.wide[k] = wideEntry{SlidingState: *st, room: room, meta: meta}
	sh.sliding.remove(&k)
}

// sameState reports whether two algorithms keep their state in the same map.
func sameState(a, b bucket.Algorithm) bool {
	gcra := func(x bucket.Algorithm) bool { return x == bucket.TokenBucket || x == bucket.LeakyBucket }
	fixed := func(x bucket.Algorithm) bool { return x == bucket.FixedWindow || x == bucket.Quota }
	return a == b || gcra(a) && gcra(b) || fixed(a) && fixed(b)
}

// eval evaluates c at now against the stored state, or against prev (an earlier conforming
// charge of the same group on the same key) when it is not nil, and leaves the new state in p.
// The verdict is written into *r. The caller holds sh.mu.
func (sh *shard) eval(c *bucket.Charge, now int64, p *pending, prev *pending, r *bucket.Result) {
	// With prev, the stored state is stale (the group has not committed yet): prev's wins. The
	// lookup it replaces is wasted, but a group charging one key twice is rare.
	switch c.Limit.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		e, _ := sh.gcra.get(&c.Key)
		if prev != nil {
			e.tat = prev.tat
		}
		p.tat, p.room = bucket.GCRAInto(e.tat, now, c.Limit.Rate, c.Limit.Burst, c.Limit.Algorithm, c.N(), r)
	case bucket.FixedWindow, bucket.Quota:
		e, _ := sh.fixed.get(&c.Key)
		s := e.FixedState
		if prev != nil {
			s = prev.fixed
		}
		if c.Limit.Algorithm == bucket.Quota {
			p.fixed, *r = bucket.QuotaN(s, now, c.Limit, c.N())
		} else {
			p.fixed, *r = bucket.FixedN(s, now, c.Limit, c.N())
		}
		p.room = c.Limit.Count - c.N()
	case bucket.SlidingWindow:
		s, _, _ := sh.slidingState(c.Key)
		if prev != nil {
			s = prev.sliding
		}
		p.sliding = s
		p.sliding.TakeInto(now, &c.Limit, c.N(), r)
		p.room = c.Limit.Count - c.N()
	case bucket.Concurrency:
		e, ok := sh.conc.get(&c.Key)
		n := e.n - concStored*int64(b2i(ok))
		if prev != nil {
			n = prev.tat
		}
		p.tat, *r = bucket.Concurrent(n, c.Limit)
		p.room = c.Limit.Count
	}
}

// commit stores c's evaluated state p and returns the entry's meta: a stored key keeps its
// own, a new key gets meta (placed and counted by placeGroup). The caller holds sh.mu.
func (sh *shard) commit(c *bucket.Charge, p *pending, meta uint64) uint64 {
	switch c.Limit.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		if i, ok := sh.gcra.find(&c.Key); ok {
			meta = sh.gcra.slots[i].st.meta
		}
		sh.gcra.put(&c.Key, &gcraEntry{tat: p.tat, room: p.room, meta: meta})
	case bucket.FixedWindow, bucket.Quota:
		if i, ok := sh.fixed.find(&c.Key); ok {
			meta = sh.fixed.slots[i].st.meta
		}
		sh.fixed.put(&c.Key, &fixedEntry{FixedState: p.fixed, room: p.room, meta: meta})
	case bucket.SlidingWindow:
		if _, old, ok := sh.slidingState(c.Key); ok {
			meta = old
		}
		sh.storeSliding(c.Key, &p.sliding, c.Limit.Count, p.room, meta)
	case bucket.Concurrency:
		if i, ok := sh.conc.find(&c.Key); ok {
			meta = sh.conc.slots[i].st.meta
		}
		sh.conc.put(&c.Key, &concEntry{n: p.tat + concStored, count: p.room, meta: meta})
	}
	return meta
}

// has reports whether c's key is stored in the state kind of c's algorithm.
func (sh *shard) has(c *bucket.Charge) bool {
	var ok bool
	switch c.Limit.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		_, ok = sh.gcra.find(&c.Key)
	case bucket.FixedWindow, bucket.Quota:
		_, ok = sh.fixed.find(&c.Key)
	case bucket.SlidingWindow:
		if _, ok = sh.sliding.find(&c.Key); !ok {
			_, ok = sh.wide[c.Key]
		}
	case bucket.Concurrency:
		_, ok = sh.conc.find(&c.Key)
	}
	return ok
}

func (sh *shard) len() int { return sh.gcra.n + sh.fixed.n + sh.sliding.n + len(sh.wide) + sh.conc.n }

// Len returns the number of keys tracked, for metrics.
func (m *Store) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.len()
		sh.mu.Unlock()
	}
	return n
}

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
