package bucket_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestResultsPredictTheNextRequest checks, along random request streams (clock moving
// forward only), that every verdict tells the truth about the next request of the same key:
// after a rejection, a request exactly RetryAfter later is admitted and one 1ns earlier is not;
// and Reset (admitted or not) is the first instant at which the state is idle, i.e. the quota is
// full again.
func TestResultsPredictTheNextRequest(t *testing.T) {
	type algo struct {
		l    bucket.Limit
		take func(st any, now int64, l bucket.Limit) (any, bucket.Result)
		idle func(st any, now int64) bool
		zero any
	}
	gcra := func(st any, now int64, l bucket.Limit) (any, bucket.Result) { return bucket.GCRA(st.(int64), now, l) }
	gcraIdle := func(st any, now int64) bool { return bucket.GCRAIdle(st.(int64), now) }
	fixed := func(st any, now int64, l bucket.Limit) (any, bucket.Result) {
		return bucket.Fixed(st.(bucket.FixedState), now, l)
	}
	fixedIdle := func(st any, now int64) bool { return st.(bucket.FixedState).Idle(now) }
	sliding := func(st any, now int64, l bucket.Limit) (any, bucket.Result) {
		return bucket.Sliding(st.(bucket.SlidingState), now, l)
	}
	slidingIdle := func(st any, now int64) bool { s := st.(bucket.SlidingState); return s.Idle(now) }
	algos := []algo{
		{bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 3, Burst: 4}, gcra, gcraIdle, int64(0)},
		{bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 0.5, Burst: 1}, gcra, gcraIdle, int64(0)},
		{bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 7, Burst: 3}, gcra, gcraIdle, int64(0)},
		{bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: 700 * time.Millisecond}, fixed, fixedIdle, bucket.FixedState{}},
		{bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 5, Window: time.Second}, sliding, slidingIdle, bucket.SlidingState{}},
		{bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 7, Window: 1234567 * time.Nanosecond}, sliding, slidingIdle, bucket.SlidingState{}},
	}
	for ai, a := range algos {
		t.Run(fmt.Sprint(ai), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ai), 3))
			st := a.zero
			now := t0.UnixNano()
			span := int64(2 * time.Second)
			if a.l.Window > 0 {
				span = int64(a.l.Window)
			}
			for step := range 20_000 {
				now += rng.Int64N(span / 8)
				next, r := a.take(st, now, a.l)
				if r.Allowed {
					st = next
				} else {
					if _, r2 := a.take(st, now+int64(r.RetryAfter), a.l); !r2.Allowed {
						t.Fatalf("step %d: rejected %+v, then rejected again after RetryAfter: %+v", step, r, r2)
					}
					if _, r2 := a.take(st, now+int64(r.RetryAfter)-1, a.l); r2.Allowed {
						t.Fatalf("step %d: rejected %+v, but admitted 1ns before RetryAfter", step, r)
					}
				}
				if !a.idle(st, now+int64(r.Reset)) {
					t.Fatalf("step %d: %+v: state %+v not idle at Reset", step, r, st)
				}
				if r.Reset > 0 && a.idle(st, now+int64(r.Reset)-1) {
					t.Fatalf("step %d: %+v: state %+v already idle 1ns before Reset", step, r, st)
				}
			}
		})
	}
}
