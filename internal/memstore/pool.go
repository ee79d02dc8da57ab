package memstore

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
// idle keys are forgotten and its least used evicted, never one at its limit) is judged in the
// store's count-min sketch instead (sketch.go): at its own limit, refused early only when
// every cell it hashes to was charged by other keys. A key at its limit is never reset; memory
// stays within MaxKeys entries plus the sketch's fixed size.

// maxPools is how many pools the store tells apart: a pool index takes the low 16 bits of an
// entry's meta. Pools come from the configuration (policy names and RLS domains); any beyond
// share the last index.
const maxPools = 1 << 16

// Entry meta: an entry's generation above its pool index, 48 bits (a compact sliding state keeps
// it in the 6 bytes its alignment left). The generation is a shard's count of the entries it
// created, modulo 2^32: an entry and one created again for the same key get the same generation
// only if the shard created 2^32 entries (hours of new keys at a million a second in one shard)
// while a charge of the first was outstanding.
func newMeta(gen uint64, pool uint16) uint64 { return uint64(uint32(gen))<<16 | uint64(pool) }
func metaPool(meta uint64) uint16            { return uint16(meta) }
func metaGen(meta uint64) uint64             { return meta >> 16 }

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
func (m *Store) SetPools(names ...string) {
	for _, n := range names {
		m.poolIndex(n)
	}
}

// Pools returns how many pools the store knows.
func (m *Store) Pools() int { return int(m.pools.n.Load()) }

// poolIndex returns the index of the pool name, registering it when new.
func (m *Store) poolIndex(name string) uint16 {
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
// to the same tat). Never 0, below sketchToken.
func (m *Store) gcraToken(meta uint64, tat int64) uint64 {
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
// leaves it), and p's new keys go to the sketch until then without sweeping again. The caller
// holds sh.mu.
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
