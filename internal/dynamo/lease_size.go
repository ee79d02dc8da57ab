package dynamo

import (
	"context"
	"math"
	"time"
)

// Sizing: how many units a renewal asks for, how long they last, where they are placed, and
// when the next renewal starts.

// sample adds a renewal's round trip to the pool's estimates (the caller holds p.mu): the mean
// and the mean deviation, with gains of 1/4, as TCP's retransmission timer (RFC 6298) does.
func (p *pool) sample(rtt int64) {
	if rtt <= 0 {
		return
	}
	if p.rtt == 0 {
		p.rtt, p.rttDev = rtt, rtt/2
		return
	}
	d := rtt - p.rtt
	if d < 0 {
		d = -d
	}
	p.rttDev += (d - p.rttDev) / 4
	p.rtt += (rtt - p.rtt) / 4
}

// rto is the round trip a renewal is expected to stay within: the mean plus four mean
// deviations, a high percentile of the store's round trips however they are spread (a store
// that answers in 20 ms to 320 ms has a mean of 170 ms and an rto near 470 ms).
func (p *pool) rto() int64 { return p.rtt + 4*p.rttDev }

// live is the units that can still be spent once a renewal started now has come back.
func (p *pool) live(n int64) int64 {
	var u int64
	horizon := n + p.rto()
	for _, g := range p.grants {
		if g.expires > horizon {
			u += g.units
		}
	}
	return u
}

// prefetch starts a renewal when the units that outlive the next round trip would last less
// than that round trip (rto, and a millisecond) at the demand seen, so that a steady stream
// never waits, however slow the store.
func (p *pool) prefetch(ctx context.Context, n int64) {
	if p.renewing || p.emptyUntil > n {
		return
	}
	low := int64(math.Ceil(p.rate*float64(p.rto()+int64(time.Millisecond)))) + 1
	if p.live(n) <= low && p.anyReady(n, p.least(p.want(n))) {
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
//
// The horizon is half the lease's lifetime, and at least two round trips (rto: one while the
// lease is on its way, one while the next one is), never past the lifetime. A token bucket's
// units die one after the other (see chunks): unit j at its place - T + ttl. A replica that
// spends faster than the shard's rate (1/T) spends each unit before it dies as long as the
// first is alive when the lease arrives; one that spends slower falls behind by 1/rate - T per
// unit, so its lease is cut to what it can spend in the lifetime left after the round trip.
func (p *pool) want(n int64) int64 {
	p.estimate(n)
	life := p.lifetime(n)
	rto := p.rto()
	horizon := min(max(life/2, 2*rto), life)
	w := int64(math.Ceil(p.rate*float64(horizon))) + p.waiting
	if p.gcra && p.rate > 0 {
		if behind := 1/p.rate - float64(p.shards[p.home].t); behind > 0 {
			// The first unit lives until its place (at least the shift past n) + ttl; the
			// lease arrives a round trip after n.
			left := max(life, p.shift()+p.ttl) - p.rtt
			spendable := int64(float64(max(left, 0))/behind) + p.waiting
			w = min(w, max(spendable, 1))
		}
	}
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

// least is the fewest units a lease of want takes from a shard. A token bucket's: half of want:
// a smaller lease would cost a write for a few requests, and what a shard lacks refills, so
// they are rejected until that much has, which loses nothing while demand exceeds the rate. A
// window's: one. Nothing refills a window before it ends, so a remainder smaller than half a
// lease (units given back late, a window's last few) would otherwise never be leased again and
// stay stranded for the rest of the window.
func (p *pool) least(want int64) int64 {
	if !p.gcra {
		return 1
	}
	return max(1, want/2)
}

// capacity is the most one lease can take from the smallest shard.
func (p *pool) capacity() int64 {
	sh := &p.shards[len(p.shards)-1]
	if p.gcra {
		return max(1, sh.tauL/sh.t)
	}
	return max(1, sh.count)
}

// shift is how far past the decision's instant a token bucket's renewal places its first unit
// (the caller holds p.mu): the store's smoothed round trip, or rto - ttl when that is more, at
// most three quarters of what a lease may span. A unit may be held ttl past its place, so a lease taken from an idle bucket whose answer
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
	// A unit may be held ttl past its place, so a first unit placed rto - ttl ahead is alive
	// when the lease arrives, however slow the store, within reason: at most three quarters
	// of what a lease may span (the lease is cut to fit above it: see leaseShard).
	return min(max(p.rtt, p.rto()-p.ttl), p.shards[len(p.shards)-1].tauL*3/4)
}
