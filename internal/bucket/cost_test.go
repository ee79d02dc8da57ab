package bucket_test

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The N forms spend n requests at once, all or nothing. A rejection's Remaining says what is
// left (less than n), and its RetryAfter when all n fit.

func gcraTakerN(l bucket.Limit) func(int64, int64) bucket.Result {
	var tat int64
	return func(now, n int64) bucket.Result {
		next, r := bucket.GCRAN(tat, now, l, n)
		if r.Allowed {
			tat = next
		}
		return r
	}
}

type costStep struct {
	at   time.Duration
	n    int64
	want bucket.Result
}

func runCostSteps(t *testing.T, take func(now, n int64) bucket.Result, steps []costStep) {
	t.Helper()
	for i, s := range steps {
		if got := take(t0.Add(s.at).UnixNano(), s.n); got != s.want {
			t.Errorf("step %d at t0+%v cost %d:\n got %+v\nwant %+v", i, s.at, s.n, got, s.want)
		}
	}
}

func withRemaining(r bucket.Result, n int64) bucket.Result { r.Remaining = n; return r }

func TestTokenBucketCost(t *testing.T) {
	// T = 100ms, tau = 500ms.
	take := gcraTakerN(bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 5})
	runCostSteps(t, take, []costStep{
		{0, 2, allowed(5, 3, ms(200), 0)},
		{0, 2, allowed(5, 1, ms(400), 0)},
		// 2 do not fit beside the 4 taken; 1 would. Both fit again once one has refilled.
		{0, 2, withRemaining(rejected(5, ms(100), ms(400)), 1)},
		{ms(100), 2, allowed(5, 0, ms(500), 0)},
		{ms(100), 1, rejected(5, ms(100), ms(500))},
		// A cost above the burst never fits: the wait is past a full bucket.
		{sec(10), 6, withRemaining(rejected(5, ms(100), 0), 5)},
		{sec(10), 5, allowed(5, 0, ms(500), 0)},
	})
}

func TestLeakyBucketCost(t *testing.T) {
	// T = 100ms; one in service plus Burst 3 waiting: tau = 400ms.
	take := gcraTakerN(bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 3})
	runCostSteps(t, take, []costStep{
		{0, 2, allowed(3, 2, ms(200), 0)},
		{0, 2, allowed(3, 0, ms(400), ms(200))},
		{0, 1, rejected(3, ms(100), ms(400))},
		{ms(200), 2, allowed(3, 0, ms(400), ms(200))},
	})
}

func TestFixedWindowCost(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Minute}
	var s bucket.FixedState
	take := func(now, n int64) bucket.Result {
		next, r := bucket.FixedN(s, now, l, n)
		if r.Allowed {
			s = next
		}
		return r
	}
	runCostSteps(t, take, []costStep{
		{0, 2, allowed(5, 3, sec(60), 0)},
		{sec(1), 2, allowed(5, 1, sec(59), 0)},
		{sec(2), 2, withRemaining(rejected(5, sec(58), sec(58)), 1)},
		{sec(2), 1, allowed(5, 0, sec(58), 0)},
		{sec(60), 5, allowed(5, 0, sec(60), 0)},
	})
}

func TestSlidingWindowCost(t *testing.T) {
	// Slots of 1s; a request counts until 11 slots after its own starts.
	l := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 5, Window: 10 * time.Second}
	var s bucket.SlidingState
	take := func(now, n int64) bucket.Result {
		next, r := bucket.SlidingN(s, now, l, n)
		if r.Allowed {
			s = next
		}
		return r
	}
	runCostSteps(t, take, []costStep{
		{0, 3, allowed(5, 2, sec(11), 0)},
		{sec(1), 1, allowed(5, 1, sec(11), 0)},
		// 3 fit only once slot 0 (3) has left, at 11s; slot 1's one stays counted.
		{sec(2), 3, withRemaining(rejected(5, sec(9), sec(10)), 1)},
		// Two do not fit beside the four counted either: they wait for slot 0 too.
		{sec(2), 2, withRemaining(rejected(5, sec(9), sec(10)), 1)},
		{sec(11), 3, allowed(5, 1, sec(11), 0)},
	})
}

func TestQuotaCost(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.Quota, Count: 10, Period: bucket.Day}
	take := quotaTaker(l, 5)
	noon := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	for i, want := range []bucket.Result{
		allowed(10, 5, 12*time.Hour, 0),
		allowed(10, 0, 12*time.Hour, 0),
		rejected(10, 12*time.Hour, 12*time.Hour),
	} {
		if got := take(noon.UnixNano()); got != want {
			t.Errorf("take %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
}

// TestGiveBacksGiveTheWholeCost: charge_on give-backs of a weighted charge give back all of its cost,
// under the same conditions as one of cost 1, and never more than was counted.
func TestGiveBacksGiveTheWholeCost(t *testing.T) {
	now := t0.UnixNano()
	// Token bucket, T = 100ms: a cost-3 charge added 300ms; while nothing wrote since, all of it
	// comes back; after another write, none.
	token := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 5}
	tat, _ := bucket.GCRAN(0, now, token, 3)
	if got, ok := bucket.GCRAGiveBackN(tat, tat, token, 3); !ok || got != now {
		t.Errorf("token refund with nothing written since: got %v %v, want %d true", got, ok, now)
	}
	later, _ := bucket.GCRAN(tat, now+int64(ms(250)), token, 1)
	if _, ok := bucket.GCRAGiveBackN(later, tat, token, 3); ok {
		t.Errorf("token refund after another write: got true, want false")
	}
	quota := bucket.Limit{Algorithm: bucket.Quota, Count: 10, Period: bucket.Day}
	s, _ := bucket.QuotaN(bucket.FixedState{}, now, quota, 4)
	if got, ok := bucket.QuotaGiveBackN(s, now, quota, 4); !ok || got.Count != 0 {
		t.Errorf("quota refund in the period: got %+v %v, want count 0", got, ok)
	}
	if _, ok := bucket.QuotaGiveBackN(s, now, quota, 5); ok {
		t.Errorf("quota refund of more than was counted: got true, want false")
	}
	if _, ok := bucket.QuotaGiveBackN(s, now-int64(48*time.Hour), quota, 4); ok {
		t.Errorf("quota refund of a charge taken in another period: got true, want false")
	}
	fixed := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Minute}
	fs, _ := bucket.FixedN(bucket.FixedState{}, now, fixed, 4)
	if got, ok := bucket.FixedGiveBackN(fs, now, fixed, 4); !ok || got.Count != 0 {
		t.Errorf("fixed refund: got %+v %v, want count 0", got, ok)
	}
	sliding := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 10, Window: 10 * time.Second}
	ss, _ := bucket.SlidingN(bucket.SlidingState{}, now, sliding, 4)
	if got, ok := bucket.SlidingGiveBackN(ss, now, sliding, 4); !ok || got.Counts != (bucket.SlidingState{}).Counts {
		t.Errorf("sliding refund: got %+v %v, want every counter 0", got, ok)
	}
}
