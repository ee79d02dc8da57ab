package dynamo

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Lease mode (see the package documentation, "Leases"): a charge whose Lease is on is answered
// from units this Store reserved from the shared item(s) in one conditional write, without a
// round trip. A pool is one (key, limit, lease) on this Store: its grants, the demand it sees,
// and its shards.
//
// This file holds the types; lease_take.go spends units for a charge; lease_size.go sizes and
// places the next lease and decides when to renew; lease_renew.go runs a renewal over the
// shards; lease_grant.go is the conditional write that takes units from one shard;
// lease_giveback.go returns unspent units; lease_sweep.go expires grants, gives back the units
// of idle pools and closes.

// leasePools is a Store's lease pools. It is safe for concurrent use.
type leasePools struct {
	s   *Store
	now func() time.Time

	mu       sync.Mutex
	pools    map[leaseKey]*pool
	closed   bool // no new pools
	draining bool // close waits for wg: nothing new may start
	// forceShift, when forced, replaces every renewal's shift: tests on simulated time, where
	// the wall-clock round trip means nothing.
	forceShift int64
	forced     bool
	// slowRTT and slowDev, when slowForced, replace every pool's measured round trip and make
	// it slow (see pool.slow): tests of the slow-store paths on simulated time.
	slowRTT, slowDev int64
	slowForced       bool
	stop             chan struct{} // closed by close: stops the sweeper
	started          bool          // the sweeper is running
	wg               sync.WaitGroup
}

type leaseKey struct {
	key   bucket.Key
	limit bucket.Limit
	lease bucket.Lease
}

// errLeasesClosed is returned for a leased charge after Close.
var errLeasesClosed = errors.New("dynamo: store closed")

func newLeasePools(s *Store, now func() time.Time) *leasePools {
	if now == nil {
		now = time.Now
	}
	return &leasePools{
		s: s, now: now, pools: make(map[leaseKey]*pool), stop: make(chan struct{}),
	}
}

// pool is the lease state of one bucket on this Store.
type pool struct {
	ls   *leasePools
	key  leaseKey
	base string // the items' key prefix
	gcra bool
	// ttl is how long a unit may be held (ns); horizon how long a lease should last at the
	// demand seen, so that it is spent well within ttl.
	ttl, horizon int64
	home         int // the shard tried first

	// giveMu makes the pool's give-backs serial: a token bucket's chunks go back newest first,
	// each conditioned on the marker the one before it left.
	giveMu sync.Mutex

	mu        sync.Mutex
	forgotten bool // removed from ls.pools by the sweeper: a request that found it looks again
	shards    []shard
	grants    []grant    // live, in the order they were taken
	units     int64      // unspent units of grants
	inflight  []*renewal // renewals in flight, oldest first
	waiting   int64      // units the requests waiting for a renewal need
	lastStart int64      // instant the last renewal started
	yield     float64    // units a renewal brings, smoothed
	// emptyUntil: no shard had a unit to lease before this instant (the last renewal found all
	// of them empty); requests until then are rejected here.
	emptyUntil int64
	resetAt    int64   // when the bucket is full again, as far as this Store knows
	rate       float64 // demand, requests per ns, smoothed over horizon
	arrivals   int64   // requests since estAt
	estAt      int64
	lastUse    int64
	// rtt is the smoothed round trip of a lease call, rttDev its mean deviation (see rto).
	rtt, rttDev int64
	nextID      uint64       // of the next grant
	fails       uint         // renewals in a row that found every shard empty
	lastEmpty   int64        // instant of the last renewal that found every shard empty
	throttled   atomic.Int64 // throttled calls of this pool's renewals
}

// shard is one item of a pool.
type shard struct {
	t, tau, tauL int64 // GCRA: emission interval, tolerance, tolerance left to leasePools (tau - ttl)
	count        int64 // fixed window: the shard's part of the limit
	emptyUntil   int64 // no unit before this instant
	tat          int64 // GCRA: the last tat learnt (0: unknown)
	used, usedIn int64 // fixed window: the count last learnt, and the end of its window
	empty        bool  // the last try found it empty: poll it with a read first
	busy         int   // renewals of this Store writing it now
}

// grant is units reserved by one lease write, spendable until expires. A token bucket's write
// is cut into several grants, its chunks (see chunks), each expiring with its own first unit.
type grant struct {
	id      uint64 // unique in the pool
	shard   int
	units   int64 // unspent
	size    int64 // units at the start
	at      int64 // instant of the write: a unit is never spent before it
	expires int64
	write   uint64 // id of the write's first chunk
	last    bool   // the write's last chunk (a window's one grant)
	// GCRA: the tat our write left, and mark, the marker it left in lv, for giving units back
	// while nobody wrote after us, and tail, the place of our last unit (a drain may leave tat
	// a fraction of T past it); fixed window: the window's item.
	end, tail int64
	mark      uint64
	pk        string
}

// pool returns the pool of c, creating it.
func (ls *leasePools) pool(c bucket.Charge, n int64) (*pool, error) {
	k := leaseKey{c.Key, c.Limit, c.Lease}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return nil, errLeasesClosed
	}
	if p, ok := ls.pools[k]; ok {
		return p, nil
	}
	p := newPool(ls, k, n)
	ls.pools[k] = p
	if !ls.started {
		ls.started = true
		ls.wg.Go(ls.sweeper)
	}
	return p, nil
}

func newPool(ls *leasePools, k leaseKey, n int64) *pool {
	l, shards := k.limit, max(k.lease.Shards, 1)
	ttl := int64(bucket.LeaseTTL(l, k.lease))
	p := &pool{
		ls: ls, key: k, base: k.key.String(), gcra: l.Algorithm == bucket.TokenBucket,
		ttl: ttl, horizon: max(ttl/2, 1), shards: make([]shard, shards), estAt: n, lastUse: n,
		// The store's round trip so far (its warm-up reads at startup, other pools' calls):
		// the first renewal is placed and sized like the later ones.
		rtt: ls.s.live.rtt.Load(),
	}
	p.rttDev = p.rtt / 2 // as RFC 6298 starts: nothing known of the spread yet
	if ls.slowForced {
		p.rtt, p.rttDev = ls.slowRTT, ls.slowDev
	}
	// Replicas start on different shards (the key's digest and this Store's address would do;
	// a random start spreads them without coordination).
	p.home = rand.IntN(shards)
	for i := range p.shards {
		sh := &p.shards[i]
		if p.gcra {
			sh.t, sh.tau = bucket.ShardGCRA(l, shards, i)
			sh.tauL = sh.tau - ttl
		} else {
			sh.count = bucket.ShardCapacity(l.Count, shards, i)
		}
	}
	return p
}

// hold adds d to the units the pool holds unspent (the caller holds p.mu).
func (p *pool) hold(d int64) {
	p.units += d
	p.ls.s.m.leaseHeld.Add(float64(d))
}

// usable reports whether the pool can lease at all (a token bucket too small for its TTL is
// refused by validation; a limit from elsewhere is answered by an error, not an over-admission).
func (p *pool) usable() bool { return p.ttl > 0 }

// goTracked runs f in a goroutine that close waits for, unless close is already waiting.
func (ls *leasePools) goTracked(f func()) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.draining {
		return false
	}
	ls.wg.Go(f)
	return true
}
