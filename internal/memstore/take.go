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
