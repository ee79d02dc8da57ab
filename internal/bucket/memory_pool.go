package bucket

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Pools: a flood in one policy (or RLS domain) must never refuse a new key of another.
//
// Every charge names its pool (Charge.Pool). Each shard splits its share of MaxKeys evenly
// between the pools the store knows (SetPools, and any pool a charge names), so a pool whose
// keys all sit at their limit fills its own share of each shard and no more: the others' shares
// stay free for their new keys. A new key of a pool whose share of its shard is full (after its
// idle keys are forgotten and its least used evicted, never one at its limit) is decided on the
// pool's overflow bucket instead: one state per pool and limit, shared by every such key, at the
// policy's own limit. The flood's new keys are limited together, as one client; a key at its
// limit is never reset; memory stays within MaxKeys plus at most maxOverflow overflow states.

// maxPools is how many pools the store tells apart: a pool index takes the low 16 bits of an
// entry's meta. Pools come from the configuration (policy names and RLS domains); any beyond
// share the last index.
const maxPools = 1 << 16

// maxOverflow bounds the overflow states. Limits are configured, one or a few per pool, except
// an RLS limit override's, which the caller chooses: past this many states, idle ones are
// forgotten, and when none is idle a new key of a full pool is refused as before pools.
const maxOverflow = 1024

// Entry meta: an entry's generation above its pool index, 48 bits (a compact sliding state keeps
// it in the 6 bytes its alignment left). The generation is a shard's count of the entries it
// created, modulo 2^32: an entry and one created again for the same key get the same generation
// only if the shard created 2^32 entries (hours of new keys at a million a second in one shard)
// while a charge of the first was outstanding.
func newMeta(gen uint64, pool uint16) uint64 { return uint64(uint32(gen))<<16 | uint64(pool) }
func metaPool(meta uint64) uint16            { return uint16(meta) }
func metaGen(meta uint64) uint64             { return meta >> 16 }

// overflowToken marks, in Result.Token, a charge decided on an overflow state. (The top bit is
// the fallback store's: see gcraToken.)
const overflowToken = 1 << 62

// tokenMask keeps a token below overflowToken.
const tokenMask = overflowToken - 1

// pools maps pool names to indexes. Read on every new key, written when a pool first appears.
type pools struct {
	mu  sync.RWMutex
	idx map[string]uint16
	n   atomic.Int32 // len(idx), read without the lock by every share computation
}

// SetPools registers pools by name, so that each has its share of every shard from the start:
// a pool first named by a charge during a flood would otherwise find the shares already divided
// among fewer pools. The server calls it with every policy and RLS domain at startup and on
// reload; pools are never forgotten (a reload that removes a policy keeps its share until the
// process restarts). Safe for concurrent use.
func (m *Memory) SetPools(names ...string) {
	for _, n := range names {
		m.poolIndex(n)
	}
}

// Pools returns how many pools the store knows.
func (m *Memory) Pools() int { return int(m.pools.n.Load()) }

// poolIndex returns the index of the pool name, registering it when new.
func (m *Memory) poolIndex(name string) uint16 {
	m.pools.mu.RLock()
	i, ok := m.pools.idx[name]
	m.pools.mu.RUnlock()
	if ok {
		return i
	}
	m.pools.mu.Lock()
	defer m.pools.mu.Unlock()
	if i, ok = m.pools.idx[name]; ok {
		return i
	}
	if len(m.pools.idx) >= maxPools {
		return maxPools - 1
	}
	i = uint16(len(m.pools.idx))
	m.pools.idx[name] = i
	m.pools.n.Store(int32(len(m.pools.idx)))
	return i
}

// share is the most keys one pool may hold in a shard of this cap when the store knows n pools.
func share(maxKeys, n int) int { return max(maxKeys/max(n, 1), 1) }

// gcraToken is the Result.Token of an admitted GCRA charge: a keyed hash of the entry's
// generation and the tat its write left, which a give-back compares with the same hash of the
// state to tell whether anything wrote since (the tat) and whether the entry is still the one
// the charge was counted in (the generation: an entry evicted and created again may come back
// to the same tat). Never 0, below overflowToken.
func (m *Memory) gcraToken(meta uint64, tat int64) uint64 {
	hi, lo := bits.Mul64(metaGen(meta)^m.seed[2], uint64(tat)^m.seed[1])
	t := (hi ^ lo) & tokenMask
	if t == 0 {
		t = 1
	}
	return t
}

// genToken is the Result.Token of an admitted charge of another algorithm: the entry's
// generation (never 0), which a give-back must find in the entry it gives back to.
func genToken(meta uint64) uint64 { return metaGen(meta) & tokenMask }

// overflowKey identifies an overflow state: a pool and the limit its charges are decided at.
type overflowKey struct {
	pool  uint16
	limit Limit
}

// overflowState is the state of one overflow bucket, of whichever algorithm its limit has.
type overflowState struct {
	meta    uint64 // the generation, for give-backs (the pool index is in the key)
	tat     int64  // GCRA tat, or requests in flight for a concurrency limit
	fixed   FixedState
	sliding SlidingState
}

// overflow holds the pools' overflow states under one lock, taken after any shard's.
type overflow struct {
	mu      sync.Mutex
	states  map[overflowKey]*overflowState
	gen     uint64
	decided uint64 // charges (not shadow) decided on an overflow state, admitted or not
}

// idle reports whether the state equals a fresh one at now, so forgetting it changes nothing.
func (o *overflowState) idle(l *Limit, now int64) bool {
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		return o.tat <= now
	case FixedWindow, Quota:
		return o.fixed.End <= now
	case SlidingWindow:
		return o.sliding.Width == 0 || o.sliding.Idle(now)
	}
	return o.tat == 0
}

// overflowState returns the state of c's pool and limit, creating it (and forgetting idle
// ones when the table is full); nil when the table is full of states in use. The caller holds
// m.over.mu.
func (m *Memory) overflowState(c *Charge, now int64, create bool) *overflowState {
	k := overflowKey{pool: m.poolIndex(c.Pool), limit: c.Limit}
	if st := m.over.states[k]; st != nil || !create {
		return st
	}
	if len(m.over.states) >= maxOverflow {
		for k2, st := range m.over.states {
			if st.idle(&k2.limit, now) {
				delete(m.over.states, k2)
			}
		}
		if len(m.over.states) >= maxOverflow {
			return nil
		}
	}
	m.over.gen++
	st := &overflowState{meta: newMeta(m.over.gen, k.pool)}
	m.over.states[k] = st
	return st
}

// evalOverflow evaluates c at now on its overflow state (prev: an earlier pending charge of the
// group on the same state), leaving the new state in p. The caller holds m.over.mu.
func (m *Memory) evalOverflow(c *Charge, now int64, p *pending, prev *pending, r *Result) {
	if !c.Shadow {
		m.over.decided++
	}
	var st overflowState
	if o := m.overflowState(c, now, false); o != nil {
		st = *o
	}
	if prev != nil {
		st.tat, st.fixed, st.sliding = prev.tat, prev.fixed, prev.sliding
	}
	switch c.Limit.Algorithm {
	case TokenBucket, LeakyBucket:
		p.tat, p.room = gcraTo(st.tat, now, c.Limit.Rate, c.Limit.Burst, c.Limit.Algorithm, c.N(), r)
	case FixedWindow:
		p.fixed, *r = FixedN(st.fixed, now, c.Limit, c.N())
	case Quota:
		p.fixed, *r = QuotaN(st.fixed, now, c.Limit, c.N())
	case SlidingWindow:
		p.sliding = st.sliding
		p.sliding.take(now, &c.Limit, c.N(), r)
	case Concurrency:
		p.tat, *r = Concurrent(st.tat, c.Limit)
	}
}

// commitOverflow stores p, evaluated by evalOverflow, as c's overflow state and sets r's token;
// false when the table has no room for a new state (the caller refuses c). The caller holds
// m.over.mu.
func (m *Memory) commitOverflow(c *Charge, now int64, p *pending, r *Result) bool {
	st := m.overflowState(c, now, true)
	if st == nil {
		return false
	}
	st.tat, st.fixed, st.sliding = p.tat, p.fixed, p.sliding
	r.Token = overflowToken | genToken(st.meta)
	if c.Limit.Algorithm == TokenBucket || c.Limit.Algorithm == LeakyBucket {
		r.Token = overflowToken | m.gcraToken(st.meta, st.tat)
	}
	return true
}

// takeOverflow decides c, a new key for which its shard has no room, on its pool's overflow
// state, and commits it when it conforms: the result replaces r. The caller holds the shard's
// lock.
func (m *Memory) takeOverflow(sh *shard, c *Charge, now int64, r *Result) {
	m.over.mu.Lock()
	defer m.over.mu.Unlock()
	var p pending
	m.evalOverflow(c, now, &p, nil, r)
	if r.Allowed && !m.commitOverflow(c, now, &p, r) {
		sh.refuse(c, now, r)
	}
}

// releaseOverflow gives back a charge decided on an overflow state: only to the state it was
// counted in (its generation, and for a token bucket its tat, in the token).
func (m *Memory) releaseOverflow(tk *Taken) {
	m.over.mu.Lock()
	defer m.over.mu.Unlock()
	c := &tk.Charge
	st := m.overflowState(c, 0, false)
	if st == nil {
		return
	}
	tok := tk.Token &^ overflowToken
	switch c.Limit.Algorithm {
	case TokenBucket:
		if m.gcraToken(st.meta, st.tat) == tok {
			st.tat, _ = GCRARefundN(st.tat, st.tat, c.Limit, c.N())
		}
	case FixedWindow, Quota, SlidingWindow, Concurrency:
		if genToken(st.meta) != tok {
			return
		}
		switch c.Limit.Algorithm {
		case FixedWindow:
			st.fixed, _ = FixedRefundN(st.fixed, tk.At.UnixNano(), c.Limit, c.N())
		case Quota:
			st.fixed, _ = QuotaRefundN(st.fixed, tk.At.UnixNano(), c.Limit, c.N())
		case SlidingWindow:
			st.sliding.refund(tk.At.UnixNano(), &c.Limit, c.N())
		case Concurrency:
			st.tat = ConcurrentRelease(st.tat)
		}
	}
}

// Overflowed returns how many charges (shadow ones aside) were decided on a pool's overflow
// bucket, admitted or not: new keys whose pool's share of their shard was full of keys it could
// not evict. For metrics.
func (m *Memory) Overflowed() uint64 {
	m.over.mu.Lock()
	defer m.over.mu.Unlock()
	return m.over.decided
}

// poolKeys returns how many keys of pool p the shard holds. The caller holds sh.mu.
func (sh *shard) poolKeys(p uint16) int {
	if int(p) < len(sh.pools) {
		return int(sh.pools[p])
	}
	return 0
}

// admit counts a new entry of pool p and returns its meta. The caller holds sh.mu.
func (sh *shard) admit(p uint16) uint64 {
	if int(p) >= len(sh.pools) {
		sh.pools = append(sh.pools, make([]int32, int(p)+1-len(sh.pools))...)
	}
	sh.pools[p]++
	sh.gen++
	return newMeta(sh.gen, p)
}

// forget uncounts an entry deleted from the shard. The caller holds sh.mu.
func (sh *shard) forget(meta uint64) {
	if p := metaPool(meta); int(p) < len(sh.pools) && sh.pools[p] > 0 {
		sh.pools[p]--
	}
}

// poolRoom reports whether pool p may add a key to the shard: below its share, or back below it
// after a sweep that forgets idle keys and evicts p's least used (never a key at its limit). A
// sweep that finds nothing of p to evict records until when (the first of p's keys at its limit
// leaves it), and p's new keys go to its overflow bucket until then without sweeping again. The
// caller holds sh.mu.
func (sh *shard) poolRoom(now int64, p uint16, n int) bool {
	limit := share(sh.maxKeys, n)
	if sh.poolKeys(p) < limit {
		return true
	}
	if until, ok := sh.poolFull[p]; ok && now < until {
		return false
	}
	sh.sweepPool(now, p, limit)
	return sh.poolKeys(p) < limit
}
