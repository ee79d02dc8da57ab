package bucket_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestGCRAParams(t *testing.T) {
	const MaxSpan = int64(1) << 60
	tests := []struct {
		name   string
		limit  bucket.Limit
		t, tau int64
	}{
		{"token", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 3}, 100e6, 300e6},
		{"leaky counts the request in service", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 3}, 100e6, 400e6},
		{"rounds up, never faster than Rate", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 3, Burst: 3}, 333_333_334, 1_000_000_002},
		{"rounds up", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 7, Burst: 1}, 142_857_143, 142_857_143},
		{"above 1e9/s acts as 1e9/s", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 5e9, Burst: 2}, 1, 2},
		{"zero rate never refills", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 0, Burst: 1}, MaxSpan, MaxSpan},
		{"negative rate", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: -1, Burst: 0}, MaxSpan, 0},
		{"NaN rate", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: math.NaN(), Burst: 0}, MaxSpan, 0},
		{"tolerance saturates", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600, Burst: 1e9}, 3_600e9, MaxSpan},
		{"negative burst is zero", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: -4}, 1e9, 1e9},
	}
	for _, tc := range tests {
		gotT, gotTau := bucket.GCRAParams(tc.limit)
		if gotT != tc.t || gotTau != tc.tau {
			t.Errorf("%s: got T=%d tau=%d, want T=%d tau=%d", tc.name, gotT, gotTau, tc.t, tc.tau)
		}
	}
}

func TestTokenBucketSteps(t *testing.T) {
	runSteps(t, gcraTaker(bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 3}), []step{
		// A fresh key admits exactly Burst at one instant; the last admitted reads 0.
		{0, allowed(3, 2, ms(100), 0)},
		{0, allowed(3, 1, ms(200), 0)},
		{0, allowed(3, 0, ms(300), 0)},
		{0, rejected(3, ms(100), ms(300))},
		{ms(50), rejected(3, ms(50), ms(250))},
		// Then one per T.
		{ms(100), allowed(3, 0, ms(300), 0)},
		{ms(100), rejected(3, ms(100), ms(300))},
		{ms(250), allowed(3, 0, ms(250), 0)},
		// tat (t0+500ms) has passed: a fresh bucket.
		{ms(1000), allowed(3, 2, ms(100), 0)},
		// The clock steps back 100ms: the request sees less quota, not more.
		{ms(900), allowed(3, 0, ms(300), 0)},
		// And back to t0: rejected until tat-tau+T, 1s later than at t0+1200ms.
		{0, rejected(3, ms(1000), ms(1200))},
		{ms(1200), allowed(3, 2, ms(100), 0)},
	})
}

func TestTokenBucketZeroBurst(t *testing.T) {
	runSteps(t, gcraTaker(bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 0}), []step{
		{0, rejected(0, ms(100), 0)},
		{sec(10), rejected(0, ms(100), 0)},
	})
}

func TestLeakyBucketSteps(t *testing.T) {
	runSteps(t, gcraTaker(bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 2}), []step{
		// Burst+1 at one instant, with waits 0, T, 2T; Remaining counts free queue places.
		{0, allowed(2, 2, ms(100), 0)},
		{0, allowed(2, 1, ms(200), ms(100))},
		{0, allowed(2, 0, ms(300), ms(200))},
		{0, rejected(2, ms(100), ms(300))},
		// A queue place frees every T.
		{ms(100), allowed(2, 0, ms(300), ms(200))},
		{ms(150), rejected(2, ms(50), ms(250))},
		{ms(1000), allowed(2, 2, ms(100), 0)},
		// Clock steps back: the wait grows by the step.
		{ms(950), allowed(2, 0, ms(250), ms(150))},
	})
}

func TestLeakyBucketZeroBurst(t *testing.T) {
	// No queue: one request at a time, never held.
	runSteps(t, gcraTaker(bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 0}), []step{
		{0, allowed(0, 0, ms(100), 0)},
		{ms(50), rejected(0, ms(50), ms(50))},
		{ms(100), allowed(0, 0, ms(100), 0)},
	})
}

func TestGCRARejectionKeepsState(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}
	now := t0.UnixNano()
	tat, _ := bucket.GCRA(0, now, l)
	got, r := bucket.GCRA(tat, now, l)
	if r.Allowed || got != tat {
		t.Errorf("second request at one instant with Burst 1: got Allowed=%v tat=%d, want false %d", r.Allowed, got, tat)
	}
}

func TestGCRAIdle(t *testing.T) {
	now := t0.UnixNano()
	for _, tc := range []struct {
		tat  int64
		want bool
	}{{0, true}, {now - 1, true}, {now, true}, {now + 1, false}} {
		if got := bucket.GCRAIdle(tc.tat, now); got != tc.want {
			t.Errorf("GCRAIdle(now%+d): got %v, want %v", tc.tat-now, got, tc.want)
		}
	}
}

// TestGCRAUpperBound drives random arrivals, including instants repeated and a clock stepping
// back, and checks the GCRA bound on the timeline of the largest instant seen so far: any
// interval [a, b] holds at most tau/T + (b-a)/T admitted requests. For the leaky bucket it also
// checks that released requests (instant + Wait) are at least T apart and never wait over
// Burst*T.
func TestGCRAUpperBound(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
		for _, alg := range []bucket.Algorithm{bucket.TokenBucket, bucket.LeakyBucket} {
			// Burst 0 is covered for the leaky bucket only: such a token bucket admits nothing.
			l := bucket.Limit{Algorithm: alg, Rate: 0.5 + rng.Float64()*50, Burst: rng.Int64N(8)}
			if alg == bucket.TokenBucket {
				l.Burst++
			}
			period, tau := bucket.GCRAParams(l)
			var (
				tat          int64
				now          = t0.UnixNano()
				latest       = int64(math.MinInt64) // the largest instant a request has had
				seen, starts []int64
			)
			for range 2000 {
				switch rng.IntN(10) {
				case 0:
					now -= rng.Int64N(3 * period) // the clock steps back
				case 1, 2: // the same instant again
				default:
					now += rng.Int64N(period)
				}
				latest = max(latest, now)
				next, r := bucket.GCRA(tat, now, l)
				if !r.Allowed {
					if r.RetryAfter <= 0 || r.Remaining != 0 || r.Reset < 0 {
						t.Fatalf("seed %d: rejection with RetryAfter %v Remaining %d Reset %v, want >0, 0, >=0",
							seed, r.RetryAfter, r.Remaining, r.Reset)
					}
					continue
				}
				tat = next
				seen = append(seen, latest)
				starts = append(starts, now+int64(r.Wait))
				if r.Remaining < 0 || int64(r.Wait) > max(l.Burst, 0)*period {
					t.Fatalf("seed %d: admitted with Remaining %d Wait %v", seed, r.Remaining, r.Wait)
				}
			}
			perT := tau / period
			for i := range seen {
				for j := i; j < len(seen); j++ {
					if n, limit := int64(j-i+1), perT+(seen[j]-seen[i])/period; n > limit {
						t.Fatalf("seed %d algorithm %d: %d admitted in [%d, %d]ns, want <= %d",
							seed, alg, n, seen[i]-seen[0], seen[j]-seen[0], limit)
					}
				}
			}
			if alg == bucket.LeakyBucket {
				for i := 1; i < len(starts); i++ {
					if d := starts[i] - starts[i-1]; d < period {
						t.Fatalf("seed %d: released %dns after the previous, want >= T = %d", seed, d, period)
					}
				}
			}
			if len(seen) < 100 {
				t.Errorf("seed %d algorithm %d: only %d of 2000 admitted; the test exercises too little", seed, alg, len(seen))
			}
		}
	}
}

// TestGCRASteadyRatePasses checks the bucket is not stricter than its rate: requests exactly T
// apart all pass, even with Burst 1.
func TestGCRASteadyRatePasses(t *testing.T) {
	for _, alg := range []bucket.Algorithm{bucket.TokenBucket, bucket.LeakyBucket} {
		l := bucket.Limit{Algorithm: alg, Rate: 7, Burst: 1}
		period, _ := bucket.GCRAParams(l)
		var tat int64
		for i := range int64(10_000) {
			next, r := bucket.GCRA(tat, t0.UnixNano()+i*period, l)
			if !r.Allowed || r.Wait != 0 {
				t.Fatalf("algorithm %d: request %d at i*T: got Allowed=%v Wait %v, want true 0", alg, i, r.Allowed, r.Wait)
			}
			tat = next
		}
	}
}
