package bucket

import (
	"math"
	"math/bits"
	"time"
)

// maxSpan caps every span the algorithms derive from a Limit (emission interval, tolerance,
// window) at 2^60 ns, about 36 years. State only ever holds instants up to now+maxSpan, so for
// instants before 2116 (now < 2^62 ns) no sum in this package can overflow int64. A bucket that
// refills in 36 years is indistinguishable from one that refills in longer.
//
// Instants are Unix nanoseconds from 1970 to 2116. The zero state is a fresh key only from 1970
// on; an earlier instant sees it as state from the future, i.e. as a clock that stepped back,
// which is safe (never admits more) but stricter than a fresh key.
const MaxSpan int64 = 1 << 60

// GCRAParams returns, in nanoseconds, the emission interval T of a token- or leaky-bucket Limit
// (the time one request's worth of quota takes to come back) and its tolerance tau (how far the
// theoretical arrival time may run ahead of now after a conforming request).
//
// T is 1e9/Rate computed in float64 and rounded up to a whole nanosecond, then clamped to
// [1ns, 2^60ns]: a rate above 1e9/s acts as 1e9/s, a zero, negative or NaN rate as one that never
// refills. Rounding up makes the effective rate at most the configured one, never above it
// (rounding to nearest let 3e8/s admit 11% too many): it is stricter by less than 1ns per
// request, a relative error below 1e-6 at 1000 req/s.
//
// tau is Burst*T for a token bucket and (Burst+1)*T for a leaky bucket (the request in service
// plus Burst waiting behind it), saturating at 2^60ns; a negative Burst counts as 0.
func GCRAParams(l Limit) (t, tau int64) { return gcraParams(l.Rate, l.Burst, l.Algorithm) }

// gcraParams is GCRAParams of a Limit with these fields: it takes the two fields it reads rather
// than the 40-byte Limit (see windowSpan).
func gcraParams(rate float64, burst int64, alg Algorithm) (t, tau int64) {
	t = MaxSpan
	// The comparison is false for NaN, which keeps the "never refills" default.
	if rate > 0 {
		f := math.Ceil(1e9 / rate)
		switch {
		case f < 1:
			t = 1
		case f < float64(MaxSpan):
			t = int64(f)
		}
	}
	n := max(burst, 0)
	if alg == LeakyBucket {
		n++
	}
	return t, spend(t, n)
}

// GCRA takes one request at instant now (Unix ns) from the token or leaky bucket whose state is
// tat, its theoretical arrival time in Unix ns (0, or any instant <= now, is a fresh bucket). It
// returns the state to store if the request is taken, and the verdict. It reads no clock and keeps
// no state, so the DynamoDB store can use the same arithmetic.
//
// With T and tau from GCRAParams, the request conforms when max(tat, now)+T-now <= tau; the
// new state is then max(tat, now)+T. Otherwise tat is returned unchanged.
//
// Token bucket (l.Algorithm == TokenBucket): a fresh key admits exactly Burst requests at one
// instant, then one per T. Result.Limit is Burst; Remaining is what may still pass at this instant;
// Reset is when the bucket is full again; a rejection's RetryAfter is when one request conforms
// again and its Reset is when the bucket is full (tat-now).
//
// Leaky bucket (l.Algorithm == LeakyBucket, shaping): the request waits for its turn instead of
// being rejected. Wait = max(tat, now)-now; it is admitted while Wait <= Burst*T, so a fresh key at
// one instant admits Burst+1 requests with waits 0, T, ..., Burst*T. Limit is Burst (the queue
// length); Remaining is the queue places still free; Reset is when the queue is empty; a
// rejection's RetryAfter is when a queue place frees.
//
// A clock that steps backwards (now below an earlier call's now) cannot admit more: tat stays
// where the later instant put it, so max(tat, now) only grows the computed wait.
func GCRA(tat, now int64, l Limit) (newTat int64, r Result) { return GCRAN(tat, now, l, 1) }

// GCRAN is GCRA for a request that costs n (>= 1) requests at once (x/time/rate's AllowN): it
// conforms when max(tat, now)+n*T-now <= tau, and then moves tat by n*T; it is all or nothing.
// A rejection's RetryAfter is when all n conform again, and its Remaining is how many requests
// of cost 1 would conform at now (less than n). A cost above what the bucket holds never
// conforms; the policy package refuses such a configuration.
func GCRAN(tat, now int64, l Limit, n int64) (newTat int64, r Result) {
	newTat, _ = GCRAInto(tat, now, l.Rate, l.Burst, l.Algorithm, n, &r)
	return newTat, r
}

// gcraTo is GCRAN writing its verdict into *r and returning the new tat, for the memory store:
// GCRAN built its Result on the stack and the caller copied it into place, and the call copied
// the 40-byte Limit, which it then read back (see windowSpan). Every field of *r is written
// (Token 0), as the assignment of a GCRAN result did. room is tau-n*T, the most tat may run
// ahead of now for a request of cost n to conform: the memory store keeps it beside tat to tell
// a key at its limit (tat-now > room) from one that is not, when it must evict.
func GCRAInto(tat, now int64, rate float64, burst int64, alg Algorithm, n int64, r *Result) (newTat, room int64) {
	t, tau := gcraParams(rate, burst, alg)
	start := max(tat, now)
	cost := spend(t, n)
	next := start + cost
	room = tau - cost
	r.Limit = burst
	r.Token = 0
	if next-now > tau {
		r.Allowed = false
		r.Remaining = quo(max(tau-(start-now), 0), t)
		r.Reset = time.Duration(max(tat-now, 0))
		r.RetryAfter = time.Duration(next - tau - now)
		r.Wait = 0
		return tat, room
	}
	r.Allowed = true
	// tau-(next-now) is the slack left at this instant; each further request uses T of it.
	r.Remaining = quo(tau-(next-now), t)
	r.Reset = time.Duration(next - now)
	r.RetryAfter = 0
	r.Wait = 0
	if alg == LeakyBucket {
		r.Wait = time.Duration(start - now)
	}
	return next, room
}

// quo is a/t for 0 <= a and 1 <= t. A hot key lives near an empty bucket, where less than one
// emission interval of slack is left: the comparison answers 0 there without a 64-bit division.
func quo(a, t int64) int64 {
	if a < t {
		return 0
	}
	return a / t
}

// spend is n*t (n requests' worth of slack, n >= 0, t >= 1), saturating at maxSpan like every
// span. The overflow test multiplies (a 128-bit product) rather than divides: n > maxSpan/t
// exactly when n*t > maxSpan, and a 64-bit division costs several multiplications' time.
func spend(t, n int64) int64 {
	hi, lo := bits.Mul64(uint64(n), uint64(t))
	if hi != 0 || lo > uint64(MaxSpan) {
		return MaxSpan
	}
	return int64(lo)
}

// GCRAIdle reports whether a bucket with state tat is indistinguishable from a fresh one at now,
// so a store may forget it.
func GCRAIdle(tat, now int64) bool { return tat <= now }
