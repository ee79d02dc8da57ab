// Package lease serves a DynamoDB store's leased charges from units reserved from the shared
// items in one conditional write, spent locally without a round trip (docs/dynamodb-internals.md, "Leases").
package lease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// A charge whose Lease is on is answered from units this Store reserved from the shared
// item(s) in one conditional write, without a round trip. A pool is one (key, limit, lease) on
// this Store: its grants, the demand it sees, and its shards.
//
// This file holds the types; take.go spends units for a charge; size.go sizes and places the
// next lease and decides when to renew; renew.go runs a renewal over the shards; grant.go is the
// conditional write that takes units from one shard; giveback.go returns unspent units;
// sweep.go expires grants, gives back the units of idle pools and closes.

// Table is what the pools need of the store they lease from; the store implements it.
type Table interface {
	// Lease sends a lease write to item pk and returns the item as rv asks. It is sent once
	// (not idempotent: no copy may follow a lost answer); a throttled write, which was not
	// applied, is retried. A failure other than the write's condition is counted (op lease).
	Lease(ctx context.Context, pk string, u Update, rv types.ReturnValue) (map[string]types.AttributeValue, error)
	// GiveBack sends one attempt of a token bucket's give-back to item pk, once, counting a
	// failure other than its condition (op lease_refund).
	GiveBack(ctx context.Context, pk string, u Update) error
	// CountGiveBack starts the give-back of units to the counter item pk while cond holds,
	// exactly once or not at all whatever its attempts' answers (the store's counter give-back).
	CountGiveBack(pk string, units int64, cond string) CountGive
	// Read reads item pk with a strongly consistent read (nil when it is absent).
	Read(ctx context.Context, pk string) (map[string]types.AttributeValue, error)
	// RTT is the store's smoothed round trip so far, over every call (ns, 0 before any).
	RTT() int64
	// Silent reports whether the store has left a call without an answer for over its grace:
	// it may be down or hung, which is on_error's to decide, not a rejection's.
	Silent() bool
	// CountThrottles returns ctx, under which every throttled call adds one to c.
	CountThrottles(ctx context.Context, c *atomic.Int64) context.Context
}

// CountGive is one counter give-back, carrying its own id across its attempts.
type CountGive interface {
	// Attempt sends the give-back once: done when its outcome is known (landed, or nothing to
	// give back), again when it is not and another attempt may still settle it. An attempt
	// that is not done is counted as a failure (op lease_refund).
	Attempt(ctx context.Context) (done, landed, again bool)
}

// Update is one UpdateItem: its update and condition expressions, and their attribute names
// and values.
type Update struct {
	Expr, Cond string
	Names      map[string]string
	Values     map[string]types.AttributeValue
}

// Metrics are the store's collectors that the pools count into.
type Metrics struct {
	Renewals *prometheus.CounterVec // by result: granted, empty, error
	Local    prometheus.Histogram   // decisions made without a round trip
	Units    *prometheus.CounterVec // by outcome: leased, spent, refunded, expired, unanswered
	Held     prometheus.Gauge       // units held unspent
}

// The result label's values of Metrics.Renewals.
const (
	leaseGranted = "granted" // a lease write took units
	leaseEmpty   = "empty"   // every shard was empty
	leaseError   = "error"   // the write failed (the waiting requests follow on_error)
)

// The outcome label's values of Metrics.Units.
const (
	unitsLeased   = "leased"   // taken from the table by lease writes
	unitsSpent    = "spent"    // admitted requests
	unitsRefunded = "refunded" // given back to the table unspent
	unitsExpired  = "expired"  // unspent and not given back: capacity the pool lost
	// unitsUnanswered is not part of leased: the units a lease write asked for whose answer
	// never came (a lost connection, a timeout). It may have taken them; held by no one, they
	// come back as their places pass (token bucket) or when the window ends.
	unitsUnanswered = "unanswered"
)

// Config is what a Store's pools are made of.
type Config struct {
	Table   Table
	Metrics Metrics
	// Throttled is the error that a charge whose renewal was throttled wraps (the store's
	// ErrThrottled).
	Throttled error
	// Now is the sweeper's clock (default time.Now).
	Now func() time.Time
	// Rand is the source of markers, jitter and shard choices (nil: math/rand/v2's).
	Rand func() uint64
	// Gate runs the pools' goroutines one at a time (nil: as the Go scheduler runs them).
	Gate bucket.Gate
}

// Pools is a Store's lease pools. It is safe for concurrent use.
type Pools struct {
	t            Table
	m            Metrics
	errThrottled error
	now          func() time.Time
	rnd          schema.Rand
	turns        bucket.Turns

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
	created          uint64        // pools created so far: the next one's seq
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

// NewPools returns the pools of a Store; they lease through c.Table. The label values of
// c.Metrics are created at once, so that every series is exported before its first count.
func NewPools(c Config) *Pools {
	now := c.Now
	if now == nil {
		now = time.Now
	}
	for _, r := range []string{leaseGranted, leaseEmpty, leaseError} {
		c.Metrics.Renewals.WithLabelValues(r)
	}
	for _, o := range []string{unitsLeased, unitsSpent, unitsRefunded, unitsExpired, unitsUnanswered} {
		c.Metrics.Units.WithLabelValues(o)
	}
	return &Pools{
		t: c.Table, m: c.Metrics, errThrottled: c.Throttled, now: now, rnd: c.Rand, turns: bucket.Turns{G: c.Gate},
		pools: make(map[leaseKey]*pool), stop: make(chan struct{}),
	}
}

// pool is the lease state of one bucket on this Store.
type pool struct {
	ls   *Pools
	seq  uint64 // creation order (list)
	key  leaseKey
	base string // the items' key prefix
	gcra bool
	// ttl is how long a unit may be held (ns); horizon how long a lease should last at the
	// demand seen, so that it is spent well within ttl.
	ttl, horizon int64
	home         int // the shard tried first

	// give makes the pool's give-backs serial (a lock of one place): a token bucket's chunks go
	// back newest first, each conditioned on the marker the one before it left. A channel
	// rather than a sync.Mutex because it is held across calls to the table: a goroutine waiting
	// on it is durably blocked, so the simulator's fake clock (testing/synctest) can run.
	give chan struct{}

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
	t, tau, tauL int64 // GCRA: emission interval, tolerance, tolerance left to Pools (tau - ttl)
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
func (ls *Pools) pool(c bucket.Charge, n int64) (*pool, error) {
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
	ls.created++
	p.seq = ls.created
	ls.pools[k] = p
	if !ls.started {
		ls.started = true
		ls.turns.GoWG(&ls.wg, ls.sweeper)
	}
	return p, nil
}

func newPool(ls *Pools, k leaseKey, n int64) *pool {
	l, shards := k.limit, max(k.lease.Shards, 1)
	ttl := int64(bucket.LeaseTTL(l, k.lease))
	p := &pool{
		ls: ls, key: k, give: make(chan struct{}, 1), base: k.key.String(), gcra: l.Algorithm == bucket.TokenBucket,
		ttl: ttl, horizon: max(ttl/2, 1), shards: make([]shard, shards), estAt: n, lastUse: n,
		// The store's round trip so far (its warm-up reads at startup, other pools' calls):
		// the first renewal is placed and sized like the later ones.
		rtt: ls.t.RTT(),
	}
	p.rttDev = p.rtt / 2 // as RFC 6298 starts: nothing known of the spread yet
	if ls.slowForced {
		p.rtt, p.rttDev = ls.slowRTT, ls.slowDev
	}
	// Replicas start on different shards (the key's digest and this Store's address would do;
	// a random start spreads them without coordination).
	p.home = ls.rnd.IntN(shards)
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
	p.ls.m.Held.Add(float64(d))
}

// usable reports whether the pool can lease at all (a token bucket too small for its TTL is
// refused by validation; a limit from elsewhere is answered by an error, not an over-admission).
func (p *pool) usable() bool { return p.ttl > 0 }

// goTracked runs f in a goroutine that close waits for, unless close is already waiting.
func (ls *Pools) goTracked(f func()) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.draining {
		return false
	}
	ls.turns.GoWG(&ls.wg, f)
	return true
}

// Forget drops what the pools of key learnt of their shards (the console reset key's items):
// the next renewal finds out afresh.
func (ls *Pools) Forget(key bucket.Key) {
	ls.mu.Lock()
	var pools []*pool
	for lk, p := range ls.pools {
		if lk.key == key {
			pools = append(pools, p)
		}
	}
	ls.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		p.emptyUntil, p.resetAt, p.fails = 0, 0, 0
		for i := range p.shards {
			sh := &p.shards[i]
			sh.emptyUntil, sh.tat, sh.used, sh.usedIn, sh.empty = 0, 0, 0, 0, false
		}
		p.mu.Unlock()
	}
}

// Items names the items of leased charge c's pool at n, one per shard, which the console reads
// and resets.
func Items(c bucket.Charge, n int64) []string {
	l := c.Limit
	p := &pool{base: c.Key.String(), gcra: l.Algorithm == bucket.TokenBucket, key: leaseKey{key: c.Key, limit: l, lease: c.Lease}}
	pks := make([]string, max(c.Lease.Shards, 1))
	for i := range pks {
		pks[i] = p.itemKey(i, n)
	}
	return pks
}

// SetShift makes every token-bucket renewal place its first unit d past its instant, whatever
// the store's wall-clock round trip: for tests on simulated time.
func (ls *Pools) SetShift(d time.Duration) { ls.forceShift, ls.forced = int64(d), true }

// SetSlow makes every pool take rtt and dev as the store's round trip and its mean deviation,
// whatever it measures, and treat the store as slow (several renewals in flight, renewals
// placed ahead, edge drains): the slow-store paths, for tests on simulated time.
func (ls *Pools) SetSlow(rtt, dev time.Duration) {
	ls.slowRTT, ls.slowDev, ls.slowForced = int64(rtt), int64(dev), true
}

// InFlight returns the channels that close when each renewal in flight now ends, for tests that
// must not race the background renewals.
func (ls *Pools) InFlight() []<-chan struct{} {
	var done []<-chan struct{}
	// ls.mu is not held while taking p.mu: a renewal's start takes them in the other order.
	for _, p := range ls.list() {
		p.mu.Lock()
		for _, r := range p.inflight {
			done = append(done, r.done)
		}
		p.mu.Unlock()
	}
	return done
}
