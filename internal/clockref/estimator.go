// Package clockref measures and corrects this host's clock against a reference.
//
// It measures this host's clock against a reference clock that stamps its answers
// with whole seconds, such as the Date header of every DynamoDB response, and corrects it.
//
// # Bracketing
//
// One exchange sent at local instant s and answered at local r, stamped D by the reference
// (which truncates its time to the second), says that the reference read a time in [D, D+1s)
// at some local instant in [s, r]. So the offset θ (reference minus local) lies in
// (D − r, D + 1s − s): an interval one second plus the round trip wide. Intersecting the
// intervals of many exchanges narrows it: an answer stamped just after the reference's second
// ticked gives a lower bound close to θ, one stamped just before an upper bound. With answers
// at random phases the interval shrinks towards the round trip; a probe sent so that the
// reference reads it at the tick the current estimate predicts halves it (see NextProbe).
//
// Clocks drift: an interval measured a while ago is widened by MaxDrift × its age, and intervals
// older than Window are forgotten. A newer interval that contradicts older ones (the local or
// the reference clock stepped) wins: the older ones are dropped.
package clockref

import (
	"math"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultWindow     = time.Minute
	DefaultMaxDrift   = 100e-6 // 100 ppm: an undisciplined quartz clock; NTP keeps drift far lower
	DefaultResolution = time.Second
	// buckets is how many groups of exchanges Window is cut into: each keeps the intersection
	// of its exchanges, so that recording one costs O(1) and an estimate O(buckets).
	buckets = 12
)

// Options configure an Estimator. The zero value uses the defaults.
type Options struct {
	// Window is how long an exchange counts (Optional; default 1m).
	Window time.Duration
	// MaxDrift bounds how fast the local clock may drift from the reference, as a rate
	// (Optional; default 100e-6).
	MaxDrift float64
	// Resolution is the reference's stamp resolution: it truncates its time to a multiple of it
	// (Optional; default 1s, an HTTP date).
	Resolution time.Duration
}

// Estimate is what the exchanges of the Window say about the offset: reference minus local.
type Estimate struct {
	// Known is false before any exchange (or once every exchange aged out); the rest is zero.
	Known bool
	// Lo and Hi bound the offset: it is in [Lo, Hi] unless the local clock drifted faster than
	// MaxDrift, or the reference's clock is not what it says.
	Lo, Hi time.Duration
	// Exchanges is how many exchanges contributed.
	Exchanges int
	// MinRTT is the shortest round trip among them.
	MinRTT time.Duration
	// Newest is the local instant the newest contributing exchange was answered.
	Newest time.Time
}

// Offset is the middle of [Lo, Hi].
func (e Estimate) Offset() time.Duration { return e.Lo + (e.Hi-e.Lo)/2 }

// Uncertainty is half the width of [Lo, Hi]: the offset is within Offset() ± Uncertainty().
func (e Estimate) Uncertainty() time.Duration { return (e.Hi - e.Lo + 1) / 2 }

// Correction is the least change of the local clock that makes it agree with every exchange:
// 0 when 0 is in [Lo, Hi], else the bound nearest 0. It never makes the clock worse: the
// corrected clock is off by at most min(|offset|, Hi − Lo). 0 when not Known.
func (e Estimate) Correction() time.Duration {
	switch {
	case !e.Known || (e.Lo <= 0 && e.Hi >= 0):
		return 0
	case e.Lo > 0:
		return e.Lo
	default:
		return e.Hi
	}
}

// ErrorBound is how far the local clock moved by c can be from the reference, whatever the
// offset is in [Lo, Hi]: max(|Lo − c|, |Hi − c|). With c = Correction() it is at most Hi − Lo;
// with c = 0, |offset| + Uncertainty(). Meaningless when not Known.
func (e Estimate) ErrorBound(c time.Duration) time.Duration {
	return max((e.Lo - c).Abs(), (e.Hi - c).Abs())
}

// Estimator gathers exchanges. It is safe for concurrent use; the zero value is not usable (use
// New).
type Estimator struct {
	window     time.Duration
	drift      float64
	resolution time.Duration
	bucketLen  time.Duration

	mu   sync.Mutex
	b    [buckets]group // ring, by the answer's local instant
	last int            // index of the newest group
}

// group is the intersection of the exchanges answered within one bucketLen.
type group struct {
	n             int
	first, newest time.Time // local instants the first and the newest exchange were answered
	lo, hi        time.Duration
	minRTT        time.Duration
}

// New returns an Estimator.
func New(o Options) *Estimator {
	e := &Estimator{window: o.Window, drift: o.MaxDrift, resolution: o.Resolution}
	if e.window <= 0 {
		e.window = DefaultWindow
	}
	if e.drift <= 0 {
		e.drift = DefaultMaxDrift
	}
	if e.resolution <= 0 {
		e.resolution = DefaultResolution
	}
	e.bucketLen = e.window / buckets
	return e
}

// Observe records one exchange: sent and received are the local instants it was sent and
// answered (received's reading of the same clock as sent: a monotonic one where possible), ref
// the reference's stamp. An exchange answered before it was sent (the local clock stepped back
// during it) is ignored.
func (e *Estimator) Observe(sent, received, ref time.Time) {
	rtt := received.Sub(sent)
	if rtt < 0 {
		return
	}
	lo, hi := ref.Sub(received), ref.Add(e.resolution).Sub(sent)
	e.mu.Lock()
	defer e.mu.Unlock()
	g := &e.b[e.last]
	switch {
	case g.n == 0:
	case received.Sub(g.first) >= e.bucketLen:
		// (Concurrent exchanges may be recorded a little out of order: one answered just
		// before the group's first joins it.)
		e.last = (e.last + 1) % buckets
		g = &e.b[e.last]
		*g = group{}
	case max(g.lo, lo) > min(g.hi, hi):
		// This exchange contradicts the others of its group: a clock stepped. The newest wins.
		*g = group{}
	}
	if g.n == 0 {
		*g = group{first: received, lo: lo, hi: hi, minRTT: rtt}
	}
	g.n++
	g.lo, g.hi = max(g.lo, lo), min(g.hi, hi)
	g.minRTT = min(g.minRTT, rtt)
	if received.After(g.newest) {
		g.newest = received
	}
}

// Estimate combines the exchanges of the Window before now, newest first, each widened by
// MaxDrift × its age; it stops at the first group that contradicts the newer ones.
func (e *Estimator) Estimate(now time.Time) Estimate {
	e.mu.Lock()
	defer e.mu.Unlock()
	var est Estimate
	for i := range buckets {
		g := &e.b[(e.last-i+buckets)%buckets]
		if g.n == 0 || now.Sub(g.newest) > e.window {
			break // older groups are older still
		}
		age := max(now.Sub(g.first), 0)
		widen := time.Duration(math.Ceil(e.drift * float64(age)))
		lo, hi := g.lo-widen, g.hi+widen
		if !est.Known {
			est = Estimate{Known: true, Lo: lo, Hi: hi, Exchanges: g.n, MinRTT: g.minRTT, Newest: g.newest}
			continue
		}
		if max(est.Lo, lo) > min(est.Hi, hi) {
			break // a clock stepped between this group and the newer ones: trust the newer
		}
		est.Lo, est.Hi = max(est.Lo, lo), min(est.Hi, hi)
		est.Exchanges += g.n
		est.MinRTT = min(est.MinRTT, g.minRTT)
	}
	return est
}

// NextProbe is when to send an exchange that teaches the most, given the estimate at now: so
// that the reference reads it at the local instant its next second ticks if the offset is the
// middle of [Lo, Hi]. Its answer then halves the interval (down to about the round trip):
// stamped with the new second, the offset was at least the middle; with the old one, at most.
// rtt is the expected round trip; the instant is at least lead after now.
func NextProbe(est Estimate, now time.Time, rtt, lead time.Duration, resolution time.Duration) time.Time {
	if resolution <= 0 {
		resolution = DefaultResolution
	}
	mid := est.Offset() // 0 when unknown: any instant teaches as much
	// The reference reads the probe at about send + rtt/2; its clock then reads that + mid.
	// Find the first tick k (a multiple of resolution, reference time) with
	// k − mid − rtt/2 >= now + lead.
	earliest := now.Add(lead).Add(rtt / 2).Add(mid) // reference time of the earliest arrival
	k := earliest.Truncate(resolution)
	if k.Before(earliest) {
		k = k.Add(resolution)
	}
	return k.Add(-mid).Add(-rtt / 2)
}
