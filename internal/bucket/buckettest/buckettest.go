// Package buckettest is the conformance suite every bucket.Store implementation runs: the
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
	t.Run("RejectedGroupCommitsNothing", func(t *testing.T) { testRejectedGroup(t, newStore(t)) })
	t.Run("ShadowOverLimit", func(t *testing.T) { testShadowOverLimit(t, newStore(t)) })
	t.Run("ShadowWithinLimit", func(t *testing.T) { testShadowWithinLimit(t, newStore(t)) })
	t.Run("KeysAreIndependent", func(t *testing.T) { testIndependentKeys(t, newStore(t)) })
	t.Run("CanceledContext", func(t *testing.T) { testCanceledContext(t, newStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore) })
}

// NewKey returns a random key, so that subtests sharing a store never share state.
func NewKey(t *testing.T) bucket.Key {
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
		if admitted != st.admitted || got != st.want {
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
