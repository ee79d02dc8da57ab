package lease

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

// leaseWaitFloor is the least a request waits for a renewal, whatever the round trips measured
// so far (none yet, or a fast store's).
const leaseWaitFloor = 50 * time.Millisecond

// decision is one leased charge on its way through take: what it spent, and what was decided.
type decision struct {
	c      bucket.Charge
	result bucket.Result
	err    error
	// pool decided the charge; spent is what it took from each grant, at spentAt (to give it
	// back if the group is rejected).
	pool    *pool
	spent   []taken
	spentAt int64
}

// Spent is what a leased charge took from its pool's grants: given back when its group is
// rejected, kept when it is admitted. The zero Spent holds nothing.
type Spent struct {
	p    *pool
	from []taken
	at   int64
}

// GiveBack returns the units to the grants they came from (the group was rejected) and
// reports whether there were any. The Spent holds nothing after it.
func (s *Spent) GiveBack() bool {
	if s.from == nil {
		return false
	}
	s.p.giveBack(s.from, s.at)
	*s = Spent{}
	return true
}

// Keep counts the units spent for good: the group was admitted.
func (s Spent) Keep() {
	if s.from == nil {
		return
	}
	var u int64
	for _, t := range s.from {
		u += t.units
	}
	s.p.ls.m.Units.WithLabelValues(unitsSpent).Add(float64(u))
}

// Take decides leased charge c at n: from a grant when one has units, else by waiting for one
// renewal that asked for them, else rejected. An error is on_error's to decide.
func (ls *Pools) Take(ctx context.Context, c bucket.Charge, n int64) (Spent, bucket.Result, error) {
	o := decision{c: c}
	ls.take(ctx, &o, n)
	if o.err != nil {
		return Spent{}, bucket.Result{}, o.err
	}
	return Spent{p: o.pool, from: o.spent, at: o.spentAt}, o.result, nil
}

// TakeLocal decides leased charge c at n from its pool's grants alone, with no call and no
// renewal: decided when it could (spent from a grant, or rejected while the pool is known to be
// empty at n).
func (ls *Pools) TakeLocal(c bucket.Charge, n int64) (s Spent, r bucket.Result, decided bool) {
	o := decision{c: c}
	if !ls.takeLocal(&o, n) {
		return Spent{}, bucket.Result{}, false
	}
	return Spent{p: o.pool, from: o.spent, at: o.spentAt}, o.result, true
}

// take decides a leased charge: from a grant when one has a unit, else by waiting for one
// renewal that asked for its units, else rejected.
func (ls *Pools) take(ctx context.Context, o *decision, n int64) {
	// Decisions made here without a round trip (from a grant, or rejected while the pool is
	// empty) are timed on their own: the store's decision histogram mixes them with the ones
	// that waited for a renewal.
	start, waited := time.Now(), false
	defer func() {
		if !waited && o.err == nil {
			ls.m.Local.Observe(time.Since(start).Seconds())
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
		o.result = bucket.Result{Limit: limitValue(p.key.limit), RetryAfter: time.Duration(p.ttl)}
		p.mu.Unlock()
		return
	}
	for again := false; ; again = true {
		p.expire(n)
		if from, left, ok := p.spend(n, cost); ok {
			o.result, o.spent, o.spentAt = p.admitted(n, left), from, n
			p.prefetch(ctx, n)
			p.mu.Unlock()
			return
		}
		if p.emptyUntil > n || again {
			p.prefetch(ctx, n) // a renewal made ahead may find what this request cannot
			// A request waits for one renewal at most: one that came back without a unit for
			// it (the shard had fewer than asked, or later requests spent them first) means
			// the pool is short, as one exact bucket would be.
			o.result = p.rejected(n)
			p.mu.Unlock()
			return
		}
		if p.fails > 0 && n-p.lastEmpty < p.horizon {
			// The last renewal found the pool empty, lately: this one polls it in the background, and
			// the requests meanwhile are rejected at once rather than held for a round trip
			// (two, with the read) that a slow store could stretch past their deadline. While
			// the pool is empty, so would one exact bucket have rejected them.
			if !p.renewing() {
				p.startRenewal(ctx, n, false)
			} else {
				p.prefetch(ctx, n) // more in flight on a slow store, gap apart
			}
			o.result = p.rejected(n)
			p.mu.Unlock()
			return
		}
		// Wait for a renewal that asked for this request's units, or start one when none is
		// in flight. Only for one that asked: requests beyond what the renewals in flight
		// asked for would wait a round trip for units that later requests take, holding their
		// connections meanwhile (on a slow store, most of a replica's), and the renewals after
		// them serve the later requests anyway.
		var r *renewal
		if !p.slow() {
			// On a slow store a request never joins a renewal in flight: its round trip is
			// most of a decision's, and the renewals after it serve the requests after this one.
			r = p.renewalFor(n, cost)
		}
		if r == nil && p.renewing() {
			// Renewals are in flight and none asked for this request: they serve the
			// requests after it, and more may start ahead of need. Unless the store has
			// stopped answering them: that is on_error's to decide, not a rejection's.
			if p.ls.t.Silent() {
				o.err = p.noAnswer()
			} else {
				p.prefetch(ctx, n)
				o.result = p.rejected(n)
			}
			p.mu.Unlock()
			return
		}
		p.waiting += cost // counted in the size of a renewal started now
		if r == nil {
			r = p.startRenewal(ctx, n, false)
		}
		r.waiting += cost
		done := r.done
		wait := time.Duration(max(p.rto(), int64(leaseWaitFloor)))
		p.mu.Unlock()
		// A renewal still on its way when this decision's time is almost up is not an outage:
		// the store answers, slowly, and the lease will serve the requests after this one. So
		// the request is rejected (the pool had nothing for it in time) rather than failed,
		// which would open the circuit breaker for every request. A renewal that fails is an
		// error, and follows on_error.
		waited = true
		// A wait ends after a round trip (rto, a high percentile of the store's), or at the
		// deadline's margin if sooner: a renewal that takes longer has met a contended shard
		// (a failed condition, a read, a second shard), and the renewals after it serve the
		// requests after this one; a request held longer would hold its connection.
		if d, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(d)-leaseWaitMargin)
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		late := t.C
		if p.ls.forced {
			// Simulated time (SetShift): a wall-clock wait means nothing there, and on a
			// loaded machine it would reject requests whose renewal the scheduler merely ran
			// late. The context still bounds the wait.
			late = nil
		}
		throttledBefore := p.throttled.Load()
		k := p.ls.turns.Park()
		select {
		case <-done:
			p.ls.turns.Resume(k)
		case <-late:
			p.ls.turns.Resume(k)
			p.late(o, n, cost, throttledBefore)
			return
		case <-ctx.Done():
			p.ls.turns.Resume(k)
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
		if r.err != nil {
			o.err = r.err
			p.mu.Unlock()
			return
		}
		// The renewal's write happened after n: a unit it granted is spent no earlier.
	}
}

// noAnswer is the error of a charge that needs a renewal while the store has left a call without
// an answer for over its grace (it may be down or hung): on_error's to decide, not a rejection's.
func (p *pool) noAnswer() error {
	return fmt.Errorf("dynamo: lease %s: no answer: %w", p.base, context.DeadlineExceeded)
}

// late decides a charge whose deadline came while it waited for a renewal: rejected (the pool
// had nothing for it in time) while the store answers, an error (on_error decides) when the
// renewal was throttled or the store has left a call without an answer for over a second.
func (p *pool) late(o *decision, n, cost, throttledBefore int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiting -= cost
	switch {
	case p.throttled.Load() > throttledBefore:
		o.err = fmt.Errorf("dynamo: lease %s: %w: the renewal was throttled", p.base, p.ls.errThrottled)
	case p.ls.t.Silent():
		// The store may be down or hung, which is on_error's to decide, not a rejection's.
		o.err = p.noAnswer()
	default:
		o.result = p.rejected(n)
	}
}

// takeLocal decides leased charge o from its pool's grants alone, with no call and no renewal:
// true when it could (spent from a grant, or rejected while the pool is known to be empty at n).
func (ls *Pools) takeLocal(o *decision, n int64) bool {
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
	if from, left, ok := p.spend(n, cost); ok {
		o.pool, o.result, o.spent, o.spentAt = p, p.admitted(n, left), from, n
		return true
	}
	if p.emptyUntil > n {
		o.pool, o.result = p, p.rejected(n)
		return true
	}
	return false
}

// taken is units a charge spent from one grant.
type taken struct {
	grant uint64
	units int64
}

// spend takes k units (a charge's cost), all or none, from the grants that have them at instant
// n, those that expire first first: a grant is spent from its instant (at) until it expires,
// never before (a renewal placed ahead may land early). It returns the units taken from each
// grant and those left to spend at n.
func (p *pool) spend(n, k int64) ([]taken, int64, bool) {
	left := p.spendable(n)
	if left < k {
		return nil, 0, false
	}
	var from []taken
	for k > 0 {
		// The grant that expires first: with several renewals in flight, a later grant may
		// hold units that die before an earlier one's.
		j := -1
		for i := range p.grants {
			if g := &p.grants[i]; g.units > 0 && g.at <= n && n <= g.expires && (j < 0 || g.expires < p.grants[j].expires) {
				j = i
			}
		}
		g := &p.grants[j]
		u := min(g.units, k)
		g.units -= u
		p.hold(-u)
		k -= u
		left -= u
		from = append(from, taken{g.id, u})
	}
	return from, left, true
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
		p.ls.m.Units.WithLabelValues(unitsExpired).Add(float64(lost))
	}
}

// limitValue is Result.Limit for a leased limit: a token bucket's burst, a window's count.
func limitValue(l bucket.Limit) int64 {
	if l.Algorithm == bucket.TokenBucket {
		return l.Burst
	}
	return l.Count
}

// windowEnd returns the end (exclusive, Unix ns) of the fixed window holding n (leases serve
// fixed windows, never quota periods: see bucket.LeaseSupported).
func windowEnd(l bucket.Limit, n int64) int64 {
	s, _ := bucket.Fixed(bucket.FixedState{}, n, l)
	return s.End
}

// admitted is the result of a charge spent at n, left the units this Store still holds that a
// charge at n could spend.
func (p *pool) admitted(n, left int64) bucket.Result {
	return bucket.Result{
		Allowed:   true,
		Limit:     limitValue(p.key.limit),
		Remaining: left,
		Reset:     time.Duration(max(0, p.resetAt-n)),
	}
}

// spendable is the units a charge at n could spend now: held, alive, and not of a renewal made
// ahead whose instant is still to come.
func (p *pool) spendable(n int64) int64 {
	var u int64
	for i := range p.grants {
		if g := &p.grants[i]; g.at <= n && n <= g.expires {
			u += g.units
		}
	}
	return u
}

// rejected is the result of a charge at n while every shard is empty.
func (p *pool) rejected(n int64) bucket.Result {
	wait := time.Duration(max(p.emptyUntil-n, int64(time.Millisecond)))
	if !p.gcra {
		// Every shard was full: one exact window would say "when it ends" too.
		wait = time.Duration(max(windowEnd(p.key.limit, n)-n, int64(wait)))
	}
	return bucket.Result{
		Limit:      limitValue(p.key.limit),
		RetryAfter: wait,
		Reset:      max(wait, time.Duration(p.resetAt-n)),
	}
}

// renewalFor returns the oldest renewal in flight whose units a request at n may spend that
// asked for cost more units than the requests already waiting for it need, or nil (the caller
// holds p.mu).
func (p *pool) renewalFor(n, cost int64) *renewal {
	for _, r := range p.inflight {
		if r.at <= n && r.want-r.waiting >= cost {
			return r
		}
	}
	return nil
}
