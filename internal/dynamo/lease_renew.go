package dynamo

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Renewal: one background lease write per pool at a time, over the shards that may have room.

// A renewal runs for renewSlack times what the decision that started it had left, at least
// renewFloor; renewTimeout when the decision had no deadline.
const (
	renewSlack   = 4
	renewFloor   = time.Second
	renewTimeout = 2 * time.Second
)

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
	// At least renewSlack measured round trips (rto, a high percentile): a renewal cut short
	// on a slow store brings nothing, and, sent once, may leave its units to no one.
	budget := max(renewTimeout, renewSlack*time.Duration(p.rto()))
	if d, ok := ctx.Deadline(); ok {
		budget = max(renewSlack*time.Until(d), renewFloor, renewSlack*time.Duration(p.rto()))
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

// renew takes a lease of up to want units from the first shard that has some, starting at
// home, and publishes it. It ends the renewal.
func (p *pool) renew(ctx context.Context, n, want, shift int64) {
	start := time.Now() // a round trip: wall-clock time whatever the decisions' instants
	g, err := p.lease(ctx, n, want, shift)
	rtt := int64(time.Since(start))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sample(rtt)
	switch {
	case err != nil:
		p.err = fmt.Errorf("dynamo: lease %s: %w", p.base, err)
		p.ls.s.m.leases.WithLabelValues(leaseError).Inc()
	case g == nil:
		p.fails++
		p.lastEmpty = max(p.lastEmpty, n)
		p.ls.s.m.leases.WithLabelValues(leaseEmpty).Inc()
	default:
		p.grants = append(p.grants, p.chunks(*g)...)
		p.hold(g.units)
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
	least := p.least(want)
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
