package dynamo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Lease mode (see the package documentation, "Leases"): a charge whose Lease is on is answered
// from units this Store reserved from the shared item(s) in one conditional write, without a
// round trip. A pool is one (key, limit, lease) on this Store: its grants, the demand it sees,
// and its shards.

// leaseWaitMargin is how long before its deadline a request stops waiting for a renewal.
const leaseWaitMargin = 5 * time.Millisecond

// leaseMaxWaits bounds the renewals one charge waits for: renewals that other replicas keep
// racing to the units mean the pool is empty, and the charge is rejected.
const leaseMaxWaits = 3

// leaseIdle is how long a pool that has neither demand nor grants is kept, in TTLs.
const leaseIdle = 20

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
	stop       chan struct{} // closed by close: stops the sweeper
	started    bool          // the sweeper is running
	wg         sync.WaitGroup
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
	return &leasePools{s: s, now: now, pools: make(map[leaseKey]*pool), stop: make(chan struct{})}
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

	mu       sync.Mutex
	shards   []shard
	grants   []grant // live, in the order they were taken
	units    int64   // unspent units of grants
	renewing bool
	done     chan struct{} // closed when the renewal in flight ends
	waiting  int64         // requests waiting for that renewal
	err      error         // the last renewal's error, for the requests that waited for it
	// emptyUntil: no shard had a unit to lease before this instant (the last renewal found all
	// of them empty); requests until then are rejected here.
	emptyUntil int64
	resetAt    int64   // when the bucket is full again, as far as this Store knows
	rate       float64 // demand, requests per ns, smoothed over horizon
	arrivals   int64   // requests since estAt
	estAt      int64
	lastUse    int64
	rtt        int64        // smoothed round trip of a lease write
	nextID     uint64       // of the next grant
	fails      uint         // renewals in a row that found every shard empty
	lastEmpty  int64        // instant of the last renewal that found every shard empty
	throttled  atomic.Int64 // throttled calls of this pool's renewals
}

// shard is one item of a pool.
type shard struct {
	t, tau, tauL int64 // GCRA: emission interval, tolerance, tolerance left to leasePools (tau - ttl)
	count        int64 // fixed window: the shard's part of the limit
	emptyUntil   int64 // no unit before this instant
	tat          int64 // GCRA: the last tat learnt (0: unknown)
	used, usedIn int64 // fixed window: the count last learnt, and the end of its window
	empty        bool  // the last try found it empty: poll it with a read first
}

// grant is one lease: units reserved by one write, spendable until expires.
type grant struct {
	id      uint64 // unique in the pool
	shard   int
	units   int64
	at      int64 // instant of the write: a unit is never spent before it
	expires int64
	// GCRA: the tat our write left, and since, for giving units back while nobody wrote after
	// us, and tail, the place of our last unit (a drain may leave tat a fraction of T past it);
	// fixed window: the window's item.
	end, tail int64
	epoch     epoch
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

// usable reports whether the pool can lease at all (a token bucket too small for its TTL is
// refused by validation; a limit from elsewhere is answered by an error, not an over-admission).
func (p *pool) usable() bool { return p.ttl > 0 }

// take decides a leased charge: from a grant when one has a unit, else by waiting for a
// renewal, else rejected until a shard has units again.
func (ls *leasePools) take(ctx context.Context, o *op, n int64) {
	// Decisions made here without a round trip (from a grant, or rejected while the pool is
	// empty) are timed on their own: the store's decision histogram mixes them with the ones
	// that waited for a renewal.
	start, waited := time.Now(), false
	defer func() {
		if !waited && o.err == nil {
			ls.s.m.leaseLocal.Observe(time.Since(start).Seconds())
		}
	}()
	p, err := ls.pool(o.c, n)
	if err == nil && !p.usable() {
		err = fmt.Errorf("lease: %s has no room for a lease TTL", o.c.Key)
	}
	if err != nil {
		o.err = fmt.Errorf("dynamo: %w", err)
		return
	}
	o.pool = p
	cost := o.c.N()
	p.mu.Lock()
	p.arrivals += cost
	p.lastUse = max(p.lastUse, n)
	if cost > p.capacity() {
		// More than any lease can hold: validation refuses such a cost; a limit from elsewhere
		// is rejected rather than left waiting.
		o.result, o.done = bucket.Result{Limit: limitValue(p.key.limit), RetryAfter: time.Duration(p.ttl)}, true
		p.mu.Unlock()
		return
	}
	for waits := 0; ; waits++ {
		p.expire(n)
		if s, from, ok := p.spend(n, cost); ok {
			o.result, o.done, o.spent, o.spentAt = p.admitted(s), true, from, s
			p.prefetch(ctx, n)
			p.mu.Unlock()
			return
		}
		if p.emptyUntil > n || waits == leaseMaxWaits {
			o.result, o.done = p.rejected(n), true
			p.mu.Unlock()
			return
		}
		if p.fails > 0 && n-p.lastEmpty < p.horizon {
			// The last renewal found the pool empty, lately: this one polls it in the background, and
			// the requests meanwhile are rejected at once rather than held for a round trip
			// (two, with the read) that a slow store could stretch past their deadline. While
			// the pool is empty, so would one exact bucket have rejected them.
			if !p.renewing {
				p.startRenewal(ctx, n)
			}
			o.result, o.done = p.rejected(n), true
			p.mu.Unlock()
			return
		}
		p.waiting += cost // counted in the renewal's size
		if !p.renewing {
			p.startRenewal(ctx, n)
		}
		done := p.done
		p.mu.Unlock()
		// A renewal still on its way when this decision's time is almost up is not an outage:
		// the store answers, slowly, and the lease will serve the requests after this one. So
		// the request is rejected (the pool had nothing for it in time) rather than failed,
		// which would open the circuit breaker for every request. A renewal that fails is an
		// error, and follows on_error.
		waited = true
		var late <-chan time.Time
		if d, ok := ctx.Deadline(); ok {
			t := time.NewTimer(time.Until(d) - leaseWaitMargin)
			defer t.Stop()
			late = t.C
		}
		throttledBefore := p.throttled.Load()
		select {
		case <-done:
		case <-late:
			p.late(o, n, cost, throttledBefore)
			return
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The deadline, not the client: late, whichever of the two timers the
				// scheduler ran first (a waiter whose earlier renewals went to other
				// requests may come back with less than the margin left).
				p.late(o, n, cost, throttledBefore)
				return
			}
			p.mu.Lock()
			p.waiting -= cost
			p.mu.Unlock()
			o.err = fmt.Errorf("dynamo: lease %s: %w", p.base, ctx.Err())
			return
		}
		p.mu.Lock()
		p.waiting -= cost
		if p.err != nil {
			o.err = p.err
			p.mu.Unlock()
			return
		}
		// The renewal's write happened after n: a unit it granted is spent no earlier.
	}
}

// late decides a charge whose deadline came while it waited for a renewal: rejected (the pool
// had nothing for it in time) while the store answers, an error (on_error decides) when the
// renewal was throttled or the store has left a call without an answer for over a second.
func (p *pool) late(o *op, n, cost, throttledBefore int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiting -= cost
	switch {
	case p.throttled.Load() > throttledBefore:
		o.err = fmt.Errorf("dynamo: lease %s: %w: the renewal was throttled", p.base, ErrThrottled)
	case p.ls.s.live.silent():
		// The store may be down or hung, which is on_error's to decide, not a rejection's.
		o.err = fmt.Errorf("dynamo: lease %s: no answer: %w", p.base, context.DeadlineExceeded)
	default:
		o.result, o.done = p.rejected(n), true
	}
}

// takeLocal decides leased charge o from its pool's grants alone, with no call and no renewal:
// true when it could (spent from a grant, or rejected while the pool is known to be empty at n).
func (ls *leasePools) takeLocal(o *op, n int64) bool {
	ls.mu.Lock()
	p, ok := ls.pools[leaseKey{o.c.Key, o.c.Limit, o.c.Lease}]
	ls.mu.Unlock()
	if !ok || !p.usable() {
		return false
	}
	cost := o.c.N()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.arrivals += cost
	p.lastUse = max(p.lastUse, n)
	p.expire(n)
	if s, from, ok := p.spend(n, cost); ok {
		o.pool, o.result, o.done, o.spent, o.spentAt = p, p.admitted(s), true, from, s
		return true
	}
	if p.emptyUntil > n {
		o.pool, o.result, o.done = p, p.rejected(n), true
		return true
	}
	return false
}

// taken is units a charge spent from one grant.
type taken struct {
	grant uint64
	units int64
}

// spend takes k units (a charge's cost), all or none, from the oldest grants that have them, at
// instant n or, if later, the write of the newest grant used. It returns that instant and the
// units taken from each grant.
func (p *pool) spend(n, k int64) (int64, []taken, bool) {
	var live int64
	for i := range p.grants {
		if g := &p.grants[i]; g.units > 0 && max(n, g.at) <= g.expires {
			live += g.units
		}
	}
	if live < k {
		return 0, nil, false
	}
	var from []taken
	s := n
	for i := range p.grants {
		g := &p.grants[i]
		if k == 0 {
			break
		}
		if g.units == 0 || max(n, g.at) > g.expires {
			continue
		}
		u := min(g.units, k)
		g.units -= u
		p.units -= u
		k -= u
		s = max(s, g.at)
		from = append(from, taken{g.id, u})
	}
	return s, from, true
}

// giveBack returns units that spend took, when the group they were part of was rejected: they
// were never used, so each grant may spend them again. Only to its own grant: another may expire
// later than a unit may be held. A grant already expired keeps them (lost, which is stricter).
func (p *pool) giveBack(from []taken, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range from {
		for i := range p.grants {
			if g := &p.grants[i]; g.id == t.grant && n <= g.expires {
				g.units += t.units
				p.units += t.units
				break
			}
		}
	}
}

// admitted is the result of a charge spent at s. Remaining is what this Store still holds.
func (p *pool) admitted(s int64) bucket.Result {
	return bucket.Result{
		Allowed:   true,
		Limit:     limitValue(p.key.limit),
		Remaining: p.units,
		Reset:     time.Duration(max(0, p.resetAt-s)),
	}
}

// rejected is the result of a charge at n while every shard is empty.
func (p *pool) rejected(n int64) bucket.Result {
	wait := time.Duration(max(p.emptyUntil-n, int64(time.Millisecond)))
	if !p.gcra {
		// Every shard was full: one exact window would say "when it ends" too.
		wait = time.Duration(max(fixedEnd(p.key.limit, n)-n, int64(wait)))
	}
	return bucket.Result{
		Limit:      limitValue(p.key.limit),
		RetryAfter: wait,
		Reset:      max(wait, time.Duration(p.resetAt-n)),
	}
}

// expire drops the grants past their TTL at n; their unspent units are given back to the
// table where that is still exact (see refundGrant). A spent grant stays until it expires, so
// that a unit of a rejected group can still go back to it (giveBack).
func (p *pool) expire(n int64) {
	keep := p.grants[:0]
	for _, g := range p.grants {
		switch {
		case g.expires >= n:
			keep = append(keep, g)
		case g.units > 0:
			p.units -= g.units
			p.refundLater(g)
		}
	}
	clear(p.grants[len(keep):])
	p.grants = keep
}

// live is the units that can still be spent after the next round trip.
func (p *pool) live(n int64) int64 {
	var u int64
	for _, g := range p.grants {
		if g.expires > n+2*p.rtt {
			u += g.units
		}
	}
	return u
}

// prefetch starts a renewal when the units that outlive the next round trip would last less
// than about two round trips at the demand seen, so that a steady stream never waits.
func (p *pool) prefetch(ctx context.Context, n int64) {
	if p.renewing || p.emptyUntil > n {
		return
	}
	low := int64(math.Ceil(p.rate*float64(2*p.rtt+int64(time.Millisecond)))) + 1
	if p.live(n) <= low && p.anyReady(n, max(1, p.want(n)/2)) {
		p.startRenewal(ctx, n)
	}
}

// estimate updates the demand rate with the arrivals since the last estimate.
func (p *pool) estimate(n int64) {
	dt := n - p.estAt
	if dt <= 0 {
		return
	}
	inst := float64(p.arrivals) / float64(dt)
	// A time constant of a quarter horizon follows a replica whose load doubles within a few
	// renewals, and forgets a burst as fast.
	a := 1 - math.Exp(-4*float64(dt)/float64(p.horizon))
	p.rate += a * (inst - p.rate)
	p.arrivals, p.estAt = 0, n
}

// want is the size of the next lease: the demand over one horizon, plus the requests already
// waiting, at least one, and no more than a shard can ever hold.
func (p *pool) want(n int64) int64 {
	p.estimate(n)
	// A lease should last half its lifetime, and at least two round trips of a slow store
	// (while the next one is on its way), never past its lifetime.
	life := p.lifetime(n)
	horizon := min(max(life/2, 2*p.rtt), life)
	w := int64(math.Ceil(p.rate*float64(horizon))) + p.waiting
	return max(1, min(w, p.capacity()))
}

// lifetime is how long the units of a lease taken at n from the home shard can be held, as far
// as this Store knows that shard: a lease's units may be spent until its first unit's place
// (max(tat, n)) plus the TTL, so a drained bucket, whose tat runs ahead of now, gives long
// leases, and an idle one leases of exactly the TTL. Half of it is the horizon a lease is
// sized for, so that it is spent well before it expires.
func (p *pool) lifetime(n int64) int64 {
	if !p.gcra {
		// A window's units die with it: near its end a lease is sized for what is left.
		return max(min(p.ttl, fixedEnd(p.key.limit, n)-n), 1)
	}
	return max(p.shards[p.home].tat-n, 0) + p.ttl
}

// capacity is the most one lease can take from the smallest shard.
func (p *pool) capacity() int64 {
	sh := &p.shards[len(p.shards)-1]
	if p.gcra {
		return max(1, sh.tauL/sh.t)
	}
	return max(1, sh.count)
}

// startRenewal starts one lease write in the background (the caller holds p.mu). It runs under
// the deadline of the decision that needed it, not its cancellation: other requests may come to
// wait for it.
func (p *pool) startRenewal(ctx context.Context, n int64) {
	p.renewing, p.err = true, nil
	p.done = make(chan struct{})
	want := p.want(n)
	shift := p.shift()
	// Not derived from ctx: the renewal outlives the Take that started it, and a caller may
	// recycle its context once Take returns (the proxy's does). Its deadline is longer than the
	// decision's: a store slower than store.timeout fails the requests waiting for the renewal
	// (they follow on_error), but the lease it brings back still serves the next ones.
	budget := renewTimeout
	if d, ok := ctx.Deadline(); ok {
		budget = max(renewSlack*time.Until(d), renewFloor)
	}
	rctx, cancel := context.WithTimeout(context.Background(), budget)
	rctx = context.WithValue(rctx, throttleCounter{}, &p.throttled)
	if !p.ls.goTracked(func() {
		defer cancel()
		p.renew(rctx, n, want, shift)
	}) {
		cancel()
		p.renewing, p.err = false, fmt.Errorf("dynamo: lease %s: %w", p.base, errLeasesClosed)
		close(p.done)
	}
}

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

// shift is how far past the decision's instant a token bucket's renewal places its first unit
// (the caller holds p.mu): the store's smoothed round trip, at most half of what a lease may
// span. A unit may be held ttl past its place, so a lease taken from an idle bucket whose answer
// takes longer than ttl would arrive with its first units dead, and a store that stays that
// slow would never lease anything usable; placed a round trip later, the lease arrives alive.
// The places skipped are lost, which costs an idle bucket a round trip of its refill, and a
// drained one (tat already ahead) nothing. Exact: see leaseGCRA.
func (p *pool) shift() int64 {
	if !p.gcra {
		return 0
	}
	if p.ls.forced {
		return p.ls.forceShift
	}
	return min(p.rtt, p.shards[len(p.shards)-1].tauL/2)
}

// renew takes a lease of up to want units from the first shard that has some, starting at
// home, and publishes it. It ends the renewal.
func (p *pool) renew(ctx context.Context, n, want, shift int64) {
	start := time.Now() // a round trip: wall-clock time whatever the decisions' instants
	g, err := p.lease(ctx, n, want, shift)
	rtt := int64(time.Since(start))
	p.mu.Lock()
	defer p.mu.Unlock()
	if rtt > 0 {
		if p.rtt == 0 {
			p.rtt = rtt
		} else {
			p.rtt += (rtt - p.rtt) / 4
		}
	}
	switch {
	case err != nil:
		p.err = fmt.Errorf("dynamo: lease %s: %w", p.base, err)
		p.ls.s.m.leases.WithLabelValues(leaseError).Inc()
	case g == nil:
		p.fails++
		p.lastEmpty = max(p.lastEmpty, n)
		p.ls.s.m.leases.WithLabelValues(leaseEmpty).Inc()
	default:
		p.grants = append(p.grants, *g)
		p.units += g.units
		p.emptyUntil, p.fails = 0, 0
		p.ls.s.m.leases.WithLabelValues(leaseGranted).Inc()
		p.ls.s.m.leaseUnits.WithLabelValues(unitsLeased).Add(float64(g.units))
	}
	p.renewing = false
	close(p.done)
}

// lease makes the conditional writes of one renewal. A nil grant and nil error mean every shard
// is empty; then p.emptyUntil says until when.
func (p *pool) lease(ctx context.Context, n, want, shift int64) (*grant, error) {
	least := max(1, want/2)
	// The home shard first, then at most one other that may have room, picked at random:
	// replicas spread over the shards and stay, so that a shard is polled by few of them, and a
	// replica whose own shard ran dry while others have room still moves.
	p.mu.Lock()
	order := make([]int, 0, 2)
	if p.ready(p.home, n, least) {
		order = append(order, p.home)
	}
	var others []int
	for i := range p.shards {
		if i != p.home && p.ready(i, n, least) {
			others = append(others, i)
		}
	}
	if len(others) > 0 {
		order = append(order, others[rand.IntN(len(others))])
	}
	p.mu.Unlock()
	for _, i := range order {
		g, err := p.leaseShard(ctx, i, n, want, shift)
		if err != nil || g != nil {
			if g != nil {
				p.mu.Lock()
				p.home = i // stay where there was room
				p.mu.Unlock()
			}
			return g, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Empty until the first shard may have room again: a shard that may have room now is
	// tried by the next renewal, one never tried no sooner than an eighth of a horizon from
	// now, so that exploring the shards costs a few writes per horizon, not one per request.
	until := int64(math.MaxInt64)
	for i := range p.shards {
		sh := &p.shards[i]
		e := sh.emptyUntil
		switch avail := sh.known(p, n); {
		case e > n:
		case avail == unknown && sh.tat == 0 && sh.usedIn == 0:
			e = n + p.horizon/8
		case avail != unknown && avail < least:
			e = sh.refilled(p, n, least)
		}
		until = min(until, e)
	}
	p.emptyUntil = max(until, n+1)
	return nil, nil
}

// ready reports whether shard i may hold least units at n: its wait after the last time it was
// found empty is over, and what this Store last learnt of it (others only take from a shard, so
// that is an upper bound) leaves room. The caller holds p.mu.
func (p *pool) ready(i int, n, least int64) bool {
	sh := &p.shards[i]
	if sh.emptyUntil > n {
		return false
	}
	if !p.gcra {
		// A window's count only goes up, except when another replica gives units back: then
		// nothing refills it before the window ends, so it is polled again after the wait.
		return true
	}
	avail := sh.known(p, n)
	return avail == unknown || avail >= least
}

// anyReady reports whether some shard may hold least units at n (the caller holds p.mu).
func (p *pool) anyReady(n, least int64) bool {
	for i := range p.shards {
		if p.ready(i, n, least) {
			return true
		}
	}
	return false
}

// leaseShard leasePools from shard i: want units if the shard has that many, else all it has if
// that is at least half of want (a smaller lease would cost a write for a few requests; they are
// rejected until that much has refilled instead, which is no loss while the demand exceeds the
// rate). nil, nil: the shard is empty until its emptyUntil.
func (p *pool) leaseShard(ctx context.Context, i int, n, want, shift int64) (*grant, error) {
	p.mu.Lock()
	sh := p.shards[i]
	p.mu.Unlock()
	// The floor of the lease's places: want units must still fit above it (n + tauL).
	f := n
	if p.gcra {
		f = n + max(0, min(shift, sh.tauL-want*sh.t))
	}
	pk := p.itemKey(i, n)
	least := max(1, want/2)
	// What the shard holds as far as we know picks the first form; a failed condition tells
	// what it holds, and the next form fits that.
	avail := sh.known(p, n)
	if sh.empty {
		// The shard was empty when last tried, and other replicas poll it too: a read, which
		// neither takes the item's write capacity nor costs a write, tells whether a write
		// would find least units, before one is sent.
		item, err := p.ls.s.readItems(ctx, []string{pk})
		if err != nil {
			return nil, err
		}
		a, err := p.learn(&sh, item[pk], n, f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", pk, err)
		}
		if avail = a; avail < least {
			p.emptied(i, &sh, n, least)
			return nil, nil
		}
	}
	for round := 0; round < 3; round++ {
		fm := p.leaseForm(&sh, n, f, want, least, avail)
		out, err := p.ls.s.updateItem(ctx, opLease, pk, fm.u, fm.rv)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return p.granted(i, pk, n, fm, out.Attributes)
		case errors.As(err, &ccf):
			a, ferr := p.learn(&sh, ccf.Item, n, f)
			if ferr != nil {
				return nil, fmt.Errorf("update %s: %w", pk, ferr)
			}
			if avail = a; avail >= least {
				continue
			}
			p.emptied(i, &sh, n, least)
			return nil, nil
		default:
			p.ls.s.m.errors.WithLabelValues(opLease).Inc()
			return nil, fmt.Errorf("update %s: %w", pk, err)
		}
	}
	return nil, nil // raced three times: the next renewal tries again
}

// emptied records that shard i (as learnt into sh) held fewer than least units at n, and when
// to try it again. Replicas polling the same shard would come back when the same units have
// refilled, and all but one find it empty again. So each waits a random extra time that doubles
// with every renewal that found the pool empty in a row (full jitter, at most four horizons):
// with more replicas contending, each polls less often. While demand exceeds the rate that
// capacity is not lost (another replica leases it), and the bound keeps a shard from filling up
// unseen for long.
func (p *pool) emptied(i int, sh *shard, n, least int64) {
	at := sh.refilled(p, n, least)
	spread := min(max(at-n, p.horizon/16)<<min(p.fails, 10), 4*p.horizon)
	until := at + rand.Int64N(max(spread, 1))
	if !p.gcra {
		until = min(until, fixedEnd(p.key.limit, n))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.shards[i]
	s.tat, s.used, s.usedIn = sh.tat, sh.used, sh.usedIn
	s.emptyUntil, s.empty = until, true
}

// itemKey is shard i's item at n: leased items are apart from the unleased ones, so that
// switching a policy's lease mode never mixes the two arithmetics on one item.
func (p *pool) itemKey(i int, n int64) string {
	sfx := "#l" + strconv.Itoa(i)
	if p.gcra {
		return p.base + "#g" + sfx
	}
	l := p.key.limit
	return p.base + "#w" + strconv.FormatInt(fixedEnd(l, n)-int64(l.Window), 10) + sfx
}

// form is one lease write: its update, what it returns, and how to read the units it took.
type form struct {
	u     update
	rv    types.ReturnValue
	drain bool  // took everything up to target: units = target - old (ALL_OLD)
	m     int64 // otherwise: exactly m units (ALL_NEW)
	// target is where a drain leaves tat (GCRA) or the count (window).
	target int64
}

// unknown marks a shard whose content is not known.
const unknown = -1

// known is how many units the shard holds at n as far as this Store knows, or unknown.
func (sh *shard) known(p *pool, n int64) int64 {
	if p.gcra {
		if sh.tat < n {
			return unknown // idle, or never seen: an idle write finds out
		}
		return max(0, (n+sh.tauL-sh.tat)/sh.t)
	}
	if start := fixedEnd(p.key.limit, n); sh.usedIn != start {
		return unknown
	}
	return max(0, sh.count-sh.used)
}

// refilled is when the shard will hold u units again if nobody else leasePools from it: for a
// window, when it ends, or sooner if another replica gives units back, which a poll after a
// short wait finds (the wait then grows while the window stays full).
func (sh *shard) refilled(p *pool, n, u int64) int64 {
	if p.gcra {
		return max(n+1, sh.tat+u*sh.t-sh.tauL)
	}
	return min(fixedEnd(p.key.limit, n), n+p.horizon/16)
}

// leaseForm picks the write for a shard holding avail units (or unknown). A token bucket's
// units must sit within n + tauL, so that each can be held ttl after the write and still conform
// when spent (see the package documentation); a window's within the shard's count.
//
//   - want fits, or nothing is known: exactly want units (GCRA form (a) when idle, (b) when
//     not; window ADD want);
//   - fewer than want but at least least: a drain, which takes every unit the shard holds
//     (GCRA SET tat = the last place that fits, on tat's grid of T; window SET count = the
//     shard's count) while that is from least to want units, in one write whatever others
//     took since we looked.
func (p *pool) leaseForm(sh *shard, n, f, want, least, avail int64) form {
	drain := avail != unknown && avail < want
	if p.gcra {
		if !drain || sh.tat < f {
			return form{u: leaseGCRA(n, f, sh.t, sh.tauL, want, sh.tat >= f), rv: types.ReturnValueAllNew, m: want}
		}
		target := sh.tat + (n+sh.tauL-sh.tat)/sh.t*sh.t
		return form{drain: true, target: target, rv: types.ReturnValueAllOld, u: update{
			expr:   "SET #tat = :target, #ttl = :ttl",
			cond:   "#tat >= :floor AND #tat <= :most AND #tat >= :fewest",
			names:  map[string]string{"#tat": attrTat, "#ttl": attrTTL},
			values: map[string]types.AttributeValue{":target": num(target), ":floor": num(f), ":most": num(target - least*sh.t), ":fewest": num(target - want*sh.t), ":ttl": ttlAt(n + sh.tau)},
		}}
	}
	ttl := ttlAt(fixedEnd(p.key.limit, n))
	if !drain {
		return form{u: countWrite(sh.count, want, ttl, false), rv: types.ReturnValueAllNew, m: want}
	}
	return form{drain: true, target: sh.count, rv: types.ReturnValueAllOld, u: update{
		expr:   "SET #count = :target, #ttl = :ttl",
		cond:   "#count <= :most AND #count >= :fewest",
		names:  map[string]string{"#count": attrCount, "#ttl": attrTTL},
		values: map[string]types.AttributeValue{":target": num(sh.count), ":most": num(sh.count - least), ":fewest": num(sh.count - want), ":ttl": ttl},
	}}
}

// learn reads a failed lease condition's item (as it was) into sh and returns how many units
// a lease at n can take from it above the floor f.
func (p *pool) learn(sh *shard, old map[string]types.AttributeValue, n, f int64) (int64, error) {
	if p.gcra {
		tat, ok, err := number(old, attrTat)
		if err != nil {
			return 0, err
		}
		if !ok || tat < n {
			sh.tat = 0
		} else {
			sh.tat = tat
		}
		return max(0, (n+sh.tauL-max(tat, f))/sh.t), nil
	}
	c, _, err := number(old, attrCount)
	if err != nil {
		return 0, err
	}
	sh.used, sh.usedIn = c, fixedEnd(p.key.limit, n)
	return max(sh.count-c, 0), nil
}

// granted builds the grant of lease write f, applied at n, from the item it returned.
func (p *pool) granted(i int, pk string, n int64, f form, item map[string]types.AttributeValue) (*grant, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sh := &p.shards[i]
	p.nextID++
	g := &grant{id: p.nextID, shard: i, at: n, pk: pk}
	if p.gcra {
		tat, ok, err := number(item, attrTat)
		if err != nil || !ok {
			return nil, fmt.Errorf("update %s: no tat in the write's answer (%v)", pk, err)
		}
		var base int64 // the place before the first unit: max(old tat, n)
		if f.drain {
			// item is the old one: units sit at tat+T, ..., tat+units*T <= target.
			g.units = (f.target - tat) / sh.t
			base, g.end = tat, f.target
			g.tail = tat + g.units*sh.t
			g.epoch, _ = epochOf(item)
		} else {
			g.units, base, g.end, g.tail = f.m, tat-f.m*sh.t, tat, tat
			g.epoch, _ = epochOf(item)
		}
		sh.tat = g.end
		// Unit j sits at base + j*T and may be spent until its place - T + ttl, so all of
		// them until base + ttl.
		g.expires = base + p.ttl
		p.resetAt = max(p.resetAt, g.end)
	} else {
		end := fixedEnd(p.key.limit, n)
		c, _, err := number(item, attrCount)
		if err != nil {
			return nil, fmt.Errorf("update %s: %w", pk, err)
		}
		if f.drain {
			g.units, sh.used = f.target-c, f.target
		} else {
			g.units, sh.used = f.m, c
		}
		sh.usedIn = end
		g.expires = min(end-1, n+p.ttl)
		p.resetAt = max(p.resetAt, end)
	}
	sh.emptyUntil, sh.empty = 0, false
	return g, nil
}

// refundLater gives g's unspent units back in the background (the caller holds p.mu and has
// taken them out of the pool).
func (p *pool) refundLater(g grant) {
	if !p.ls.goTracked(func() {
		ctx, cancel := context.WithTimeout(context.Background(), refundTimeout)
		defer cancel()
		p.refundGrant(ctx, g)
	}) {
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
	}
}

// A renewal runs for renewSlack times what the decision that started it had left, at least
// renewFloor; renewTimeout when the decision had no deadline.
const (
	renewSlack   = 4
	renewFloor   = time.Second
	renewTimeout = 2 * time.Second
)

// refundTimeout bounds a background refund of a lease.
const refundTimeout = 2 * time.Second

// refundGrant gives g's unspent units back to its item. A window's units are taken off its count
// (ADD -m on the window's own item: exact at any time). A token bucket's units are the last m
// places before g.end: they are given back only while tat is still g.end (nobody leased after
// us; since unchanged), by setting tat to g.end - m*T, exactly as if they had never been leased.
// Otherwise other leasePools sit after them and moving tat back would hand their places out twice;
// the units are then lost (counted as expired), which costs the pool capacity, never exactness.
func (p *pool) refundGrant(ctx context.Context, g grant) {
	var u update
	if p.gcra {
		t := p.shards[g.shard].t // immutable after newPool
		u = update{
			expr:   "SET #tat = :to",
			cond:   "#tat = :end AND attribute_not_exists(#since)",
			names:  map[string]string{"#tat": attrTat, "#since": attrSince},
			values: map[string]types.AttributeValue{":to": num(g.tail - g.units*t), ":end": num(g.end)},
		}
		if g.epoch.present {
			u.cond = "#tat = :end AND #since = :since"
			u.values[":since"] = num(g.epoch.v)
		}
	} else {
		u = update{
			expr:   "ADD #count :minus",
			cond:   "attribute_exists(#count)",
			names:  map[string]string{"#count": attrCount},
			values: map[string]types.AttributeValue{":minus": num(-g.units)},
		}
	}
	// The GCRA refund is conditional on the value it replaces, so a retry cannot apply twice;
	// the window's ADD is not, so it gets one attempt (throttling aside: a throttled write was
	// not applied).
	var err error
	if p.gcra {
		_, err = p.ls.s.updateItem(ctx, opLeaseRefund, g.pk, u, types.ReturnValueNone)
	} else {
		_, err = p.ls.s.updateItem(ctx, opLeaseRefund, g.pk, u, types.ReturnValueNone, noRetry)
	}
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		p.ls.s.m.leaseUnits.WithLabelValues(unitsRefunded).Add(float64(g.units))
		if p.gcra {
			p.mu.Lock()
			if sh := &p.shards[g.shard]; sh.tat == g.end {
				sh.tat = g.tail - g.units*sh.t
			}
			p.mu.Unlock()
		}
	case errors.As(err, &ccf):
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
	default:
		p.ls.s.m.errors.WithLabelValues(opLeaseRefund).Inc()
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
	}
}

// sweeper gives back the units of pools that stopped seeing demand (a policy reloaded away, a
// client gone quiet) before their grants expire, and forgets pools idle for long.
func (ls *leasePools) sweeper() {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ls.stop:
			return
		case <-tick.C:
			ls.sweep(ls.now().UnixNano())
		}
	}
}

// sweepEvery is how often the sweeper looks at the pools.
const sweepEvery = 25 * time.Millisecond

// sweep is one pass of the sweeper at instant n.
func (ls *leasePools) sweep(n int64) {
	for _, p := range ls.list() {
		p.mu.Lock()
		p.expire(n)
		// Requests waiting for a slow renewal are demand, not idleness: their grant must not
		// be given back before they wake to spend it. A TTL without a request is idleness.
		idle := p.waiting == 0 && !p.renewing && n-p.lastUse > p.ttl
		if idle && p.units > 0 {
			p.releaseAll()
		}
		forget := n-p.lastUse > leaseIdle*max(p.ttl, int64(time.Second)) && len(p.grants) == 0 && !p.renewing
		p.mu.Unlock()
		if forget {
			ls.mu.Lock()
			if ls.pools[p.key] == p {
				delete(ls.pools, p.key)
			}
			ls.mu.Unlock()
		}
	}
}

// list returns the pools as they are now.
func (ls *leasePools) list() []*pool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	pools := make([]*pool, 0, len(ls.pools))
	for _, p := range ls.pools {
		pools = append(pools, p)
	}
	return pools
}

// releaseAll takes every grant out of the pool and gives its units back (the caller holds p.mu).
func (p *pool) releaseAll() {
	for _, g := range p.grants {
		if g.units > 0 {
			p.units -= g.units
			p.refundLater(g)
		}
	}
	clear(p.grants)
	p.grants = p.grants[:0]
}

// close stops the sweeper, waits for the renewals in flight and gives every unspent unit back,
// bounded by ctx. Leased charges after it fail.
func (ls *leasePools) close(ctx context.Context) error {
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return nil
	}
	ls.closed = true
	close(ls.stop)
	ls.mu.Unlock()
	pools := ls.list() // complete: no pool is created once closed
	for _, p := range pools {
		p.mu.Lock()
		p.releaseAll()
		p.mu.Unlock()
	}
	ls.mu.Lock()
	ls.draining = true
	ls.mu.Unlock()
	done := make(chan struct{})
	go func() {
		ls.wg.Wait()
		// Renewals that were in flight may have added grants since.
		for _, p := range pools {
			p.mu.Lock()
			grants := p.grants
			p.grants, p.units = nil, 0
			p.mu.Unlock()
			for _, g := range grants {
				if g.units > 0 {
					rctx, cancel := context.WithTimeout(context.Background(), refundTimeout)
					p.refundGrant(rctx, g)
					cancel()
				}
			}
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("dynamo: close: giving leasePools back: %w", ctx.Err())
	}
}
