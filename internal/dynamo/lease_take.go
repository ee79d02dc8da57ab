package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Spending: a leased charge decided from the units this Store holds, waiting for a renewal
// only when none is left.

// leaseWaitMargin is how long before its deadline a request stops waiting for a renewal.
const leaseWaitMargin = 5 * time.Millisecond

// leaseMaxWaits bounds the renewals one charge waits for: renewals that other replicas keep
// racing to the units mean the pool is empty, and the charge is rejected.
const leaseMaxWaits = 3

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
	var p *pool
	for {
		var err error
		p, err = ls.pool(o.c, n)
		if err == nil && !p.usable() {
			err = fmt.Errorf("lease: %s has no room for a lease TTL", o.c.Key)
		}
		if err != nil {
			o.err = fmt.Errorf("dynamo: %w", err)
			return
		}
		p.mu.Lock()
		if !p.forgotten {
			break
		}
		p.mu.Unlock() // the sweeper removed it meanwhile: a new one takes its place
	}
	o.pool = p
	cost := o.c.N()
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
	if p.forgotten {
		return false
	}
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
		p.hold(-u)
		k -= u
		s = max(s, g.at)
		from = append(from, taken{g.id, u})
	}
	return s, from, true
}

// giveBack returns units that spend took, when the group they were part of was rejected: they
// were never used, so each grant may spend them again. Only to its own grant: another may expire
// later than a unit may be held. A grant already expired (or given back) keeps them: they are lost,
// which is stricter, and counted expired, so that every unit leased is accounted for.
func (p *pool) giveBack(from []taken, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var lost int64
	for _, t := range from {
		found := false
		for i := range p.grants {
			if g := &p.grants[i]; g.id == t.grant && n <= g.expires {
				g.units += t.units
				p.hold(t.units)
				found = true
				break
			}
		}
		if !found {
			lost += t.units
		}
	}
	if lost > 0 {
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(lost))
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
