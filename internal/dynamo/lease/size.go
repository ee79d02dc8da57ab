package lease

import (
	"context"
	"math"
	"time"
)

// Sizing: how many units a renewal asks for, how long they last, where they are placed, and
// when the next renewal starts.

// sampled adds the round trip of a call sent at sent to the pool's estimates.
func (p *pool) sampled(sent time.Time) {
	rtt := int64(time.Since(sent)) // wall-clock time whatever the decisions' instants
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sample(rtt)
}

// slow reports whether the store's round trip (rto) is a large part of the time a token bucket's
// place stays leasable (tau - ttl): a quarter or more. Then several renewals may be in flight
// (leaseMaxInflight), those that nobody waits for are placed ahead (leadTime), and a shard found
// empty or not seen lately is drained to its edge without a read first. Below that, one renewal
// at a time keeps up with fewer writes. The caller holds p.mu.
func (p *pool) slow() bool {
	if p.ls.slowForced {
		return p.gcra
	}
	return p.gcra && !p.ls.forced && p.rto() >= p.shards[len(p.shards)-1].tauL/4
}

// sample adds a call's round trip to the pool's estimates (the caller holds p.mu): the mean
// and the mean deviation, with gains of 1/4, as TCP's retransmission timer (RFC 6298) does.
func (p *pool) sample(rtt int64) {
	if rtt <= 0 || p.ls.slowForced {
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

// live is the units that can still be spent within of n (a renewal's round trip: when one
// started now comes back).
func (p *pool) live(n, within int64) int64 {
	var u int64
	horizon := n + within
	for _, g := range p.grants {
		if g.expires > horizon {
			u += g.units
		}
	}
	return u
}

// prefetch starts a renewal when the units that outlive the next round trip, with what the
// renewals in flight are expected to bring, would last less than that round trip (rto, and a
// millisecond) at the demand seen, so that a steady stream never waits, however slow the
// store. On a store slow against the bucket's burst time, that keeps several renewals in
// flight, at least gap apart (see leaseMaxInflight; one on a fast store).
func (p *pool) prefetch(ctx context.Context, n int64) {
	// Emptiness is known as of a renewal's instant, which for a renewal made ahead is its
	// start plus the lead.
	lead := p.leadTime()
	if p.emptyUntil > n+lead || len(p.inflight) >= p.maxInflight() {
		return
	}
	if p.renewing() && n-p.lastStart < p.gap() {
		return
	}
	low := int64(math.Ceil(p.rate*float64(p.rto()+int64(time.Millisecond)))) + 1
	if p.live(n, p.rtt)+p.coming() <= low && p.anyReady(n+lead, p.least(p.want(n), p.shift(lead))) {
		p.startRenewal(ctx, n, true)
	}
}

// coming is the units the renewals in flight are expected to bring: each what it asked for, or
// what renewals brought lately if that is less.
func (p *pool) coming() int64 {
	var u int64
	for _, r := range p.inflight {
		u += min(r.want, int64(p.yield))
	}
	return u
}

// uncovered is the units of the requests waiting that no renewal in flight asked for.
func (p *pool) uncovered() int64 {
	w := p.waiting
	for _, r := range p.inflight {
		w -= r.waiting
	}
	return max(w, 0)
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

// want is the size of the next lease: the demand over one horizon, plus the requests waiting
// that no renewal in flight asked for, at least one, and no more than a shard can ever hold.
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
	waiting := p.uncovered()
	// Less what is held and on its way: with several renewals in flight, each asks for what
	// the others do not bring, or the replica would hold more than it spends before it dies.
	w := int64(math.Ceil(p.rate*float64(horizon))) + waiting - p.live(n, p.rtt) - p.coming()
	if p.gcra && p.rate > 0 {
		if behind := 1/p.rate - float64(p.shards[p.home].t); behind > 0 {
			// The first unit lives until its place (at least the shift past n) + ttl; the
			// lease arrives a round trip after n.
			left := max(life, p.shift(0)+p.ttl) - p.rtt
			spendable := int64(float64(max(left, 0))/behind) + waiting
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
		return max(min(p.ttl, windowEnd(p.key.limit, n)-n), 1)
	}
	return max(p.shards[p.home].tat-n, 0) + p.ttl
}

// least is the fewest units a lease of want, placed shift ahead, takes from a shard (the
// caller holds p.mu). A token bucket's: half of what the lease can take (want, cut to the places
// above the shift: see leaseShard), and no more than refill within the slack a place has: a
// smaller lease would cost a write for a few requests, and what a shard lacks refills, so they
// are rejected until that much has, which loses nothing while demand exceeds the rate, as long
// as the refill is leased before its places pass the shift. A window's: one. Nothing refills a
// window before it ends, so a remainder smaller than half a lease (units given back late, a
// window's last few) would otherwise never be leased again and stay stranded for the rest of
// the window.
func (p *pool) least(want, shift int64) int64 {
	if !p.gcra {
		return 1
	}
	room := p.fits(shift)
	if room < 1 {
		return max(1, want/2)
	}
	// The slack: how long a place may wait for a lease beyond a round trip. Waiting for least
	// units to refill must fit in it, or the places that refilled first pass unleased; a store
	// whose round trip takes most of the places' window leaves none, and takes what is there.
	slack := p.shards[len(p.shards)-1].tauL - shift - p.rto()
	return max(1, min(min(want, room)/2, slack/(2*p.shards[len(p.shards)-1].t)))
}

// fits is how many units of a token bucket fit above the shift in the smallest shard (0 when
// none do, and for a window).
func (p *pool) fits(shift int64) int64 {
	if !p.gcra {
		return 0
	}
	sh := &p.shards[len(p.shards)-1]
	return max(0, (sh.tauL-shift)/sh.t)
}

// capacity is the most one lease can take from the smallest shard.
func (p *pool) capacity() int64 {
	sh := &p.shards[len(p.shards)-1]
	if p.gcra {
		return max(1, sh.tauL/sh.t)
	}
	return max(1, sh.count)
}

// shift is how far past the renewal's instant a token bucket's renewal places its first unit
// (the caller holds p.mu), for a renewal placed ahead past its start (see leadTime): the store's
// smoothed round trip, or a late one less ttl when that is more, less ahead, at most three
// quarters of what a lease may span. A unit may be held ttl past its place, so a lease taken
// from an idle bucket whose answer takes longer than ttl would arrive with its first units
// dead, and a store that stays that slow would never lease anything usable; placed a round
// trip later, the lease arrives alive. The places skipped are lost, which costs an idle bucket
// a round trip of its refill, and a drained one (tat already ahead) nothing. Exact: see
// leaseGCRA.
func (p *pool) shift(ahead int64) int64 {
	if !p.gcra {
		return 0
	}
	if p.ls.forced {
		return p.ls.forceShift
	}
	// A unit may be held ttl past its place, so a first unit placed a late round trip (the
	// mean and two mean deviations) less ttl ahead is alive when almost every lease arrives,
	// however slow the store, within reason: at most three quarters of what a lease may span
	// (the lease is cut to fit above it: see leaseShard). Not rto: every place skipped below
	// the first is lost, and a lease that arrives later still than that loses only its first
	// chunks (see chunks).
	return min(max(p.rtt-ahead, p.rtt+2*p.rttDev-ahead-p.ttl, 0), p.shards[len(p.shards)-1].tauL*3/4)
}

// leadTime is how far past its start a token bucket's renewal that nobody waits for (prefetch)
// is made as of (the caller holds p.mu): the store's smoothed round trip, when it lands on
// average. Its places may then be as far as that past the start + tau - ttl, and its units are
// spent from that instant on, so the bound holds as for a renewal made then (see leaseGCRA). A
// place may be leased only within tau - ttl before it, less the shift: on a store whose round
// trip is a large part of that, a renewal made as of its start would find little room above
// its shift, and the places above its reach refill while it is on its way. 0 on a store that is
// not slow (see slow), where it buys little and would leave a lease that lands early
// unspendable for a while; 0 for a window (its units are its own
// window's), and for tests on simulated time (SetShift).
func (p *pool) leadTime() int64 {
	if !p.slow() {
		return 0
	}
	return p.rtt
}
