package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// gcraRef is GCRAN as it was before gcraTo (a Result returned by value, the overflow tests and
// Remaining by division), kept as the reference gcraTo must match field by field.
func gcraRef(tat, now int64, l Limit, n int64) (int64, Result) {
	t := MaxSpan
	if l.Rate > 0 {
		f := math.Ceil(1e9 / l.Rate)
		switch {
		case f < 1:
			t = 1
		case f < float64(MaxSpan):
			t = int64(f)
		}
	}
	b := max(l.Burst, 0)
	if l.Algorithm == LeakyBucket {
		b++
	}
	tau := MaxSpan
	if b <= MaxSpan/t {
		tau = b * t
	}
	nt := MaxSpan
	if n <= MaxSpan/t {
		nt = n * t
	}
	var r Result
	start := max(tat, now)
	next := start + nt
	r.Limit = l.Burst
	if next-now > tau {
		r.RetryAfter = time.Duration(next - tau - now)
		r.Reset = time.Duration(max(tat-now, 0))
		r.Remaining = max(tau-(start-now), 0) / t
		return tat, r
	}
	r.Allowed = true
	r.Remaining = (tau - (next - now)) / t
	r.Reset = time.Duration(next - now)
	if l.Algorithm == LeakyBucket {
		r.Wait = time.Duration(start - now)
	}
	return next, r
}

// TestGCRAToMatchesReference holds gcraTo (the memory store's single-charge path) and GCRAN to
// gcraRef on random sequences: rates from one per 36 years to above 1e9/s (T clamped at both
// ends), bursts up to 2^62 (tau saturating), costs up to 2^61 (n*T saturating), a clock that
// steps back, and a Result that held another verdict before (every field must be rewritten).
func TestGCRAToMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	rates := []float64{0, -1, math.NaN(), 1e-9, 0.3, 1, 3, 1000, 1e6, 3e8, 1e9, 5e9, math.Inf(1)}
	bursts := []int64{-1, 0, 1, 2, 100, 1 << 40, 1 << 62}
	costs := []int64{1, 1, 1, 2, 5, 100, 1 << 31, 1 << 61}
	for seq := range 300 {
		l := Limit{
			Algorithm: []Algorithm{TokenBucket, LeakyBucket}[seq%2],
			Rate:      rates[rng.IntN(len(rates))],
			Burst:     bursts[rng.IntN(len(bursts))],
		}
		if rng.IntN(3) == 0 {
			l.Rate = rng.Float64() * 2000
		}
		tat := int64(0)
		now := t0ns + rng.Int64N(int64(time.Hour))
		r := Result{Allowed: true, Limit: -5, Remaining: -5, Reset: -5, RetryAfter: -5, Wait: -5, Token: 9}
		for i := range 200 {
			switch rng.IntN(4) {
			case 0:
				now -= rng.Int64N(int64(time.Second)) // a clock that steps back
			default:
				now += rng.Int64N(int64(10 * time.Millisecond))
			}
			n := costs[rng.IntN(len(costs))]
			wantTat, want := gcraRef(tat, now, l, n)
			gotTat, _ := GCRAInto(tat, now, l.Rate, l.Burst, l.Algorithm, n, &r)
			if gotTat != wantTat || r != want {
				t.Fatalf("seq %d step %d: %+v tat %d now %d n %d:\n got %d %+v\nwant %d %+v",
					seq, i, l, tat, now, n, gotTat, r, wantTat, want)
			}
			if g, gr := GCRAN(tat, now, l, n); g != wantTat || gr != want {
				t.Fatalf("seq %d step %d: GCRAN got %d %+v, want %d %+v", seq, i, g, gr, wantTat, want)
			}
			if r.Allowed {
				tat = wantTat
			}
		}
	}
}

// t0ns is an instant near t0 of the external tests, in Unix ns.
const t0ns = 1_700_000_040 * int64(time.Second)
