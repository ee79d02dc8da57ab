package bucket_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestTokenBucketRoundingBound: a token bucket must admit at most Burst + Rate*t in any
// interval of length t, at every rate validation allows. When GCRAParams rounded T = 1e9/Rate to
// the nearest nanosecond, a T rounded down refilled faster than Rate: 3e8/s admitted 11% too
// many, 7e8/s (T 1.43 -> 1) 43%. T is now rounded up, at most 1ns per request stricter.
func TestTokenBucketRoundingBound(t *testing.T) {
	for _, rate := range []float64{300_000, 3e6, 3e8, 7e8} {
		t.Run(fmt.Sprint(rate), func(t *testing.T) {
			l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: rate, Burst: 1}
			span := int64(2e6 / rate * 1e9) // about two million requests
			start := t0.UnixNano()
			var tat int64
			admitted := int64(0)
			// A client that retries exactly after RetryAfter: every request it sends conforms.
			for now := start; now <= start+span; {
				next, r := bucket.GCRA(tat, now, l)
				if r.Allowed {
					admitted++
					tat = next
					continue
				}
				now += int64(r.RetryAfter)
			}
			bound := l.Burst + int64(rate*float64(span)/1e9)
			if admitted > bound {
				t.Errorf("got %d admitted in %v, want at most burst+rate*t = %d", admitted, time.Duration(span), bound)
			}
		})
	}
}

// TestGCRAStateOutlivesLoosenedLimit pins what a reload (or a new override) that shortens
// a bucket's refill time does to a client who had drained the old bucket: tat stays where the
// old limit put it, so the client is rejected for up to the old burst/rate (at most 366 days by
// validation) although the new limit would have refilled in a second. Here 60/h drained, then
// 100/s burst 100: still rejected a minute later, told to come back in almost an hour.
func TestGCRAStateOutlivesLoosenedLimit(t *testing.T) {
	old := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 60.0 / 3600, Burst: 60}
	now := t0.UnixNano()
	var tat int64
	for range 60 {
		var r bucket.Result
		tat, r = bucket.GCRA(tat, now, old)
		if !r.Allowed {
			t.Fatal("the old limit rejected within its burst")
		}
	}
	loosened := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 100}
	_, r := bucket.GCRA(tat, now+int64(time.Minute), loosened)
	if r.Allowed {
		t.Fatalf("got admitted a minute after the reload: the behaviour pinned here changed (good), update the review note")
	}
	if want := time.Hour - time.Minute - time.Second + 10*time.Millisecond; r.RetryAfter != want {
		t.Errorf("got RetryAfter %v, want %v", r.RetryAfter, want)
	}
}

// TestFixedStateOutlivesShortenedWindow pins the same for a fixed window made shorter by a
// reload: the count of the old (longer) window is kept until that window ends, so 1000/h drained
// then 100/m stays rejected for the rest of the hour.
func TestFixedStateOutlivesShortenedWindow(t *testing.T) {
	old := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1000, Window: time.Hour}
	hour := t0.Truncate(time.Hour).UnixNano()
	s := bucket.FixedState{}
	for range 1000 {
		var r bucket.Result
		s, r = bucket.Fixed(s, hour, old)
		if !r.Allowed {
			t.Fatal("the old limit rejected within its count")
		}
	}
	shorter := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Minute}
	_, r := bucket.Fixed(s, hour+int64(5*time.Minute), shorter)
	if r.Allowed || r.RetryAfter != 55*time.Minute {
		t.Errorf("five minutes into the new 1m windows: got %+v, want rejected with RetryAfter 55m (pinned)", r)
	}
}
