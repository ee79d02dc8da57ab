package dynamo

import (
	"context"
	"math"
	"time"
)

// Sizing: how many units a renewal asks for, how long they last, where they are placed, and
// when the next renewal starts.

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
