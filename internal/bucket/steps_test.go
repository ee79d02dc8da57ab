package bucket_test

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// t0 is the reference instant of the step tables: a multiple of a minute since the Unix epoch,
// so windows of up to a minute that divide one start at t0.
var t0 = time.Unix(1_700_000_040, 0)

// step is one request at t0+at and the verdict it must get.
type step struct {
	at   time.Duration
	want bucket.Result
}

// runSteps feeds each step's instant (Unix ns) to take, which applies one algorithm to state it
// keeps, and compares every Result field.
func runSteps(t *testing.T, take func(now int64) bucket.Result, steps []step) {
	t.Helper()
	for i, s := range steps {
		if got := take(t0.Add(s.at).UnixNano()); got != s.want {
			t.Errorf("step %d at t0+%v:\n got %+v\nwant %+v", i, s.at, got, s.want)
		}
	}
}

// gcraTaker applies GCRA to a state of its own, storing the new state only when allowed, as a
// store does.
func gcraTaker(l bucket.Limit) func(int64) bucket.Result {
	var tat int64
	return func(now int64) bucket.Result {
		next, r := bucket.GCRA(tat, now, l)
		if r.Allowed {
			tat = next
		}
		return r
	}
}

func fixedTaker(l bucket.Limit) func(int64) bucket.Result {
	var s bucket.FixedState
	return func(now int64) bucket.Result {
		next, r := bucket.Fixed(s, now, l)
		if r.Allowed {
			s = next
		}
		return r
	}
}

func slidingTaker(l bucket.Limit) func(int64) bucket.Result {
	var s bucket.SlidingState
	return func(now int64) bucket.Result {
		next, r := bucket.Sliding(s, now, l)
		if r.Allowed {
			s = next
		}
		return r
	}
}

func ms(n int) time.Duration  { return time.Duration(n) * time.Millisecond }
func sec(n int) time.Duration { return time.Duration(n) * time.Second }

// allowed and rejected build expected Results.
func allowed(limit, remaining int64, reset, wait time.Duration) bucket.Result {
	return bucket.Result{Allowed: true, Limit: limit, Remaining: remaining, Reset: reset, Wait: wait}
}

func rejected(limit int64, retryAfter, reset time.Duration) bucket.Result {
	return bucket.Result{Limit: limit, RetryAfter: retryAfter, Reset: reset}
}
