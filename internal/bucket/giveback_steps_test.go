package bucket_test

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestConcurrentSteps(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}
	var inflight int64
	// Each step takes a slot or gives one back; the algorithm reads no clock.
	for i, s := range []struct {
		release  bool
		want     bucket.Result
		inflight int64
	}{
		{false, allowed(2, 1, time.Second, 0), 1},
		{false, allowed(2, 0, time.Second, 0), 2},
		{false, rejected(2, time.Second, time.Second), 2},
		{true, bucket.Result{}, 1},
		{false, allowed(2, 0, time.Second, 0), 2},
		{true, bucket.Result{}, 1},
		{true, bucket.Result{}, 0},
		// A release with nothing in flight (the key was evicted meanwhile) stays at zero.
		{true, bucket.Result{}, 0},
		{false, allowed(2, 1, time.Second, 0), 1},
	} {
		if s.release {
			inflight = bucket.ConcurrentGiveBack(inflight)
		} else {
			next, r := bucket.Concurrent(inflight, l)
			if r.Allowed {
				inflight = next
			}
			if r != s.want {
				t.Errorf("step %d: got %+v, want %+v", i, r, s.want)
			}
		}
		if inflight != s.inflight {
			t.Errorf("step %d: got %d in flight, want %d", i, inflight, s.inflight)
		}
	}
}

func TestGCRAGiveBackSteps(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 3} // T = 100ms
	at := t0.UnixNano()
	T := ms(100).Nanoseconds()
	for _, tc := range []struct {
		name    string
		l       bucket.Limit
		tat     int64
		left    int64 // what the charge's write left
		wantTat int64
		wantOK  bool
	}{
		{"nothing wrote since", l, at + 3*T, at + 3*T, at + 2*T, true},
		{"nothing wrote since, bucket long idle", l, at + T, at + T, at, true},
		{"a later write", l, at + 3*T, at + 2*T, at + 3*T, false},
		{"state below the charge's (given back, evicted)", l, at + T/2, at + T, at + T/2, false},
		{"unknown (token 0)", l, at + 3*T, 0, at + 3*T, false},
		{"leaky bucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 3}, at + 3*T, at + 3*T, at + 3*T, false},
	} {
		got, ok := bucket.GCRAGiveBack(tc.tat, tc.left, tc.l)
		if got != tc.wantTat || ok != tc.wantOK {
			t.Errorf("%s: got tat=at%+d ok=%v, want at%+d %v", tc.name, got-at, ok, tc.wantTat-at, tc.wantOK)
		}
	}
}

func TestFixedGiveBackSteps(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Minute}
	end := t0.Add(time.Minute).UnixNano()
	for _, tc := range []struct {
		name   string
		s      bucket.FixedState
		at     time.Duration
		want   bucket.FixedState
		wantOK bool
	}{
		{"same window", bucket.FixedState{End: end, Count: 3}, sec(10), bucket.FixedState{End: end, Count: 2}, true},
		{"last instant of the window", bucket.FixedState{End: end, Count: 1}, sec(60) - 1, bucket.FixedState{End: end, Count: 0}, true},
		{"previous window", bucket.FixedState{End: end, Count: 3}, -sec(1), bucket.FixedState{End: end, Count: 3}, false},
		{"window has moved on", bucket.FixedState{End: end + time.Minute.Nanoseconds(), Count: 3}, sec(10), bucket.FixedState{End: end + time.Minute.Nanoseconds(), Count: 3}, false},
		{"nothing counted", bucket.FixedState{End: end}, sec(10), bucket.FixedState{End: end}, false},
	} {
		got, ok := bucket.FixedGiveBack(tc.s, t0.Add(tc.at).UnixNano(), l)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: got %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestSlidingGiveBackSteps(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 3, Window: 10 * time.Second} // 1s slots
	var s bucket.SlidingState
	for _, at := range []time.Duration{sec(1), sec(2), sec(2)} {
		var r bucket.Result
		s, r = bucket.Sliding(s, t0.Add(at).UnixNano(), l)
		if !r.Allowed {
			t.Fatalf("take at t0+%v: rejected", at)
		}
	}
	refund := func(at time.Duration) bool {
		var ok bool
		s, ok = bucket.SlidingGiveBack(s, t0.Add(at).UnixNano(), l)
		return ok
	}
	for i, st := range []struct {
		at   time.Duration
		want bool
	}{
		{sec(2) + ms(500), true}, // its slot counted two
		{sec(2), true},
		{sec(2), false},          // nothing left in the slot
		{sec(3), false},          // a slot newer than the state's newest: never counted
		{-sec(20), false},        // left the ring long ago
		{sec(1) + ms(999), true}, // the first request
	} {
		if got := refund(st.at); got != st.want {
			t.Errorf("refund %d of a charge at t0+%v: got %v, want %v", i, st.at, got, st.want)
		}
	}
	// Every refund applied: a fresh window's three pass again.
	for i := range 3 {
		var r bucket.Result
		if s, r = bucket.Sliding(s, t0.Add(sec(3)).UnixNano(), l); !r.Allowed {
			t.Errorf("take %d after the refunds: rejected", i+1)
		}
	}
}
