package buckettest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// RunRelease is the conformance suite of bucket.Releaser: concurrency limits (slots taken and
// given back, all or nothing in a group, never more than Count in flight under concurrency) and
// the charge_on give-backs of every algorithm, including the give-backs a store must refuse because
// they could admit more than the limit. newStore is called once per subtest, as for Run.
func RunRelease(t *testing.T, newStore func(t *testing.T) bucket.Releaser) {
	t.Run("Concurrency", func(t *testing.T) { testConcurrency(t, newStore(t)) })
	t.Run("ConcurrencyRejectedGroup", func(t *testing.T) { testConcurrencyRejectedGroup(t, newStore(t)) })
	t.Run("ConcurrencyInFlight", func(t *testing.T) { testConcurrencyInFlight(t, newStore(t)) })
	t.Run("GiveBackFixedWindow", func(t *testing.T) { testGiveBackFixed(t, newStore(t)) })
	t.Run("GiveBackSlidingWindow", func(t *testing.T) { testGiveBackSliding(t, newStore(t)) })
	t.Run("GiveBackTokenBucket", func(t *testing.T) { testGiveBackToken(t, newStore(t)) })
	t.Run("NoGiveBackLeakyBucket", func(t *testing.T) { testNoGiveBackLeaky(t, newStore(t)) })
	t.Run("GiveBackUnderConcurrency", func(t *testing.T) { testGiveBackConcurrent(t, newStore(t)) })
	t.Run("GiveBackCostAndQuota", func(t *testing.T) { testGiveBackCostAndQuota(t, newStore(t)) })
}

// concLimit admits two requests in flight per key.
var concLimit = bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}

// takeToken takes one charge at now and returns what Release needs of it, failing the test on a
// store error.
func takeToken(t *testing.T, s bucket.Store, now time.Time, c bucket.Charge) (bool, bucket.Result, bucket.Taken) {
	t.Helper()
	admitted, r := take(t, s, now, c)
	return admitted, r, bucket.Taken{Charge: c, At: now, Token: r.Token}
}

// release gives taken back at now and fails the test on a store error.
func release(t *testing.T, s bucket.Releaser, now time.Time, taken ...bucket.Taken) {
	t.Helper()
	if err := s.Release(context.Background(), now, taken); err != nil {
		t.Fatalf("Release at %v: %v", now, err)
	}
}

// same compares a verdict without its Token, which is the store's own business.
func same(got, want bucket.Result) bool {
	got.Token = 0
	return got == want
}

func testConcurrency(t *testing.T, s bucket.Releaser) {
	c := bucket.Charge{Key: NewKey(t), Limit: concLimit}
	sec := time.Second
	full := bucket.Result{Limit: 2, RetryAfter: sec, Reset: sec}
	_, r1, a := takeToken(t, s, base, c)
	_, r2, b := takeToken(t, s, base, c)
	admitted3, r3, _ := takeToken(t, s, base, c)
	for i, tc := range []struct {
		got, want bucket.Result
	}{
		{r1, bucket.Result{Allowed: true, Limit: 2, Remaining: 1, Reset: sec}},
		{r2, bucket.Result{Allowed: true, Limit: 2, Remaining: 0, Reset: sec}},
		{r3, full},
	} {
		if !same(tc.got, tc.want) {
			t.Errorf("take %d: got %+v, want %+v", i+1, tc.got, tc.want)
		}
	}
	if admitted3 {
		t.Errorf("third take with two in flight: got admitted, want rejected")
	}
	// Time alone frees nothing: a slot is held until its request ends (on DynamoDB, within
	// its lease, at least 5 s).
	later := base.Add(5 * time.Second)
	if admitted, r := take(t, s, later, c); admitted || !same(r, full) {
		t.Errorf("5 s later with both still in flight: got admitted=%v %+v, want rejected %+v", admitted, r, full)
	}
	release(t, s, later, a)
	admitted, r, a2 := takeToken(t, s, later, c)
	if want := (bucket.Result{Allowed: true, Limit: 2, Remaining: 0, Reset: sec}); !admitted || !same(r, want) {
		t.Errorf("after one release: got admitted=%v %+v, want admitted %+v", admitted, r, want)
	}
	release(t, s, later, a2, b)
	if admitted, r := take(t, s, later, c); !admitted || r.Remaining != 1 {
		t.Errorf("after every release: got admitted=%v Remaining %d, want admitted, 1 (a fresh key)", admitted, r.Remaining)
	}
}

func testConcurrencyRejectedGroup(t *testing.T, s bucket.Releaser) {
	slot := bucket.Charge{Key: NewKey(t), Limit: concLimit}
	exhausted := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}}
	if admitted, _ := take(t, s, base, exhausted); !admitted {
		t.Fatalf("first take of a fresh Burst 1 bucket: got rejected, want admitted")
	}
	for range 3 {
		if admitted, _ := takeGroup(t, s, base, slot, exhausted); admitted {
			t.Fatalf("group with an exhausted bucket: got admitted, want rejected")
		}
	}
	// The rejected groups took no slot.
	if _, r := take(t, s, base, slot); !r.Allowed || r.Remaining != 1 {
		t.Errorf("slot after three rejected groups: got %+v, want allowed with Remaining 1", r)
	}
}

// testConcurrencyInFlight is ConcurrencyInFlight on one store at a fixed instant.
func testConcurrencyInFlight(t *testing.T, s bucket.Releaser) {
	ConcurrencyInFlight(t, []bucket.Releaser{s}, func() time.Time { return base }, 6)
}

// ConcurrencyInFlight runs 12 goroutines over stores (replicas sharing one state) that each
// take a slot each times, hold it while counting the requests in flight, and give it back at
// now(): the count must never pass Count, and the slots must all come back (the first store's
// verdict at the end).
func ConcurrencyInFlight(t *testing.T, stores []bucket.Releaser, now func() time.Time, each int) {
	t.Helper()
	const goroutines, limit = 12, 3
	c := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: limit}}
	var (
		wg                  sync.WaitGroup
		inFlight, peak, oks atomic.Int64
		failed              atomic.Pointer[error]
	)
	for g := range goroutines {
		s := stores[g%len(stores)]
		wg.Go(func() {
			var r [1]bucket.Result
			for range each {
				at := now()
				ok, err := s.Take(context.Background(), at, []bucket.Charge{c}, r[:])
				if err != nil {
					failed.Store(&err)
					return
				}
				if !ok {
					continue
				}
				oks.Add(1)
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				inFlight.Add(-1)
				if err := s.Release(context.Background(), now(), []bucket.Taken{{Charge: c, At: at, Token: r[0].Token}}); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("Take/Release: %v", *err)
	}
	if p := peak.Load(); p > limit {
		t.Errorf("peak in flight across %d stores: got %d, want at most %d", len(stores), p, limit)
	}
	if oks.Load() < limit {
		t.Errorf("admitted: got %d, want at least %d (slots must come back)", oks.Load(), limit)
	}
	if _, r := take(t, stores[0], now(), c); !r.Allowed || r.Remaining != limit-1 {
		t.Errorf("after every slot was given back: got %+v, want allowed with Remaining %d", r, limit-1)
	}
}

func testGiveBackFixed(t *testing.T, s bucket.Releaser) {
	c := bucket.Charge{Key: NewKey(t), Limit: fixedLimit, MayGiveBack: true} // 3 per minute
	var taken [3]bucket.Taken
	for i := range taken {
		_, _, taken[i] = takeToken(t, s, base.Add(10*time.Second), c)
	}
	release(t, s, base.Add(11*time.Second), taken[0])
	if admitted, r := take(t, s, base.Add(12*time.Second), c); !admitted || r.Remaining != 0 {
		t.Errorf("after a give-back in the same window: got admitted=%v Remaining %d, want admitted, 0", admitted, r.Remaining)
	}
	// A charge of a window that has ended gives nothing back to the next one.
	old := bucket.Taken{Charge: c, At: base.Add(-10 * time.Second)}
	release(t, s, base.Add(13*time.Second), old)
	if admitted, _ := take(t, s, base.Add(13*time.Second), c); admitted {
		t.Errorf("after a give-back of the previous window's charge: got admitted, want rejected")
	}
	// Nor does a charge given back after its window ended.
	release(t, s, base.Add(61*time.Second), taken[1])
	for i := range 3 {
		if admitted, _ := take(t, s, base.Add(61*time.Second), c); !admitted {
			t.Errorf("take %d in the next window after a late give-back: got rejected, want admitted", i+1)
		}
	}
	if admitted, _ := take(t, s, base.Add(61*time.Second), c); admitted {
		t.Errorf("fourth take in the next window: got admitted, want rejected (the late give-back gave nothing)")
	}
}

func testGiveBackSliding(t *testing.T, s bucket.Releaser) {
	c := bucket.Charge{Key: NewKey(t), Limit: slidingLimit, MayGiveBack: true} // 3 per 10 s, 1 s slots
	var taken [3]bucket.Taken
	for i := range taken {
		_, _, taken[i] = takeToken(t, s, base.Add(time.Second+time.Duration(i)*time.Second), c)
	}
	if admitted, _ := take(t, s, base.Add(4*time.Second), c); admitted {
		t.Fatalf("fourth take within the window: got admitted, want rejected")
	}
	release(t, s, base.Add(4*time.Second), taken[1])
	if admitted, r := take(t, s, base.Add(5*time.Second), c); !admitted || r.Remaining != 0 {
		t.Errorf("after a give-back: got admitted=%v Remaining %d, want admitted, 0", admitted, r.Remaining)
	}
	// A charge whose slot has left the counted slots gives nothing back.
	old := bucket.Taken{Charge: c, At: base.Add(-20 * time.Second)}
	release(t, s, base.Add(6*time.Second), old)
	if admitted, _ := take(t, s, base.Add(6*time.Second), c); admitted {
		t.Errorf("after a give-back of a charge 26 s old: got admitted, want rejected")
	}
}

func testGiveBackToken(t *testing.T, s bucket.Releaser) {
	c := bucket.Charge{Key: NewKey(t), Limit: tokenLimit, MayGiveBack: true} // T = 100ms, burst 3
	var taken [3]bucket.Taken
	for i := range taken {
		_, _, taken[i] = takeToken(t, s, base, c)
	}
	// With nothing written since, a give-back is exact: the request comes back, whenever the
	// give-back comes.
	release(t, s, base.Add(ms(50)), taken[2])
	if admitted, r := take(t, s, base.Add(ms(50)), c); !admitted || r.Remaining != 0 {
		t.Errorf("after a give-back with nothing written since: got admitted=%v Remaining %d, want admitted, 0", admitted, r.Remaining)
	}
	if admitted, _ := take(t, s, base.Add(ms(50)), c); admitted {
		t.Errorf("again after one give-back: got admitted, want rejected (it gave back one request, not more)")
	}
}

func testNoGiveBackLeaky(t *testing.T, s bucket.Releaser) {
	c := bucket.Charge{Key: NewKey(t), Limit: leakyLimit, MayGiveBack: true} // Burst+1 = 3 at once
	var first bucket.Taken
	for i := range 3 {
		_, _, tk := takeToken(t, s, base, c)
		if i == 0 {
			first = tk
		}
	}
	release(t, s, base, first)
	if admitted, _ := take(t, s, base, c); admitted {
		t.Errorf("after a leaky-bucket give-back: got admitted, want rejected (leaky charges are never given back)")
	}
}

// testGiveBackConcurrent reserves and gives back from many goroutines at once, as charge_on does
// when every answer is free: each goroutine takes a window charge and gives it back. However
// they interleave, a take is admitted only while fewer than Count reservations are out, so at
// the end exactly Count fresh takes pass.
func testGiveBackConcurrent(t *testing.T, s bucket.Releaser) {
	const goroutines, each = 8, 6
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 4, Window: time.Minute}
	c := bucket.Charge{Key: NewKey(t), Limit: l, MayGiveBack: true}
	var (
		wg       sync.WaitGroup
		out, max atomic.Int64
		failed   atomic.Pointer[error]
	)
	for range goroutines {
		wg.Go(func() {
			var r [1]bucket.Result
			for range each {
				ok, err := s.Take(context.Background(), base, []bucket.Charge{c}, r[:])
				if err != nil {
					failed.Store(&err)
					return
				}
				if !ok {
					continue
				}
				n := out.Add(1)
				for p := max.Load(); n > p && !max.CompareAndSwap(p, n); p = max.Load() {
				}
				out.Add(-1)
				if err := s.Release(context.Background(), base, []bucket.Taken{{Charge: c, At: base, Token: r[0].Token}}); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("Take/Release: %v", *err)
	}
	if m := max.Load(); m > l.Count {
		t.Errorf("reservations out at once: got %d, want at most %d", m, l.Count)
	}
	for i := range l.Count {
		if admitted, _ := take(t, s, base, c); !admitted {
			t.Fatalf("fresh take %d after every reservation was given back: got rejected, want admitted", i+1)
		}
	}
	if admitted, _ := take(t, s, base, c); admitted {
		t.Errorf("take %d: got admitted, want rejected", l.Count+1)
	}
}

// testGiveBackCostAndQuota: a charge of cost N is given back whole, on every algorithm that gives back,
// and a quota's charge goes back to its period.
func testGiveBackCostAndQuota(t *testing.T, s bucket.Releaser) {
	for _, tc := range []struct {
		name string
		l    bucket.Limit
		cost int64
		// Two charges fit, the third does not; a give-back at base+back makes room for one again.
		back time.Duration
	}{
		{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Minute}, 2, time.Second},
		{"SlidingWindow", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 5, Window: 10 * time.Second}, 2, time.Second},
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 5}, 2, ms(1)}, // before a token refills
		{"Quota", bucket.Limit{Algorithm: bucket.Quota, Count: 2, Period: bucket.Day}, 1, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := bucket.Charge{Key: NewKey(t), Limit: tc.l, Cost: tc.cost, MayGiveBack: true}
			take(t, s, base, c)
			// The last write is given back: for a token bucket, exact only while nothing wrote
			// since.
			admitted, _, last := takeToken(t, s, base, c)
			if !admitted {
				t.Fatalf("second charge of cost %d: rejected, want admitted", tc.cost)
			}
			if admitted, _ := take(t, s, base, c); admitted {
				t.Fatalf("third charge of cost %d: admitted, want rejected", tc.cost)
			}
			release(t, s, base.Add(tc.back), last)
			if admitted, _ := take(t, s, base.Add(tc.back), c); !admitted {
				t.Errorf("after a give-back of cost %d at base+%v: rejected, want admitted", tc.cost, tc.back)
			}
			if admitted, _ := take(t, s, base.Add(tc.back), c); admitted {
				t.Errorf("again after one give-back: admitted, want rejected (it gave back %d, not more)", tc.cost)
			}
		})
	}
}
