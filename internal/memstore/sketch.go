package memstore

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The sketch: where the memory store judges a new key that it cannot give an entry of its own
// (issue 32 item 6).
//
// A pool's share of a shard can fill with keys at their limit (a flood of keys that each reach
// their limit with one request), and those are never evicted: forgetting one would hand its
// client a fresh limit. A new key of such a pool is then judged in a count-min sketch with
// conservative update: the key hashes to one cell in each of sketchDepth rows, its state is read
// as the least charged of its cells, and a request taken from that state raises each of the cells
// to at least the new state (a cell already above stays). Every cell is, at every instant, at
// least the state of every key that hashes to it (by induction: raising cells to a key's new
// state, which is at least its true new state, keeps it), so the least charged cell still over-
// states the key: a key may be refused early (when all its cells were charged by other keys), but
// it is never admitted past its own limit. Before, every such key shared one overflow bucket per
// pool and limit, and a flood that spent it refused every new client of the policy until it
// refilled.
//
// A cell holds what a conservative state needs, in 8 bytes:
//   - token and leaky bucket: a tat (the key is at its limit while tat-now exceeds its room);
//   - fixed window, quota, sliding window: a count of requests and the second by which all of
//     them have left their window or period (rounded up, so a count is kept a little longer);
//   - concurrency: requests in flight, as a plain count-min sketch (every cell of the key is
//     charged, and given back on release): a conservative update cannot give a slot back.
//
// A key stays in the sketch while the sketch says it is not fresh, even once its pool has room:
// storing it fresh would forget what the sketch counted. The sketch is sized from MaxKeys
// (sketchDepth rows of max(sketchWidth*MaxKeys, minSketchWidth) cells) and allocated per kind
// the first time a key is charged in it; a kind none of whose cells is charged any more, and a
// pool none of whose charges is, are skipped without a lookup.

// sketchDepth is the number of rows (cells a key is charged in).
const sketchDepth = 4

// sketchWidth is a row's width in cells per key of MaxKeys, and minSketchWidth the least width
// (128 KiB a kind: small stores are not worth saving on). With F keys judged in the sketch, each
// charging its cells, a fresh key is refused early when all its cells are charged, about
// (1-exp(-F/width))^sketchDepth: 2.4% with F = MaxKeys at 2*MaxKeys cells a row.
const (
	sketchWidth    = 2
	minSketchWidth = 4096
)

// sketchKind is the kind of cell a limit's keys are judged in.
type sketchKind uint8

const (
	sketchGCRA    sketchKind = iota // token and leaky bucket: a tat
	sketchCounted                   // fixed window, quota, sliding window: count and end
	sketchSlots                     // concurrency: requests in flight
	sketchKinds
)

func kindOf(a bucket.Algorithm) sketchKind {
	switch a {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return sketchGCRA
	case bucket.Concurrency:
		return sketchSlots
	}
	return sketchCounted
}

// sketchToken marks, in Result.Token, a charge judged in the sketch. (The top bit is the
// fallback store's: see gcraToken.)
const sketchToken = 1 << 62

// tokenMask keeps a token below sketchToken.
const tokenMask = sketchToken - 1

// sketch is the store's count-min sketch, one array of cells per kind. Its lock is taken after
// any shard's.
type sketch struct {
	mu    sync.Mutex
	width uint64 // cells per row
	cells [sketchKinds][]uint64
	// until is, per kind, an instant from which no cell is charged (the largest tat or end
	// written; for slots, the requests in flight in the sketch, 0 when none): while now is past
	// it, every key is fresh in the sketch and a new key need not look. Read without the lock.
	until [sketchKinds]atomic.Int64
	// pools is the same per kind and pool (sketchPool): a key of a pool that charged nothing
	// still counted is fresh, however charged its cells are by other pools' keys, so that a
	// flood in one pool does not send another's new keys to the sketch. At most sketchKinds
	// times the pools the store tells apart.
	pools   map[uint32]int64
	seed    [3]uint64
	decided uint64 // charges (not shadow) judged in the sketch, admitted or not
}

// sketchPool is the key of s.pools for kind k and pool p.
func sketchPool(k sketchKind, p uint16) uint32 { return uint32(k)<<16 | uint32(p) }

// init sizes an empty sketch for a store of maxKeys; its cells are allocated on first use.
func (s *sketch) init(maxKeys int) {
	s.width = uint64(max(sketchWidth*maxKeys, minSketchWidth))
	s.pools = make(map[uint32]int64)
	for i := range s.seed {
		s.seed[i] = rand.Uint64() // ChaCha8 from the runtime's random seed: not predictable
	}
	s.seed[2] |= 1
}

// Bytes is the memory each kind of cell takes once allocated.
func (s *sketch) Bytes() int { return sketchDepth * int(s.width) * 8 }

// cellsOf writes the index of k's cell in each row. Kirsch and Mitzenmacher's double hashing
// (h1 + i*h2) from a keyed 128-bit multiply, each reduced to the row's width by a multiply-shift
// (no power of two needed): without the seed no one can choose keys that share cells.
func (s *sketch) cellsOf(k *bucket.Key, pool uint16, idx *[sketchDepth]int) {
	hi, lo := bits.Mul64(leUint64(k[:8])^s.seed[0], leUint64(k[8:])^s.seed[1]^uint64(pool)<<48)
	h1, h2 := hi^lo, (lo*s.seed[2])|1
	for i := range idx {
		r, _ := bits.Mul64(h1+uint64(i)*h2, s.width)
		idx[i] = i*int(s.width) + int(r)
	}
}

func leUint64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// A counted cell: the count in the low 32 bits (Counts are at most limitterms.MaxCount, below
// 2^32), above it the second by which every counted request has left, as an offset from
// sketchEpoch (so 1902 to 2106 fit; later saturates to never, which only keeps a count longer).
const sketchEpoch = -1 << 31

func packCounted(end, n int64) uint64 {
	sec := (end+int64(time.Second)-1)/int64(time.Second) - sketchEpoch
	sec = min(max(sec, 0), math.MaxUint32)
	return uint64(sec)<<32 | uint64(min(n, math.MaxUint32))
}

func countedAt(cell uint64, now int64) int64 {
	sec := int64(cell >> 32)
	if sec != math.MaxUint32 && (sec+sketchEpoch)*int64(time.Second) <= now {
		return 0
	}
	return int64(uint32(cell))
}

func countedEnd(cell uint64) int64 {
	if sec := int64(cell >> 32); sec != math.MaxUint32 {
		return (sec + sketchEpoch) * int64(time.Second)
	}
	return math.MaxInt64
}

// active reports whether any cell of kind k may be charged at now; the caller needs no lock.
func (s *sketch) active(k sketchKind, now int64) bool {
	u := s.until[k].Load()
	if k == sketchSlots {
		return u > 0
	}
	return u > now
}

// sketchState is a key's state read from the sketch: the least charged of its cells (a tat, a
// count or requests in flight) and, for counted cells, the first instant one of them empties.
type sketchState struct {
	v   int64
	end int64
}

// read returns c's state in the sketch at now (zero when the kind was never used). The caller
// holds s.mu.
func (s *sketch) read(c *bucket.Charge, pool uint16, now int64, idx *[sketchDepth]int) sketchState {
	k := kindOf(c.Limit.Algorithm)
	cells := s.cells[k]
	if u := s.pools[sketchPool(k, pool)]; cells == nil || k == sketchSlots && u <= 0 || k != sketchSlots && u <= now {
		return sketchState{}
	}
	s.cellsOf(&c.Key, pool, idx)
	st := sketchState{v: math.MaxInt64, end: math.MaxInt64}
	for _, i := range idx {
		cell := cells[i]
		switch k {
		case sketchCounted:
			n := countedAt(cell, now)
			if n == 0 {
				return sketchState{}
			}
			st.v, st.end = min(st.v, n), min(st.end, countedEnd(cell))
		default:
			st.v = min(st.v, int64(cell))
		}
	}
	return st
}

// fresh reports whether a state read for c equals a fresh key's.
func (st *sketchState) fresh(c *bucket.Charge, now int64) bool {
	if kindOf(c.Limit.Algorithm) == sketchGCRA {
		return st.v <= now
	}
	return st.v <= 0
}

// judge decides c at now on the state st (read from the sketch, or a pending charge of the same
// group on the same key), writes the verdict into r and returns the state a taken request
// leaves (a tat, the new count and its end, the new requests in flight), which commit writes.
func judge(c *bucket.Charge, st sketchState, now int64, r *bucket.Result) sketchState {
	l := &c.Limit
	n := c.N()
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		tat, _ := bucket.GCRAInto(st.v, now, l.Rate, l.Burst, l.Algorithm, n, r)
		return sketchState{v: tat}
	case bucket.Concurrency:
		var next sketchState
		next.v = st.v
		if bucket.ConcurrentInto(st.v, l.Count, r) {
			next.v++
		}
		return next
	}
	// Counted: the requests counted so far, every one until st.end at the latest.
	var end int64
	switch l.Algorithm {
	case bucket.FixedWindow:
		w := bucket.WindowSpan(l.Window)
		end = bucket.FloorDiv(now, w)*w + w
	case bucket.Quota:
		_, end = bucket.QuotaPeriod(now, *l)
	default: // SlidingWindow: a request in slot cur counts until slot cur+K+1 starts
		w := bucket.SlotWidth(l.Window)
		end = (bucket.FloorDiv(now, w) + bucket.SlidingRing) * w
	}
	if st.v <= l.Count-n {
		*r = bucket.Result{Allowed: true, Limit: l.Count, Remaining: l.Count - st.v - n, Reset: time.Duration(end - now)}
		return sketchState{v: st.v + n, end: end}
	}
	wait := time.Duration(max(st.end-now, 0))
	*r = bucket.Result{Limit: l.Count, Remaining: max(l.Count-st.v, 0), Reset: wait, RetryAfter: wait}
	return st
}

// commit charges c's cells with next, the state judge returned for an admitted request: raises
// each to at least next (conservative update), or, for slots, adds one to each. The caller
// holds s.mu.
func (s *sketch) commit(c *bucket.Charge, pool uint16, next sketchState, now int64) {
	k := kindOf(c.Limit.Algorithm)
	if s.cells[k] == nil {
		s.cells[k] = make([]uint64, sketchDepth*s.width)
	}
	var idx [sketchDepth]int
	s.cellsOf(&c.Key, pool, &idx)
	cells := s.cells[k]
	switch k {
	case sketchGCRA:
		for _, i := range idx {
			cells[i] = uint64(max(int64(cells[i]), next.v))
		}
		if next.v > s.until[k].Load() {
			s.until[k].Store(next.v)
		}
		s.pools[sketchPool(k, pool)] = max(s.pools[sketchPool(k, pool)], next.v)
	case sketchCounted:
		packed := packCounted(next.end, next.v)
		for _, i := range idx {
			if n := countedAt(cells[i], now); n > 0 {
				cells[i] = max(cells[i]>>32, packed>>32)<<32 | uint64(max(n, next.v))
			} else {
				cells[i] = packed
			}
		}
		e := countedEnd(packed)
		if e > s.until[k].Load() {
			s.until[k].Store(e)
		}
		s.pools[sketchPool(k, pool)] = max(s.pools[sketchPool(k, pool)], e)
	case sketchSlots:
		for _, i := range idx {
			cells[i]++
		}
		s.until[k].Add(1)
		s.pools[sketchPool(k, pool)]++
	}
}

// giveBack gives back a concurrency slot taken in the sketch: one from each of the key's cells.
// A give-back of any other kind gives nothing: a cell may have been raised by other keys since,
// and lowering it could let them past their limits. The caller holds s.mu.
func (s *sketch) giveBack(c *bucket.Charge, pool uint16) {
	if c.Limit.Algorithm != bucket.Concurrency || s.cells[sketchSlots] == nil {
		return
	}
	var idx [sketchDepth]int
	s.cellsOf(&c.Key, pool, &idx)
	for _, i := range idx {
		if s.cells[sketchSlots][i] > 0 {
			s.cells[sketchSlots][i]--
		}
	}
	if s.until[sketchSlots].Load() > 0 {
		s.until[sketchSlots].Add(-1)
	}
	if p := sketchPool(sketchSlots, pool); s.pools[p] > 0 {
		s.pools[p]--
	}
}

// inSketch reports whether c's key, which its shard does not hold, must be judged in the sketch
// although it could be stored: the sketch does not read it as fresh (storing it fresh would
// forget what its cells counted). The caller holds m.sk.mu, or holds it only if inSketch needs
// it: see lockSketch.
func (m *Store) inSketch(c *bucket.Charge, now int64) bool {
	var idx [sketchDepth]int
	st := m.sk.read(c, m.poolIndex(c.Pool), now, &idx)
	return !st.fresh(c, now)
}

// judgeSketch decides c at now in the sketch (on prev, the state a pending charge of the same
// group on the same key leaves, when not nil) and leaves the state to commit in p. The caller
// holds m.sk.mu.
func (m *Store) judgeSketch(c *bucket.Charge, now int64, p *pending, prev *pending, r *bucket.Result) {
	if !c.Shadow {
		m.sk.decided++
	}
	var st sketchState
	if prev != nil {
		st = sketchState{v: prev.tat, end: prev.room}
	} else {
		var idx [sketchDepth]int
		st = m.sk.read(c, m.poolIndex(c.Pool), now, &idx)
	}
	next := judge(c, st, now, r)
	p.tat, p.room = next.v, next.end
}

// commitSketch charges c's cells with p (judged by judgeSketch) and sets r's token. The caller
// holds m.sk.mu.
func (m *Store) commitSketch(c *bucket.Charge, now int64, p *pending, r *bucket.Result) {
	m.sk.commit(c, m.poolIndex(c.Pool), sketchState{v: p.tat, end: p.room}, now)
	r.Token = sketchToken | 1
}

// takeSketch decides c, a new key its shard will not store, in the sketch, and charges it when it
// conforms: the result replaces r. The caller holds the shard's lock.
func (m *Store) takeSketch(c *bucket.Charge, now int64, r *bucket.Result) {
	m.sk.mu.Lock()
	defer m.sk.mu.Unlock()
	var p pending
	m.judgeSketch(c, now, &p, nil, r)
	if r.Allowed {
		m.commitSketch(c, now, &p, r)
	}
}

// giveBackSketch gives back a charge judged in the sketch (see sketch.giveBack).
func (m *Store) giveBackSketch(tk *bucket.Taken) {
	m.sk.mu.Lock()
	defer m.sk.mu.Unlock()
	m.sk.giveBack(&tk.Charge, m.poolIndex(tk.Charge.Pool))
}

// Overflowed returns how many charges (shadow ones aside) were judged in the sketch, admitted or
// not: new keys whose pool's share of their shard was full of keys it could not evict, and keys
// the sketch still counted. For metrics (ratelimit_memory_overflow_total).
func (m *Store) Overflowed() uint64 {
	m.sk.mu.Lock()
	defer m.sk.mu.Unlock()
	return m.sk.decided
}

// SketchBytes returns the memory the sketch's cells take now (each kind's cells are allocated
// the first time a key of that kind is charged in it), and at most (every kind allocated).
func (m *Store) SketchBytes() (now, most int) {
	m.sk.mu.Lock()
	defer m.sk.mu.Unlock()
	for _, c := range m.sk.cells {
		if c != nil {
			now += m.sk.Bytes()
		}
	}
	return now, int(sketchKinds) * m.sk.Bytes()
}
