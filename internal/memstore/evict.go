package memstore

import (
	"math"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Eviction: what the memory store forgets when a shard fills, and in which order.
//
// A key's state is one of three things at an instant:
//   - idle: equal to a fresh key's (the bucket has refilled, every counted request has left its
//     window, nothing in flight). Forgetting it changes nothing.
//   - at its limit: its next request of the cost it was last charged would be rejected. Forgetting
//     it would hand the client a fresh limit (a daily quota reset), so it is never evicted; when a
//     full shard holds nothing else, new keys are judged in the sketch instead (sketch.go).
//   - in between: forgetting it forgives what the client has used. The least used go first: the
//     smallest share of their room (the use at which the next request would be rejected).

// evictLevels is how many shares of its room a live key's use is sorted into for eviction: a
// histogram of levels finds the least used without sorting the shard.
const evictLevels = 16

// The rank of an idle key and of a key at its limit, beside the levels 0 to evictLevels-1.
const (
	rankIdle    = -2
	rankAtLimit = -1
)

// level sorts a use of 0 < used <= room into the evictLevels shares of room.
func level(used, room int64) int {
	return min(int(float64(used)*evictLevels/(float64(room)+1)), evictLevels-1)
}

// rankUse ranks a key whose state holds used of room (used <= 0: idle); until is when a key at
// its limit stops being so.
func rankUse(used, room, until int64) (int, int64) {
	switch {
	case used <= 0:
		return rankIdle, 0
	case used > room:
		return rankAtLimit, until
	}
	return level(used, room), 0
}

// rank is the entry's rank at now and, at its limit, the instant it stops being so: when tat-now
// falls to room.
func (e *gcraEntry) rank(now int64) (int, int64) { return rankUse(e.tat-now, e.room, e.tat-e.room) }

// rank: a window's count is its use until the window ends, and at its limit until then.
func (e *fixedEntry) rank(now int64) (int, int64) {
	if e.End <= now {
		return rankIdle, 0
	}
	return rankUse(e.Count, e.room, e.End)
}

// rank: a concurrency key is at its limit with Count requests in flight, until one ends (which
// no instant tells).
func (e *concEntry) rank(int64) (int, int64) {
	return rankUse(e.n-concStored, e.count-1, math.MaxInt64)
}

// rank: the requests still counted at now, and at the limit until enough slots have left.
func (s *compactSliding) rank(now int64) (int, int64) {
	return ringRank(&s.counts, s.slot, s.width(), int64(s.room), now)
}

func (e *wideEntry) rank(now int64) (int, int64) {
	return ringRank(&e.Counts, e.Slot, e.Width, e.room, now)
}

// ringRank ranks a sliding window's ring (newest slot slot, width w): its use is the sum of the
// slots a request at now counts, and a key at its limit stops being so when enough of the
// oldest have left that the sum is within room.
func ringRank[C bucket.SlidingCounter](counts *[bucket.SlidingRing]C, slot, w, room, now int64) (int, int64) {
	if w <= 0 {
		return rankIdle, 0
	}
	newest := max(bucket.FloorDiv(now, w), slot) // a clock that stepped back still counts slot
	var sum int64
	for j := newest - bucket.SlidingSlots; j <= slot; j++ {
		if j > slot-bucket.SlidingRing {
			sum += int64(counts[bucket.SlidingIndex(j)])
		}
	}
	if sum <= 0 || sum <= room {
		return rankUse(sum, room, 0)
	}
	rest := sum
	for j := newest - bucket.SlidingSlots; j <= slot; j++ {
		if j > slot-bucket.SlidingRing {
			rest -= int64(counts[bucket.SlidingIndex(j)])
		}
		if rest <= room {
			return rankAtLimit, (j + bucket.SlidingRing) * w // slot j stops being counted then
		}
	}
	return rankAtLimit, math.MaxInt64
}

// evictions counts what a shard forgot, by kind.
type evictions struct {
	idle uint64 // idle keys forgotten: nothing changes for their clients
	live uint64 // live keys evicted at the cap, least used first, none at its limit
}

// Evictions counts what the memory store has forgotten or refused since it was created,
// by kind, for metrics.
type Evictions struct {
	// Idle keys were forgotten because their state equalled a fresh key's: nobody gained
	// anything.
	Idle uint64
	// LeastUsed live keys were evicted because a shard reached its share of MaxKeys: the least
	// used first, never one at its limit. Each forgave its client what it had used.
	LeastUsed uint64
	// Refused is always 0 since issue 32: a new key that its pool's share cannot hold is judged
	// in the sketch, which has no states to run out of (before, it was refused when every one of
	// 1,024 overflow buckets was in use). Kept for ratelimit_memory_keys_refused_total.
	Refused uint64
}

// Evictions returns the store's eviction counts.
func (m *Store) Evictions() Evictions {
	var e Evictions
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		e.Idle += sh.stats.idle
		e.LeastUsed += sh.stats.live
		sh.mu.Unlock()
	}
	return e
}

// Evicted returns the number of live keys evicted by the MaxKeys cap since creation
// (Evictions().LeastUsed). Idle keys forgotten by sweeps are not counted: forgetting them
// changes nothing.
func (m *Store) Evicted() uint64 { return m.Evictions().LeastUsed }

// makeRoom makes room for one key the shard is about to add, sweeping when it has reached its
// sweep size, and reports whether there is room. The caller holds sh.mu.
func (sh *shard) makeRoom(now int64, limit int) bool {
	n := sh.len()
	if n < sh.sweepAt {
		return true
	}
	if n >= sh.maxKeys && now < sh.fullUntil {
		return false // nothing can go before then: no sweep needed to know it
	}
	sh.sweep(now, 1, limit)
	return sh.len() < sh.maxKeys
}

// sweep forgets the keys that are idle at now; if the shard is still within 1/16 of its cap (or
// has no room for the need keys about to be added) it evicts live keys down to 15/16 of the cap
// (or to room for need), the least used first and none at its limit. A shard left without room
// for need records in fullUntil when the first of its keys may go. Tables and maps do not shrink
// when keys are deleted, so after a sweep that leaves under an eighth of a large peak they are
// rebuilt. The caller holds sh.mu.
//
// limit is the share of the shard each pool may hold (0: no pools): while some pool holds more,
// only such pools' keys are evicted, so that a pool within its share never loses a key to
// another's.
func (sh *shard) sweep(now int64, need, limit int) { sh.sweepOf(now, need, -1, limit) }

// sweepPool is sweep for pool p at its share limit of the shard: it forgets every idle key, and
// then evicts only p's least used, down to 15/16 of its share, none at its limit. When p is left
// at its share, poolFull records when the first of its keys may go. The caller holds sh.mu.
func (sh *shard) sweepPool(now int64, p uint16, limit int) { sh.sweepOf(now, 1, int(p), limit) }

// sweepOf is sweep (pool < 0) or sweepPool (pool, at its share limit).
func (sh *shard) sweepOf(now int64, need, pool, limit int) {
	before := sh.len()
	ours := sh.candidates(pool, limit)
	hist, free := sh.forgetIdle(now, ours)
	sh.stats.idle += uint64(before - sh.len())
	// Evicting to a low-water mark rather than to just below the cap keeps a shard full of live
	// keys from sweeping on every insert.
	n, low := sh.len(), min(sh.maxKeys-max(sh.maxKeys/16, 1), sh.maxKeys-need)
	if pool >= 0 {
		n, low = sh.poolKeys(uint16(pool)), limit-max(limit/16, 1)
	}
	// (While pools over their share are evicted, one may fall to its share on the way and its
	// other keys stop being candidates: the sweep then makes a little less room, never takes
	// from a pool within its share.)
	if n > low {
		sh.evictLeastUsed(now, &hist, n, low, ours)
	}
	sh.recordFull(need, pool, limit, free)
	sh.rebuildIfSparse(before)
	sh.sweepAt = min(max(2*sh.len(), minSweep), sh.maxKeys)
}

// candidates returns which live keys a sweep may evict, by their meta: pool's (pool >= 0), or
// for a shard's sweep the keys of the pools above their share limit when some pool is, else
// every key.
func (sh *shard) candidates(pool, limit int) func(meta uint64) bool {
	if pool >= 0 {
		return func(meta uint64) bool { return int(metaPool(meta)) == pool }
	}
	if limit > 0 {
		for _, n := range sh.pools {
			if int(n) > limit {
				return func(meta uint64) bool { return sh.poolKeys(metaPool(meta)) > limit }
			}
		}
	}
	return func(uint64) bool { return true }
}

// visit calls f with the meta, rank and at-limit instant (see rank) of every entry of the shard,
// each kind of state in turn, deleting those for which it reports true, until stop does.
// (deleteWhile may visit a key twice.)
func (sh *shard) visit(now int64, f func(meta uint64, lvl int, until int64) bool, stop func() bool) {
	sh.gcra.deleteWhile(func(e *gcraEntry) bool { l, u := e.rank(now); return f(e.meta, l, u) }, stop)
	sh.fixed.deleteWhile(func(e *fixedEntry) bool { l, u := e.rank(now); return f(e.meta, l, u) }, stop)
	sh.sliding.deleteWhile(func(e *compactSliding) bool { l, u := e.rank(now); return f(e.meta(), l, u) }, stop)
	for k, e := range sh.wide {
		if stop() {
			break
		}
		if l, u := e.rank(now); f(e.meta, l, u) {
			delete(sh.wide, k)
		}
	}
	sh.conc.deleteWhile(func(e *concEntry) bool { l, u := e.rank(now); return f(e.meta, l, u) }, stop)
}

// forgetIdle forgets the shard's idle keys and sorts the live candidates into a histogram of
// levels; it returns that and the first instant a candidate at its limit stops being so
// (math.MaxInt64: none will by itself). A key visited twice only makes the eviction stop a
// little early.
func (sh *shard) forgetIdle(now int64, ours func(uint64) bool) (hist [evictLevels]int, free int64) {
	free = math.MaxInt64
	sh.visit(now, func(meta uint64, lvl int, until int64) bool {
		switch {
		case lvl == rankIdle:
			sh.forget(meta)
			return true
		case !ours(meta):
		case lvl == rankAtLimit:
			free = min(free, until)
		default:
			hist[lvl]++
		}
		return false
	}, func() bool { return false })
	return hist, free
}

// evictLeastUsed evicts n-low of the candidates, the lowest levels of hist first, none at its
// limit.
func (sh *shard) evictLeastUsed(now int64, hist *[evictLevels]int, n, low int, ours func(uint64) bool) {
	// Every level below cut goes, and atCut keys of level cut.
	cut, atCut := 0, n-low
	for cut < evictLevels && hist[cut] < atCut {
		atCut -= hist[cut]
		cut++
	}
	sh.visit(now, func(meta uint64, lvl int, _ int64) bool {
		if lvl < 0 || lvl > cut || lvl == cut && atCut == 0 || !ours(meta) {
			return false
		}
		if lvl == cut {
			atCut--
		}
		n--
		sh.stats.live++
		sh.forget(meta)
		return true
	}, func() bool { return n <= low })
}

// recordFull records, after a sweep, until when the shard (pool < 0) or the pool stays full:
// free, the first instant one of its keys may go, when the sweep left no room for need keys
// (one, for a pool).
func (sh *shard) recordFull(need, pool, limit int, free int64) {
	if pool < 0 {
		sh.fullUntil = 0
		if sh.len()+need > sh.maxKeys {
			sh.fullUntil = free
		}
		return
	}
	if sh.poolKeys(uint16(pool)) < limit {
		delete(sh.poolFull, uint16(pool))
		return
	}
	if sh.poolFull == nil {
		sh.poolFull = make(map[uint16]int64)
	}
	sh.poolFull[uint16(pool)] = free
}

// rebuildIfSparse rebuilds the tables and the map when a sweep has left under an eighth of a
// large peak: they do not shrink when keys are deleted. Small shards are not rebuilt: with keys
// that go idle between visits (many clients, few requests each) they would be rebuilt and
// regrown on every sweep, allocating on the hot path, to return a few kilobytes.
func (sh *shard) rebuildIfSparse(before int) {
	n := sh.len()
	sh.peak = max(sh.peak, before)
	if sh.peak >= rebuildPeak && n < sh.peak/8 {
		sh.gcra.shrink()
		sh.fixed.shrink()
		sh.sliding.shrink()
		sh.conc.shrink()
		sh.wide = rebuilt(sh.wide)
		sh.peak = n
	}
}

// rebuilt returns a copy of m sized for its current length.
func rebuilt[V any](m map[bucket.Key]V) map[bucket.Key]V {
	c := make(map[bucket.Key]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
