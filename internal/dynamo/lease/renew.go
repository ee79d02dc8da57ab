package lease

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// Renewal: background lease writes, several in flight per pool on a slow store, each over the
// shards that may have room.

// A renewal runs for renewSlack times what the decision that started it had left, at least
// renewFloor; renewTimeout when the decision had no deadline.
const (
	renewSlack   = 4
	renewFloor   = time.Second
	renewTimeout = 2 * time.Second
)

// leaseMaxInflight bounds the renewals of one pool in flight at a time on a slow store (see
// slow; on a fast one, one at a time keeps up, and writes fewer, smaller leases). One at a
// time cannot keep a token bucket's schedule leased when the round trip is a large part of its
// burst time (tau): a place may only be leased within tau - ttl of it and must arrive before it
// dies, so on a store that answers in 20 to 320 ms with tau = 500 ms a replica that waits for
// each answer before it asks again leaves most places to expire unleased. Several in flight,
// started a fraction of a round trip apart (see gap), lease the schedule as it refills whatever
// the round trip; the bound keeps a replica's writes per second in check.
const leaseMaxInflight = 6

// renewal is one background lease write of a pool and the requests waiting for it.
type renewal struct {
	done    chan struct{} // closed when it ends
	err     error         // set before done closes: its error, for the requests that waited
	want    int64         // units it asked for
	waiting int64         // units the requests waiting for it need
	at      int64         // the instant it leases as of: its units are spent no earlier
}

// renewing reports whether a renewal is in flight (the caller holds p.mu).
func (p *pool) renewing() bool { return len(p.inflight) > 0 }

// gap is the least time between the starts of two renewals in flight together: the round trip a
// renewal is expected to stay within over the renewals that may be in flight, so that their
// answers arrive spread over the round trip.
func (p *pool) gap() int64 { return p.rto() / int64(p.maxInflight()) }

// maxInflight is how many renewals the pool may have in flight now (the caller holds p.mu): on a
// slow store, four per time a place stays leasable (tau - ttl) that the round trip (rto) spans,
// at most leaseMaxInflight, so that a renewal goes out about every quarter of that time whatever
// the round trip; one on a fast store.
func (p *pool) maxInflight() int {
	if !p.slow() {
		return 1
	}
	span := max(p.shards[len(p.shards)-1].tauL, 1)
	return int(min(max((4*p.rto()+span-1)/span, 1), leaseMaxInflight))
}

// startRenewal starts one lease write in the background (the caller holds p.mu) and returns
// it. It runs under the deadline of the decision that needed it, not its cancellation: other
// requests may come to wait for it.
//
// ahead is for a renewal that nobody waits for (prefetch): it is placed as if made a round trip
// later (see leadTime), at r.at, and its units are spent from then on.
func (p *pool) startRenewal(ctx context.Context, n int64, ahead bool) *renewal {
	r := &renewal{done: make(chan struct{}), at: n}
	if ahead {
		r.at += p.leadTime()
	}
	shift := p.shift(r.at - n)
	r.want = p.want(n)
	if room := p.fits(shift); p.gcra && room >= 1 {
		r.want = min(r.want, room) // as leaseShard cuts it: what requests may wait for
	}
	p.inflight = append(p.inflight, r)
	p.lastStart = n
	// Not derived from ctx: the renewal outlives the Take that started it, and a caller may
	// recycle its context once Take returns (the proxy's does). Its deadline is longer than the
	// decision's: a store slower than store.timeout fails the requests waiting for the renewal
	// (they follow on_error), but the lease it brings back still serves the next ones.
	// At least renewSlack measured round trips (rto, a high percentile): a renewal cut short
	// on a slow store brings nothing, and, sent once, may leave its units to no one.
	budget := max(renewTimeout, renewSlack*time.Duration(p.rto()))
	if d, ok := ctx.Deadline(); ok {
		budget = max(renewSlack*time.Until(d), renewFloor, renewSlack*time.Duration(p.rto()))
	}
	rctx, cancel := context.WithTimeout(context.Background(), budget)
	rctx = p.ls.t.CountThrottles(rctx, &p.throttled)
	if !p.ls.goTracked(func() {
		defer cancel()
		p.renew(rctx, r, shift)
	}) {
		cancel()
		p.finish(r, fmt.Errorf("dynamo: lease %s: %w", p.base, errLeasesClosed))
	}
	return r
}

// finish ends renewal r with err (the caller holds p.mu).
func (p *pool) finish(r *renewal, err error) {
	p.inflight = slices.DeleteFunc(p.inflight, func(x *renewal) bool { return x == r })
	r.err = err
	close(r.done)
}

// renew takes a lease of up to r.want units from the first shard that has some, as of r.at, and
// publishes it. It ends the renewal.
func (p *pool) renew(ctx context.Context, r *renewal, shift int64) {
	n := r.at
	g, err := p.lease(ctx, n, r.want, shift)
	p.mu.Lock()
	defer p.mu.Unlock()
	var got int64
	switch {
	case err != nil:
		err = fmt.Errorf("dynamo: lease %s: %w", p.base, err)
		p.ls.m.Renewals.WithLabelValues(leaseError).Inc()
	case g == nil:
		p.fails++
		p.lastEmpty = max(p.lastEmpty, n)
		p.ls.m.Renewals.WithLabelValues(leaseEmpty).Inc()
	default:
		got = g.units
		p.grants = append(p.grants, p.chunks(*g)...)
		p.hold(g.units)
		p.emptyUntil, p.fails = 0, 0
		p.ls.m.Renewals.WithLabelValues(leaseGranted).Inc()
		p.ls.m.Units.WithLabelValues(unitsLeased).Add(float64(g.units))
	}
	// What a renewal brings, smoothed: the renewals in flight are counted at that much (see
	// prefetch), not at what they asked for, which a contended shard seldom has.
	p.yield += (float64(got) - p.yield) / 4
	p.finish(r, err)
}

// lease makes the conditional writes of one renewal. A nil grant and nil error mean every shard
// is empty; then p.emptyUntil says until when.
func (p *pool) lease(ctx context.Context, n, want, shift int64) (*grant, error) {
	// A window's home shard first, then at most one other that may have room, picked at
	// random: replicas spread over the shards and stay, so that a shard is polled by few of
	// them, and a replica whose own shard ran dry while others have room still moves. A token
	// bucket's shards refill: the one this Store knows least recently (the most room, as far as
	// it knows) first, so that each replica's renewals go round the shards, and every shard is
	// leased within the time its places stay leasable however many replicas share it. A shard
	// that another of this pool's renewals is writing comes last: what this Store knows of it is
	// about to change, and two of its own writes racing on one item would fail each other's
	// condition.
	p.mu.Lock()
	least := p.least(want, shift)
	var order, others []int
	if p.ready(p.home, n, least) {
		order = append(order, p.home)
	}
	for i := range p.shards {
		if i != p.home && p.ready(i, n, least) {
			others = append(others, i)
		}
	}
	p.ls.rnd.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	order = append(order, others...)
	if p.gcra {
		room := func(i int) int64 {
			if a := p.shards[i].known(p, n); a != unknown {
				return a
			}
			return math.MaxInt64
		}
		slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(room(j), room(i)) })
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(p.shards[i].busy, p.shards[j].busy) })
	order = order[:min(2, len(order))] // exploring costs a write a shard
	p.mu.Unlock()
	for _, i := range order {
		p.mu.Lock()
		p.shards[i].busy++
		p.mu.Unlock()
		g, err := p.leaseShard(ctx, i, n, want, least, shift)
		p.mu.Lock()
		p.shards[i].busy--
		if g != nil {
			p.home = i // stay where there was room
		}
		p.mu.Unlock()
		if err != nil || g != nil {
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

// emptied records that shard i (as learnt into sh) held fewer than least units at n, and when
// to try it again. Replicas polling the same shard would come back when the same units have
// refilled, and all but one find it empty again. So each waits a random extra time that doubles
// with every renewal that found the pool empty in a row (full jitter, at most four horizons):
// with more replicas contending, each polls less often. While demand exceeds the rate that
// capacity is not lost (another replica leases it), and the bound (four horizons; for a token
// bucket at most half the time a place stays leasable) keeps a shard from filling up unseen for
// long.
func (p *pool) emptied(i int, sh *shard, n, least int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := sh.refilled(p, n, least)
	most := 4 * p.horizon
	if p.gcra {
		// A token bucket's place may be leased only from tau - ttl before it until a round
		// trip (the shift) before it dies: a shard left unpolled for longer than half that
		// window loses the places that refilled meanwhile, which no other replica may take
		// either when it too backs off.
		most = min(most, max((sh.tauL-p.shift(0))/2, 1))
	}
	spread := min(max(at-n, p.horizon/16)<<min(p.fails, 10), most)
	until := at + p.ls.rnd.Int64N(max(spread, 1))
	if !p.gcra {
		until = min(until, windowEnd(p.key.limit, n))
	}
	s := &p.shards[i]
	s.tat, s.used, s.usedIn = sh.tat, sh.used, sh.usedIn
	s.emptyUntil, s.empty = until, true
}
