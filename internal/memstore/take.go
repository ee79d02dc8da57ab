package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

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
//
// A group of several charges goes through these steps, all under the locks of its shards:
// room (each shard sweeps for the keys the group adds), placement (each new key gets its place
// in its shard, or goes to the sketch), evaluation (every charge against the stored state or an
// earlier charge of the group on its key), and, only if the group is admitted, the commit.
func (m *Store) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	if err := checkTake(ctx, charges, results); err != nil {
		return false, err
	}
	if len(charges) == 1 {
		if charges[0].Limit.Algorithm == bucket.Concurrency {
			return m.takeSlot(&charges[0], now, &results[0]), nil
		}
		return m.takeOne(&charges[0], now.UnixNano(), &results[0]), nil
	}
	ns := now.UnixNano()
	var buf groupBuf
	g := m.newGroup(&buf, charges)
	g.lock(m)
	m.makeGroupRoom(&g, charges, ns)
	m.placeGroup(&g, charges, ns)
	admitted := m.evalGroup(&g, charges, ns, results)
	if admitted {
		m.commitGroup(&g, charges, ns, results)
	}
	m.endGroup(&g)
	return admitted, nil
}

// checkTake returns Take's error for its arguments: a canceled ctx, too few results or an
// unknown algorithm; nil otherwise.
func checkTake(ctx context.Context, charges []bucket.Charge, results []bucket.Result) error {
	if err := ctx.Err(); err != nil && errors.Is(err, context.Canceled) {
		return fmt.Errorf("memstore: take: %w", err)
	}
	if len(results) < len(charges) {
		return fmt.Errorf("memstore: take: %d results for %d charges", len(results), len(charges))
	}
	for i := range charges {
		if a := charges[i].Limit.Algorithm; a < bucket.TokenBucket || a > bucket.Quota {
			return fmt.Errorf("memstore: take: charge %d: unknown algorithm %d", i, a)
		}
	}
	return nil
}

// How a group's charge is placed: on its key's entry, stored or new (placeStore), or in the
// sketch (placeSketch).
const (
	placeStore = iota
	placeSketch
)

// group is a group's working state from its shards' locking to their unlocking. Its slices are
// as long as the group (added as locks), and for a group of up to groupStack charges they are
// arrays of Take's frame (groupBuf): a decision allocates nothing.
type group struct {
	idx    []uint32  // charge i's shard
	locks  []uint32  // the group's distinct shards, ascending: the order they are locked in
	pend   []pending // charge i's evaluated state
	how    []uint8   // where charge i is placed (placeStore, placeSketch)
	owner  []int     // for a new key: the first charge of the group on it (-1: the key is stored)
	resv   []uint64  // for a charge that owns a new key: the meta reserved for it
	used   []bool    // whether the owner's reserved meta was stored
	added  []int     // new keys placed per shard of locks
	sketch bool      // m.sk.mu is held
}

// groupBuf holds a group of up to groupStack charges.
type groupBuf struct {
	idx, locks [groupStack]uint32
	pend       [groupStack]pending
	how        [groupStack]uint8
	owner      [groupStack]int
	resv       [groupStack]uint64
	used       [groupStack]bool
	added      [groupStack]int
}

// newGroup returns the group of charges, in buf when it fits, with each charge's shard and the
// group's shards in locking order.
func (m *Store) newGroup(buf *groupBuf, charges []bucket.Charge) group {
	var g group
	if n := len(charges); n <= groupStack {
		g = group{idx: buf.idx[:0], locks: buf.locks[:0], pend: buf.pend[:n], how: buf.how[:n],
			owner: buf.owner[:n], resv: buf.resv[:n], used: buf.used[:n], added: buf.added[:]}
	} else {
		g = group{idx: make([]uint32, 0, n), locks: make([]uint32, 0, n), pend: make([]pending, n),
			how: make([]uint8, n), owner: make([]int, n), resv: make([]uint64, n), used: make([]bool, n),
			added: make([]int, n)}
	}
	for i := range charges {
		s := m.shardOf(charges[i].Key)
		g.idx = append(g.idx, s)
		if j, found := slices.BinarySearch(g.locks, s); !found {
			g.locks = slices.Insert(g.locks, j, s)
		}
	}
	g.added = g.added[:len(g.locks)]
	return g
}

// lock locks the group's shards, in ascending order so that concurrent groups cannot deadlock.
func (g *group) lock(m *Store) {
	for _, s := range g.locks {
		m.shards[s].mu.Lock()
	}
}

// endGroup gives back the places reserved for keys that were never stored (the group was not
// admitted, or the charge that owned the place was not), and unlocks the sketch and the shards.
func (m *Store) endGroup(g *group) {
	for i, o := range g.owner {
		if o == i && !g.used[i] {
			m.shards[g.idx[i]].forget(g.resv[i])
		}
	}
	if g.sketch {
		m.sk.mu.Unlock()
	}
	for _, s := range g.locks {
		m.shards[s].mu.Unlock()
	}
}

// makeGroupRoom makes room, in each shard, for the keys the group adds, before anything is
// evaluated, so that no sweep runs between a charge's evaluation and its commit.
func (m *Store) makeGroupRoom(g *group, charges []bucket.Charge, ns int64) {
	for _, s := range g.locks {
		sh := &m.shards[s]
		// The common case: even if every charge on this shard added a key, it would stay below
		// its sweep size (never above its cap): no need to look the keys up twice.
		if sh.len()+len(charges) <= sh.sweepAt {
			continue
		}
		need := sh.newKeys(charges, g.idx, s)
		if need == 0 || sh.len()+need <= sh.sweepAt || sh.len()+need > sh.maxKeys && ns < sh.fullUntil {
			continue
		}
		// A sweep may forget or evict keys of the group itself, which it then adds again:
		// count again, and make more room if that is why there is too little.
		for range 3 {
			sh.sweep(ns, need, share(sh.maxKeys, m.Pools()))
			again := sh.newKeys(charges, g.idx, s)
			if again == need || sh.len()+again <= sh.maxKeys {
				break
			}
			need = again
		}
	}
}

// evalGroup evaluates every charge of the group at ns into its pending state and result, and
// reports whether the group is admitted: every charge conforms or is in shadow mode.
func (m *Store) evalGroup(g *group, charges []bucket.Charge, ns int64, results []bucket.Result) bool {
	admitted := true
	for i := range charges {
		c, prev := &charges[i], g.earlier(charges, results, i)
		if g.how[i] == placeSketch {
			m.judgeSketch(c, ns, &g.pend[i], prev, &results[i])
		} else {
			m.shards[g.idx[i]].eval(c, ns, &g.pend[i], prev, &results[i])
		}
		admitted = admitted && (results[i].Allowed || c.Shadow)
	}
	return admitted
}

// earlier returns the pending state of the latest conforming charge before charge i on the same
// entry (same key, same kind of state, placed alike), which charge i is evaluated against
// instead of the stored state; nil when there is none.
func (g *group) earlier(charges []bucket.Charge, results []bucket.Result, i int) *pending {
	for j := i - 1; j >= 0; j-- {
		if results[j].Allowed && g.how[j] == g.how[i] && sameEntry(&charges[j], &charges[i]) {
			return &g.pend[j]
		}
	}
	return nil
}

// commitGroup stores the pending state of every conforming charge of an admitted group, each new
// key with the meta placeGroup reserved for it, and sets the results' tokens.
func (m *Store) commitGroup(g *group, charges []bucket.Charge, ns int64, results []bucket.Result) {
	for i := range charges {
		c, r := &charges[i], &results[i]
		if !r.Allowed {
			continue
		}
		if g.how[i] == placeSketch {
			m.commitSketch(c, ns, &g.pend[i], r)
			continue
		}
		var meta uint64
		if o := g.owner[i]; o >= 0 && !g.used[o] {
			meta, g.used[o] = g.resv[o], true
		}
		meta = m.shards[g.idx[i]].commit(c, &g.pend[i], meta)
		r.Token = genToken(meta)
		if c.Limit.Algorithm == bucket.TokenBucket || c.Limit.Algorithm == bucket.LeakyBucket {
			r.Token = m.gcraToken(meta, g.pend[i].tat)
		}
	}
}

// placeGroup decides, before anything is evaluated, where each charge of a group goes: a new
// key takes a place in its shard when the shard is below its cap and the key's pool below its
// share (after a sweep of the pool's idle and least used keys: see poolRoom), counted at once so
// that the group's other new keys see it, unless the sketch still counts it; otherwise it is
// judged in the sketch. Every sweep runs before any key is looked up, so the placements stay
// true until the commit. The caller holds the shards' locks; placeGroup leaves m.sk.mu held
// when it sets g.sketch.
func (m *Store) placeGroup(g *group, charges []bucket.Charge, ns int64) {
	pools := m.poolSweeps(g, charges, ns)
	for i := range charges {
		g.owner[i] = -1
		if m.shards[g.idx[i]].has(&charges[i]) || g.sameNewKey(charges, i) {
			continue
		}
		m.placeNew(g, &charges[i], i, pools, ns)
	}
}

// poolSweeps makes room in the pool of each new key at its share of its shard, and returns the
// number of pools (which a charge of a pool not seen before adds to).
func (m *Store) poolSweeps(g *group, charges []bucket.Charge, ns int64) int {
	pools := m.Pools()
	for i := range charges {
		c, sh := &charges[i], &m.shards[g.idx[i]]
		if !sh.has(c) {
			p := m.poolIndex(c.Pool)
			pools = m.Pools()
			if sh.poolKeys(p) >= share(sh.maxKeys, pools) {
				sh.poolRoom(ns, p, pools)
			}
		}
	}
	return pools
}

// sameNewKey places charge i, on a key that is not stored, as an earlier charge of the group on
// the same new entry was placed, and reports whether there was one.
func (g *group) sameNewKey(charges []bucket.Charge, i int) bool {
	for j := range i {
		if g.owner[j] >= 0 && g.idx[j] == g.idx[i] && sameEntry(&charges[j], &charges[i]) {
			g.owner[i], g.how[i] = g.owner[j], g.how[j]
			return true
		}
	}
	return false
}

// placeNew places charge i, the group's first on a new entry: in the sketch while the sketch
// still counts its key, else in its shard when the shard and its pool have room (reserving the
// entry's meta), else in the sketch. It locks the sketch, once per group, when it consults it.
func (m *Store) placeNew(g *group, c *bucket.Charge, i, pools int, ns int64) {
	sh := &m.shards[g.idx[i]]
	g.how[i] = placeSketch
	if m.sk.active(kindOf(c.Limit.Algorithm), ns) {
		g.lockSketch(m)
		if m.inSketch(c, ns) {
			return
		}
	}
	li, _ := slices.BinarySearch(g.locks, g.idx[i])
	p := m.poolIndex(c.Pool)
	if sh.len()+g.added[li] < sh.maxKeys && sh.poolKeys(p) < share(sh.maxKeys, pools) {
		g.how[i], g.owner[i], g.resv[i] = placeStore, i, sh.admit(p)
		g.added[li]++
		return
	}
	g.lockSketch(m)
}

// lockSketch locks the sketch unless the group holds it already.
func (g *group) lockSketch(m *Store) {
	if !g.sketch {
		m.sk.mu.Lock()
		g.sketch = true
	}
}

// sameEntry reports whether two charges are on one entry: the same key and the same kind of
// state.
func sameEntry(a, b *bucket.Charge) bool {
	return a.Key == b.Key && sameState(a.Limit.Algorithm, b.Limit.Algorithm)
}

// newKeys counts the entries that the charges on shard s (idx[i] is charge i's shard) would add
// to it: charges whose key is not stored in their algorithm's kind of state, each key and kind
// once. The caller holds sh.mu.
func (sh *shard) newKeys(charges []bucket.Charge, idx []uint32, s uint32) int {
	n := 0
	for i := range charges {
		if idx[i] == s && !sh.has(&charges[i]) && firstOn(charges, idx, i) {
			n++
		}
	}
	return n
}

// firstOn reports whether charge i is the group's first on its entry.
func firstOn(charges []bucket.Charge, idx []uint32, i int) bool {
	for j := range i {
		if idx[j] == idx[i] && sameEntry(&charges[j], &charges[i]) {
			return false
		}
	}
	return true
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
