// Package buckettest is the conformance suite of bucket.Store.
//
// It is the conformance suite every bucket.Store implementation runs: the
// algorithms' key behaviours at fixed instants, the group semantics of Store.Take, key
// independence and exactness under concurrency, all through the Store interface only.
package buckettest

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the quota tests' named zones, whatever the machine has installed

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// base is the suite's reference instant. It is a multiple of a minute since the Unix epoch, so
// windows of up to a minute that divide one start at base.
var base = time.Unix(1_700_000_040, 0)

// Run runs the suite against the stores newStore returns. newStore is called once per subtest
// and may return the same store every time (a shared table): every subtest uses fresh random
// keys, so no subtest sees another's state.
func Run(t *testing.T, newStore func(t *testing.T) bucket.Store) {
	t.Run("TokenBucket", func(t *testing.T) { testTokenBucket(t, newStore(t)) })
	t.Run("LeakyBucket", func(t *testing.T) { testLeakyBucket(t, newStore(t)) })
	t.Run("FixedWindow", func(t *testing.T) { testFixedWindow(t, newStore(t)) })
	t.Run("SlidingWindow", func(t *testing.T) { testSlidingWindow(t, newStore(t)) })
	t.Run("Quota", func(t *testing.T) { testQuota(t, newStore(t)) })
	t.Run("QuotaDST", func(t *testing.T) { testQuotaDST(t, newStore(t)) })
	t.Run("Cost", func(t *testing.T) { testCost(t, newStore(t)) })
	t.Run("CostAllOrNothing", func(t *testing.T) { testCostAllOrNothing(t, newStore(t)) })
	t.Run("RejectedGroupCommitsNothing", func(t *testing.T) { testRejectedGroup(t, newStore(t)) })
	t.Run("ShadowOverLimit", func(t *testing.T) { testShadowOverLimit(t, newStore(t)) })
	t.Run("ShadowWithinLimit", func(t *testing.T) { testShadowWithinLimit(t, newStore(t)) })
	t.Run("KeysAreIndependent", func(t *testing.T) { testIndependentKeys(t, newStore(t)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceledContext(t, newStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore) })
}

// NewKey returns a random key, so that subtests sharing a store never share state.
func NewKey(t testing.TB) bucket.Key {
	t.Helper()
	var k bucket.Key
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatalf("random key: %v", err)
	}
	return k
}

var (
	// T = 100ms, tau = 300ms.
	tokenLimit = bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 3}
	// T = 100ms, two may wait behind the one served.
	leakyLimit = bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 2}
	fixedLimit = bucket.Limit{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Minute}
	// Slot width 1s.
	slidingLimit = bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 3, Window: 10 * time.Second}
)

// step is one Take of a single charge at base+at and the verdict it must return.
type step struct {
	at       time.Duration
	admitted bool
	want     bucket.Result
}

// runSteps takes one charge per step on the key and compares the admission and every Result
// field.
func runSteps(t *testing.T, s bucket.Store, c bucket.Charge, steps []step) {
	t.Helper()
	for i, st := range steps {
		admitted, got := take(t, s, base.Add(st.at), c)
		if admitted != st.admitted || !same(got, st.want) {
			t.Errorf("step %d at base+%v: got admitted=%v %+v, want admitted=%v %+v",
				i, st.at, admitted, got, st.admitted, st.want)
		}
	}
}

// take takes one charge at now and fails the test on a store error.
func take(t *testing.T, s bucket.Store, now time.Time, c bucket.Charge) (bool, bucket.Result) {
	t.Helper()
	var r [1]bucket.Result
	admitted, err := s.Take(context.Background(), now, []bucket.Charge{c}, r[:])
	if err != nil {
		t.Fatalf("Take at %v: %v", now, err)
	}
	return admitted, r[0]
}

// takeGroup takes a group at now and fails the test on a store error.
func takeGroup(t *testing.T, s bucket.Store, now time.Time, cs ...bucket.Charge) (bool, []bucket.Result) {
	t.Helper()
	r := make([]bucket.Result, len(cs))
	admitted, err := s.Take(context.Background(), now, cs, r)
	if err != nil {
		t.Fatalf("Take group at %v: %v", now, err)
	}
	return admitted, r
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func testTokenBucket(t *testing.T, s bucket.Store) {
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: tokenLimit}, []step{
		// A fresh bucket admits exactly Burst at one instant.
		{0, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: ms(100)}},
		{0, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 1, Reset: ms(200)}},
		{0, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 0, Reset: ms(300)}},
		{0, false, bucket.Result{Limit: 3, RetryAfter: ms(100), Reset: ms(300)}},
		{ms(50), false, bucket.Result{Limit: 3, RetryAfter: ms(50), Reset: ms(250)}},
		// Then one per T.
		{ms(100), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 0, Reset: ms(300)}},
		{ms(100), false, bucket.Result{Limit: 3, RetryAfter: ms(100), Reset: ms(300)}},
		// Full again once tat has passed.
		{ms(1000), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: ms(100)}},
	})
}

func testLeakyBucket(t *testing.T, s bucket.Store) {
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: leakyLimit}, []step{
		// Burst+1 pass at one instant, each waiting one T longer.
		{0, true, bucket.Result{Allowed: true, Limit: 2, Remaining: 2, Reset: ms(100)}},
		{0, true, bucket.Result{Allowed: true, Limit: 2, Remaining: 1, Reset: ms(200), Wait: ms(100)}},
		{0, true, bucket.Result{Allowed: true, Limit: 2, Remaining: 0, Reset: ms(300), Wait: ms(200)}},
		{0, false, bucket.Result{Limit: 2, RetryAfter: ms(100), Reset: ms(300)}},
		// A place frees every T.
		{ms(100), true, bucket.Result{Allowed: true, Limit: 2, Remaining: 0, Reset: ms(300), Wait: ms(200)}},
		{ms(150), false, bucket.Result{Limit: 2, RetryAfter: ms(50), Reset: ms(250)}},
		{ms(1000), true, bucket.Result{Allowed: true, Limit: 2, Remaining: 2, Reset: ms(100)}},
	})
}

func testFixedWindow(t *testing.T, s bucket.Store) {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: fixedLimit}, []step{
		{sec(10), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: sec(50)}},
		{sec(10), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 1, Reset: sec(50)}},
		{sec(20), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 0, Reset: sec(40)}},
		{sec(30), false, bucket.Result{Limit: 3, RetryAfter: sec(30), Reset: sec(30)}},
		{sec(59), false, bucket.Result{Limit: 3, RetryAfter: sec(1), Reset: sec(1)}},
		// Rollover: the next window starts from zero.
		{sec(60), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: sec(60)}},
		{sec(119), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 1, Reset: sec(1)}},
		{sec(180), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: sec(60)}},
	})
}

func testSlidingWindow(t *testing.T, s bucket.Store) {
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: slidingLimit}, []step{
		// Count at the end of a window...
		{ms(9500), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: ms(10500)}},
		{ms(9500), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 1, Reset: ms(10500)}},
		{ms(9500), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 0, Reset: ms(10500)}},
		// ...then nothing passes at the start of the next (a fixed window would admit here)...
		{ms(10500), false, bucket.Result{Limit: 3, RetryAfter: ms(9500), Reset: ms(9500)}},
		{ms(19999), false, bucket.Result{Limit: 3, RetryAfter: ms(1), Reset: ms(1)}},
		// ...until those requests have left.
		{ms(20000), true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: ms(11000)}},
	})
}

func testRejectedGroup(t *testing.T, s bucket.Store) {
	plenty := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}}
	window := bucket.Charge{Key: NewKey(t), Limit: fixedLimit}
	exhausted := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}}
	if admitted, _ := take(t, s, base, exhausted); !admitted {
		t.Fatalf("first take of a fresh Burst 1 bucket: got rejected, want admitted")
	}
	// A conforming shadow charge in a rejected group is not committed either.
	shadow := bucket.Charge{Key: NewKey(t), Limit: tokenLimit, Shadow: true}
	admitted, r := takeGroup(t, s, base, plenty, window, exhausted, shadow)
	if admitted {
		t.Fatalf("group with an exhausted charge: got admitted, want rejected")
	}
	for i, want := range []bool{true, true, false, true} {
		if r[i].Allowed != want {
			t.Errorf("charge %d: got Allowed=%v, want %v", i, r[i].Allowed, want)
		}
	}
	// Nothing of the other charges was spent: they report a fresh bucket's first request.
	for _, c := range []struct {
		name   string
		charge bucket.Charge
		want   int64
	}{{"plenty", plenty, 9}, {"window", window, 2}, {"shadow", shadow, 2}} {
		if _, got := take(t, s, base, c.charge); got.Remaining != c.want {
			t.Errorf("%s after the rejected group: got Remaining %d, want %d", c.name, got.Remaining, c.want)
		}
	}
}

func testShadowOverLimit(t *testing.T, s bucket.Store) {
	normal := bucket.Charge{Key: NewKey(t), Limit: tokenLimit}
	shadow := bucket.Charge{Key: NewKey(t), Limit: fixedLimit, Shadow: true}
	for range 3 {
		take(t, s, base, shadow)
	}
	if _, r := take(t, s, base, shadow); r.Allowed {
		t.Fatalf("shadow window after Count takes: got Allowed, want not")
	}
	admitted, r := takeGroup(t, s, base, normal, shadow)
	if !admitted {
		t.Errorf("group with a shadow charge over its limit: got rejected, want admitted")
	}
	if !r[0].Allowed || r[1].Allowed {
		t.Errorf("got Allowed %v, %v, want true, false", r[0].Allowed, r[1].Allowed)
	}
	// The normal charge was committed.
	if _, got := take(t, s, base, normal); got.Remaining != 1 {
		t.Errorf("normal charge after the group: got Remaining %d, want 1", got.Remaining)
	}
	// The shadow charge still reports the same rejection: its window holds exactly Count.
	want := bucket.Result{Limit: 3, RetryAfter: 20 * time.Second, Reset: 20 * time.Second}
	if _, got := take(t, s, base.Add(40*time.Second), shadow); got != want {
		t.Errorf("shadow charge after the group: got %+v, want %+v", got, want)
	}
	// And the next window is fresh.
	if _, got := take(t, s, base.Add(time.Minute), shadow); got.Remaining != 2 {
		t.Errorf("shadow charge in the next window: got Remaining %d, want 2", got.Remaining)
	}
}

func testShadowWithinLimit(t *testing.T, s bucket.Store) {
	normal := bucket.Charge{Key: NewKey(t), Limit: fixedLimit}
	shadow := bucket.Charge{Key: NewKey(t), Limit: slidingLimit, Shadow: true}
	admitted, r := takeGroup(t, s, base, normal, shadow)
	if !admitted || !r[0].Allowed || !r[1].Allowed {
		t.Fatalf("got admitted=%v Allowed %v, %v, want all true", admitted, r[0].Allowed, r[1].Allowed)
	}
	if r[1].Remaining != 2 {
		t.Errorf("shadow result: got Remaining %d, want 2", r[1].Remaining)
	}
	// The conforming shadow charge was committed.
	if _, got := take(t, s, base, shadow); got.Remaining != 1 {
		t.Errorf("shadow charge after the group: got Remaining %d, want 1", got.Remaining)
	}
}

func testIndependentKeys(t *testing.T, s bucket.Store) {
	for _, tc := range []struct {
		limit bucket.Limit
		fresh int64 // Remaining after a fresh key's first request
	}{{tokenLimit, 2}, {leakyLimit, 2}, {fixedLimit, 2}, {slidingLimit, 2}} {
		a, b := bucket.Charge{Key: NewKey(t), Limit: tc.limit}, bucket.Charge{Key: NewKey(t), Limit: tc.limit}
		exhausted := false
		for range 100 {
			if admitted, _ := take(t, s, base, a); !admitted {
				exhausted = true
				break
			}
		}
		if !exhausted {
			t.Fatalf("algorithm %d: 100 takes at one instant never rejected", tc.limit.Algorithm)
		}
		if admitted, r := take(t, s, base, b); !admitted || r.Remaining != tc.fresh {
			t.Errorf("algorithm %d: fresh key after another was exhausted: got admitted=%v Remaining %d, want true %d",
				tc.limit.Algorithm, admitted, r.Remaining, tc.fresh)
		}
	}
}

func testCanceledContext(t *testing.T, s bucket.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}}
	var r [1]bucket.Result
	admitted, err := s.Take(ctx, base, []bucket.Charge{c}, r[:])
	if !errors.Is(err, context.Canceled) || admitted {
		t.Fatalf("Take with a canceled context: got admitted=%v err=%v, want false and context.Canceled", admitted, err)
	}
	// And nothing was spent.
	if admitted, _ := take(t, s, base, c); !admitted {
		t.Errorf("first take after the canceled one: got rejected, want admitted")
	}
}

// testConcurrent hammers one key per algorithm from many goroutines at one instant: exactly the
// limit must pass, no more and no fewer.
func testConcurrent(t *testing.T, newStore func(t *testing.T) bucket.Store) {
	const goroutines, each = 16, 8
	for _, tc := range []struct {
		name  string
		limit bucket.Limit
		want  int64
	}{
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 50}, 50},
		{"LeakyBucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 50}, 51},
		{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 50, Window: time.Minute}, 50},
		{"SlidingWindow", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 50, Window: time.Minute}, 50},
		{"Quota", bucket.Limit{Algorithm: bucket.Quota, Count: 50, Period: bucket.Month}, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			c := []bucket.Charge{{Key: NewKey(t), Limit: tc.limit}}
			var (
				wg       sync.WaitGroup
				admitted atomic.Int64
				failed   atomic.Pointer[error]
			)
			for range goroutines {
				wg.Go(func() {
					var r [1]bucket.Result
					for range each {
						ok, err := s.Take(context.Background(), base, c, r[:])
						if err != nil {
							failed.Store(&err)
							return
						}
						if ok {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if err := failed.Load(); err != nil {
				t.Fatalf("Take: %v", *err)
			}
			if got := admitted.Load(); got != tc.want {
				t.Errorf("%d goroutines x %d takes at one instant: got %d admitted, want %d",
					goroutines, each, got, tc.want)
			}
		})
	}
}

// at is a step of a test with absolute instants: one charge of cost n at instant when.
type at struct {
	when     time.Time
	n        int64
	admitted bool
	want     bucket.Result
}

// runAt takes c with each step's cost at its instant and compares the admission and every
// Result field.
func runAt(t *testing.T, s bucket.Store, c bucket.Charge, steps []at) {
	t.Helper()
	for i, st := range steps {
		c.Cost = st.n
		admitted, got := take(t, s, st.when, c)
		got.Token = 0 // opaque, what the store needs to give the charge back
		if admitted != st.admitted || got != st.want {
			t.Errorf("step %d at %v cost %d: got admitted=%v %+v, want admitted=%v %+v",
				i, st.when.UTC(), st.n, admitted, got, st.admitted, st.want)
		}
	}
}

func date(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func zone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// testQuota: a monthly quota of 3 across the end of a leap February; every Reset points at the
// next month's first instant, and March starts from zero.
func testQuota(t *testing.T, s bucket.Store) {
	l := bucket.Limit{Algorithm: bucket.Quota, Count: 3, Period: bucket.Month}
	end := date(t, "2024-03-01T00:00:00Z")
	day := 24 * time.Hour
	runAt(t, s, bucket.Charge{Key: NewKey(t), Limit: l}, []at{
		{end.Add(-28 * day), 1, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: 28 * day}},
		{end.Add(-time.Second), 1, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 1, Reset: time.Second}},
		{end.Add(-time.Second), 1, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 0, Reset: time.Second}},
		{end.Add(-time.Millisecond), 1, false, bucket.Result{Limit: 3, RetryAfter: time.Millisecond, Reset: time.Millisecond}},
		{end, 1, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2, Reset: 31 * day}},
		{end.Add(30 * day), 1, true, bucket.Result{Allowed: true, Limit: 3, Remaining: 1, Reset: day}},
	})
}

// testQuotaDST: a daily quota of 2 in Berlin on the day clocks go forward (23 hours), and a
// weekly one from Monday in New York across its spring-forward Sunday.
func testQuotaDST(t *testing.T, s bucket.Store) {
	berlin, ny := zone(t, "Europe/Berlin"), zone(t, "America/New_York")
	day := bucket.Limit{Algorithm: bucket.Quota, Count: 2, Period: bucket.Day, Zone: berlin}
	midnight := date(t, "2024-03-30T23:00:00Z") // 2024-03-31 00:00 CET
	runAt(t, s, bucket.Charge{Key: NewKey(t), Limit: day}, []at{
		{midnight, 1, true, bucket.Result{Allowed: true, Limit: 2, Remaining: 1, Reset: 23 * time.Hour}},
		{midnight.Add(22 * time.Hour), 1, true, bucket.Result{Allowed: true, Limit: 2, Remaining: 0, Reset: time.Hour}},
		{midnight.Add(22 * time.Hour), 1, false, bucket.Result{Limit: 2, RetryAfter: time.Hour, Reset: time.Hour}},
		{midnight.Add(23 * time.Hour), 1, true, bucket.Result{Allowed: true, Limit: 2, Remaining: 1, Reset: 24 * time.Hour}},
	})
	week := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Week, Offset: 1, Zone: ny}
	monday := date(t, "2024-03-04T05:00:00Z") // 00:00 EST
	runAt(t, s, bucket.Charge{Key: NewKey(t), Limit: week}, []at{
		{monday.Add(time.Hour), 1, true, bucket.Result{Allowed: true, Limit: 1, Remaining: 0, Reset: 7*24*time.Hour - 2*time.Hour}},
		{monday.Add(6 * 24 * time.Hour), 1, false, bucket.Result{Limit: 1, RetryAfter: 23 * time.Hour, Reset: 23 * time.Hour}},
		{monday.Add(7*24*time.Hour - time.Hour), 1, true, bucket.Result{Allowed: true, Limit: 1, Remaining: 0, Reset: 7 * 24 * time.Hour}},
	})
}

// testCost: weighted charges on every algorithm spend their cost all or nothing; a rejection
// reports what is left (less than the cost) and when all of the cost fits.
func testCost(t *testing.T, s bucket.Store) {
	// T = 100ms, tau = 500ms.
	token := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 5}
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: token, Cost: 2}, []step{
		{0, true, bucket.Result{Allowed: true, Limit: 5, Remaining: 3, Reset: ms(200)}},
		{0, true, bucket.Result{Allowed: true, Limit: 5, Remaining: 1, Reset: ms(400)}},
		{0, false, bucket.Result{Limit: 5, Remaining: 1, RetryAfter: ms(100), Reset: ms(400)}},
		{ms(100), true, bucket.Result{Allowed: true, Limit: 5, Remaining: 0, Reset: ms(500)}},
	})
	fixed := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Minute}
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: fixed, Cost: 2}, []step{
		{sec(10), true, bucket.Result{Allowed: true, Limit: 5, Remaining: 3, Reset: sec(50)}},
		{sec(20), true, bucket.Result{Allowed: true, Limit: 5, Remaining: 1, Reset: sec(40)}},
		{sec(30), false, bucket.Result{Limit: 5, Remaining: 1, RetryAfter: sec(30), Reset: sec(30)}},
		{sec(60), true, bucket.Result{Allowed: true, Limit: 5, Remaining: 3, Reset: sec(60)}},
	})
	// Slots of 1s; a request counts until 11 slots after its own starts.
	sliding := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 5, Window: 10 * time.Second}
	runSteps(t, s, bucket.Charge{Key: NewKey(t), Limit: sliding, Cost: 3}, []step{
		{0, true, bucket.Result{Allowed: true, Limit: 5, Remaining: 2, Reset: sec(11)}},
		{sec(2), false, bucket.Result{Limit: 5, Remaining: 2, RetryAfter: sec(9), Reset: sec(9)}},
		{sec(11), true, bucket.Result{Allowed: true, Limit: 5, Remaining: 2, Reset: sec(11)}},
	})
	quota := bucket.Limit{Algorithm: bucket.Quota, Count: 12, Period: bucket.Day}
	noon := date(t, "2024-05-01T12:00:00Z")
	runAt(t, s, bucket.Charge{Key: NewKey(t), Limit: quota}, []at{
		{noon, 5, true, bucket.Result{Allowed: true, Limit: 12, Remaining: 7, Reset: 12 * time.Hour}},
		{noon, 5, true, bucket.Result{Allowed: true, Limit: 12, Remaining: 2, Reset: 12 * time.Hour}},
		{noon, 5, false, bucket.Result{Limit: 12, Remaining: 2, RetryAfter: 12 * time.Hour, Reset: 12 * time.Hour}},
		{noon, 2, true, bucket.Result{Allowed: true, Limit: 12, Remaining: 0, Reset: 12 * time.Hour}},
	})
}

// testCostAllOrNothing: a weighted charge that does not fit rejects its group, and the group's
// other charges (weighted or not) spend nothing.
func testCostAllOrNothing(t *testing.T, s bucket.Store) {
	quota := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.Quota, Count: 10, Period: bucket.Month}, Cost: 4}
	window := bucket.Charge{Key: NewKey(t), Limit: fixedLimit, Cost: 2}
	tight := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 5}, Cost: 3}
	if admitted, _ := take(t, s, base, tight); !admitted {
		t.Fatalf("first cost-3 take of a Burst 5 bucket: got rejected, want admitted")
	}
	admitted, r := takeGroup(t, s, base, quota, window, tight)
	if admitted || !r[0].Allowed || !r[1].Allowed || r[2].Allowed {
		t.Fatalf("group whose cost-3 charge finds 2 left: got admitted=%v Allowed %v %v %v, want false, true true false",
			admitted, r[0].Allowed, r[1].Allowed, r[2].Allowed)
	}
	for _, c := range []struct {
		name   string
		charge bucket.Charge
		want   int64
	}{{"quota", quota, 6}, {"window", window, 1}} {
		if _, got := take(t, s, base, c.charge); got.Remaining != c.want {
			t.Errorf("%s after the rejected group: got Remaining %d, want %d (nothing spent)", c.name, got.Remaining, c.want)
		}
	}
}
