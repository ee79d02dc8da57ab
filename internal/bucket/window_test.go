package bucket_test

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

var (
	fixedMinute = bucket.Limit{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Minute}
	// Slot width 1s.
	sliding10s = bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 3, Window: 10 * time.Second}
)

func TestFixedWindowSteps(t *testing.T) {
	runSteps(t, fixedTaker(fixedMinute), []step{
		{sec(10), allowed(3, 2, sec(50), 0)},
		{sec(10), allowed(3, 1, sec(50), 0)},
		{sec(20), allowed(3, 0, sec(40), 0)},
		{sec(30), rejected(3, sec(30), sec(30))},
		// Rollover.
		{sec(60), allowed(3, 2, sec(60), 0)},
		// The clock steps back into the previous window: counted in the newer one.
		{sec(50), allowed(3, 1, sec(70), 0)},
		{sec(50), allowed(3, 0, sec(70), 0)},
		{sec(59), rejected(3, sec(61), sec(61))},
		{sec(120), allowed(3, 2, sec(60), 0)},
	})
}

// TestBeforeEpochIsSafe: instants before 1970 are outside the documented range, but must not
// panic (the sliding window's ring index would be negative with a truncating modulo) and must
// not admit above the limit.
func TestBeforeEpochIsSafe(t *testing.T) {
	now := -int64(time.Hour) - 1
	var s bucket.SlidingState
	passed := 0
	for range 5 {
		next, r := bucket.Sliding(s, now, sliding10s)
		if r.Allowed {
			s = next
			passed++
		}
	}
	if passed != int(sliding10s.Count) {
		t.Errorf("5 requests at one pre-epoch instant: got %d passed, want %d", passed, sliding10s.Count)
	}
}

// TestFixedWindowBoundaryBurst demonstrates the documented weakness of fixed windows: Count at
// the end of one window and Count at the start of the next pass within 100ms.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	take := fixedTaker(fixedMinute)
	passed := 0
	for _, at := range []time.Duration{ms(59_900), ms(60_000)} {
		for range 4 {
			if take(t0.Add(at).UnixNano()).Allowed {
				passed++
			}
		}
	}
	if want := 2 * int(fixedMinute.Count); passed != want {
		t.Errorf("Count+1 tries at t0+59.9s and t0+60s: got %d passed, want %d (2*Count)", passed, want)
	}
}

func TestFixedStateIdle(t *testing.T) {
	s, _ := bucket.Fixed(bucket.FixedState{}, t0.Add(sec(10)).UnixNano(), fixedMinute)
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{{sec(59), false}, {sec(60), true}} {
		if got := s.Idle(t0.Add(tc.at).UnixNano()); got != tc.want {
			t.Errorf("window [t0, t0+60s) idle at t0+%v: got %v, want %v", tc.at, got, tc.want)
		}
	}
	if !(bucket.FixedState{}).Idle(t0.UnixNano()) {
		t.Errorf("zero FixedState: got not idle, want idle")
	}
}

func TestSlidingWidth(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		want   int64
	}{{10 * time.Second, 1e9}, {10*time.Second + 5, 1e9 + 1}, {time.Minute, 6e9}, {3, 1}, {0, 1}} {
		l := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 1, Window: tc.window}
		if got := bucket.SlidingWidth(l); got != tc.want {
			t.Errorf("Window %v: got width %d, want %d", tc.window, got, tc.want)
		}
	}
}

func TestSlidingWindowBoundary(t *testing.T) {
	runSteps(t, slidingTaker(sliding10s), []step{
		// Count at the end of a window...
		{ms(9500), allowed(3, 2, ms(10_500), 0)},
		{ms(9500), allowed(3, 1, ms(10_500), 0)},
		{ms(9500), allowed(3, 0, ms(10_500), 0)},
		// ...then nothing passes until they have left (the slot of t0+9.5s leaves at t0+20s).
		{ms(10_000), rejected(3, ms(10_000), ms(10_000))},
		{ms(10_500), rejected(3, ms(9500), ms(9500))},
		{ms(19_999), rejected(3, ms(1), ms(1))},
		{ms(20_000), allowed(3, 2, ms(11_000), 0)},
	})
}

func TestSlidingWindowRetryAfterWalksOldestSlots(t *testing.T) {
	runSteps(t, slidingTaker(sliding10s), []step{
		{ms(2500), allowed(3, 2, ms(10_500), 0)},
		{ms(5000), allowed(3, 1, ms(11_000), 0)},
		{ms(7000), allowed(3, 0, ms(11_000), 0)},
		// Retry when slot 2 leaves (t0+13s); Reset when slot 7 does (t0+18s).
		{ms(8000), rejected(3, ms(5000), ms(10_000))},
		{ms(12_999), rejected(3, ms(1), ms(5001))},
		{ms(13_000), allowed(3, 0, ms(11_000), 0)},
		{ms(13_000), rejected(3, ms(3000), ms(11_000))},
	})
}

func TestSlidingWindowClockStepsBack(t *testing.T) {
	runSteps(t, slidingTaker(bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 2, Window: 10 * time.Second}), []step{
		{ms(5500), allowed(2, 1, ms(10_500), 0)},
		// Back to slot 1: counted in slot 5, the newest, so it leaves with slot 5 at t0+16s.
		{ms(1000), allowed(2, 0, ms(15_000), 0)},
		{ms(2000), rejected(2, ms(14_000), ms(14_000))},
		{ms(15_999), rejected(2, ms(1), ms(1))},
		{ms(16_000), allowed(2, 1, ms(11_000), 0)},
	})
}

func TestSlidingWindowChangedWidthStartsFresh(t *testing.T) {
	now := t0.UnixNano()
	var s bucket.SlidingState
	for range 3 {
		s, _ = bucket.Sliding(s, now, sliding10s)
	}
	if _, r := bucket.Sliding(s, now, sliding10s); r.Allowed {
		t.Fatalf("fourth request: got allowed, want rejected")
	}
	wider := sliding10s
	wider.Window = 20 * time.Second
	if _, r := bucket.Sliding(s, now, wider); r != allowed(3, 2, sec(22), 0) {
		t.Errorf("after the Window changed: got %+v, want a fresh key's first request", r)
	}
}

func TestSlidingStateIdle(t *testing.T) {
	s, _ := bucket.Sliding(bucket.SlidingState{}, t0.Add(ms(9500)).UnixNano(), sliding10s)
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{{ms(19_999), false}, {ms(20_000), true}} {
		if got := s.Idle(t0.Add(tc.at).UnixNano()); got != tc.want {
			t.Errorf("request at t0+9.5s, idle at t0+%v: got %v, want %v", tc.at, got, tc.want)
		}
	}
	if !(&bucket.SlidingState{}).Idle(t0.UnixNano()) {
		t.Errorf("zero SlidingState: got not idle, want idle")
	}
}

// countIn returns how many of the sorted instants lie in (from, to].
func countIn(sorted []int64, from, to int64) int64 {
	lo := sort.Search(len(sorted), func(i int) bool { return sorted[i] > from })
	hi := sort.Search(len(sorted), func(i int) bool { return sorted[i] > to })
	return int64(hi - lo)
}

// TestSlidingWindowExactUpperBound drives random arrivals against the sliding window and checks
// it against an exact sliding log of what it admitted:
//   - upper bound: every interval (t-Window, t] holds at most Count admitted requests; with the
//     clock stepping back, on the timeline of the largest instant seen so far;
//   - not overly strict (monotonic clock): every rejection at t is justified by a log of window
//     (K+1)*S, i.e. (t-(K+1)*S, t] already holds Count admitted requests.
func TestSlidingWindowExactUpperBound(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 0x5851f42d4c957f2d))
		// 1s to 11s, mostly not divisible by K.
		l := bucket.Limit{
			Algorithm: bucket.SlidingWindow,
			Count:     1 + rng.Int64N(20),
			Window:    time.Duration(1e9 + rng.Int64N(10e9)),
		}
		window, span := int64(l.Window), (bucket.SlidingSlots+1)*bucket.SlidingWidth(l)
		gap := int64(float64(window) / float64(l.Count) * (0.2 + 1.3*rng.Float64()))
		for _, stepsBack := range []bool{false, true} {
			var (
				s        bucket.SlidingState
				now      = t0.UnixNano()
				latest   = int64(math.MinInt64)
				admitted []int64 // on the latest-instant timeline, so sorted
				rejects  int
			)
			for range 3000 {
				switch r := rng.IntN(20); {
				case stepsBack && r == 0:
					now -= rng.Int64N(window)
				case r < 4: // the same instant again
				default:
					now += rng.Int64N(2 * gap)
				}
				latest = max(latest, now)
				next, r := bucket.Sliding(s, now, l)
				if r.Allowed {
					s = next
					admitted = append(admitted, latest)
					continue
				}
				rejects++
				if r.RetryAfter <= 0 || r.Reset < r.RetryAfter || r.Remaining != 0 {
					t.Fatalf("seed %d: rejection with RetryAfter %v Reset %v Remaining %d", seed, r.RetryAfter, r.Reset, r.Remaining)
				}
				if n := countIn(admitted, now-span, now); !stepsBack && n < l.Count {
					t.Fatalf("seed %d: rejected at %dns with %d admitted in the trailing (K+1)*S, want >= Count %d",
						seed, now-t0.UnixNano(), n, l.Count)
				}
			}
			for _, end := range admitted {
				if n := countIn(admitted, end-window, end); n > l.Count {
					t.Fatalf("seed %d stepsBack=%v: %d admitted in (t-Window, t] for t=%dns, want <= Count %d",
						seed, stepsBack, n, end-t0.UnixNano(), l.Count)
				}
			}
			if rejects == 0 || len(admitted) < 10 {
				t.Errorf("seed %d: %d admitted, %d rejected: the test exercises too little", seed, len(admitted), rejects)
			}
		}
	}
}

// TestSlidingWindowSteadyRate measures what the exact upper bound costs. A steady Count per
// (Window+S) passes in full; a steady Count per Window loses one request in K+1, because the
// oldest counted slot reaches up to S beyond the Window.
func TestSlidingWindowSteadyRate(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 10, Window: 10 * time.Second}
	width := bucket.SlidingWidth(l)
	run := func(gap, offset int64) (passed, total int) {
		var s bucket.SlidingState
		for i := range int64(11_000) {
			next, r := bucket.Sliding(s, t0.UnixNano()+offset+i*gap, l)
			if r.Allowed {
				s = next
				passed++
			}
		}
		return passed, 11_000
	}
	for _, offset := range []int64{0, 1, width / 2, width - 1} {
		if passed, total := run((int64(l.Window)+width)/l.Count, offset); passed != total {
			t.Errorf("offset %d: Count per Window+S: got %d of %d passed, want all", offset, passed, total)
		}
		passed, total := run(int64(l.Window)/l.Count, offset)
		if want := total * bucket.SlidingSlots / (bucket.SlidingSlots + 1); passed < want {
			t.Errorf("offset %d: Count per Window: got %d of %d passed, want >= %d (K/(K+1))", offset, passed, total, want)
		}
	}
}

// TestFixedWindowUpperBound checks, with random arrivals and a clock stepping back, that no
// aligned window admits more than Count on the timeline of the largest instant seen.
func TestFixedWindowUpperBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: 3 * time.Second}
	var (
		s        bucket.FixedState
		now      = t0.UnixNano()
		latest   = int64(math.MinInt64)
		perStart = map[int64]int64{}
	)
	for range 20_000 {
		if rng.IntN(10) == 0 {
			now -= rng.Int64N(int64(l.Window))
		} else {
			now += rng.Int64N(int64(l.Window) / 5)
		}
		latest = max(latest, now)
		if next, r := bucket.Fixed(s, now, l); r.Allowed {
			s = next
			perStart[latest/int64(l.Window)]++
		}
	}
	for w, n := range perStart {
		if n > l.Count {
			t.Fatalf("window %d: got %d admitted, want <= %d", w, n, l.Count)
		}
	}
}

// slidingReference is the sliding window written the plain way (a division to find the slot, a
// modulo per ring step, every loop over all K+1 slots), kept to check the optimised Sliding
// against: both must return the same state and the same verdict for every input.
func slidingReference(s bucket.SlidingState, now int64, l bucket.Limit) (bucket.SlidingState, bucket.Result) {
	const n = bucket.SlidingSlots + 1
	ring := func(j int64) int { return int(((j % n) + n) % n) }
	w := bucket.SlidingWidth(l)
	cur := now / w
	if now%w < 0 {
		cur--
	}
	switch {
	case s.Width != w:
		s = bucket.SlidingState{Width: w, Slot: cur}
	case cur-s.Slot >= n:
		s.Counts = [n]uint32{}
		s.Slot = cur
	case cur > s.Slot:
		for j := s.Slot + 1; j <= cur; j++ {
			s.Counts[ring(j)] = 0
		}
		s.Slot = cur
	}
	var sum int64
	for _, c := range s.Counts {
		sum += int64(c)
	}
	leaves := func(j int64) time.Duration { return time.Duration((j+n)*w - now) }
	r := bucket.Result{Limit: l.Count}
	if sum < l.Count {
		s.Counts[ring(s.Slot)]++
		r.Allowed = true
		r.Remaining = l.Count - sum - 1
		r.Reset = leaves(s.Slot)
		return s, r
	}
	for j := s.Slot; j > s.Slot-n; j-- {
		if s.Counts[ring(j)] != 0 {
			r.Reset = leaves(j)
			break
		}
	}
	r.RetryAfter = leaves(s.Slot)
	rest := sum
	for j := s.Slot - bucket.SlidingSlots; j <= s.Slot; j++ {
		rest -= int64(s.Counts[ring(j)])
		if rest < l.Count {
			r.RetryAfter = leaves(j)
			break
		}
	}
	return s, r
}

// TestSlidingMatchesReference drives Sliding and slidingReference with the same random requests:
// instants around t0 and before the epoch, steps forward within a slot, to a slot boundary (and
// 1ns either side), across a few slots and past the ring, steps back, a Window changed by a
// reload, and an invalid Count of 0. Every returned state and verdict must be equal, admitted or
// not.
func TestSlidingMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for round := range 200 {
		l := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: rng.Int64N(30), Window: time.Duration(1 + rng.Int64N(int64(time.Minute)))}
		start := t0.UnixNano()
		if round%4 == 0 {
			start = -start
		}
		var s bucket.SlidingState
		now := start
		for i := range 2000 {
			w := bucket.SlidingWidth(l)
			switch r := rng.IntN(100); {
			case r < 30: // the same slot, mostly
				now += rng.Int64N(w/4 + 1)
			case r < 40: // next to a slot boundary
				b := (now/w + rng.Int64N(3)) * w
				now = b + rng.Int64N(3) - 1
			case r < 80:
				now += rng.Int64N(3*w + 1)
			case r < 88:
				now += rng.Int64N(20*w + 1)
			case r < 96:
				now -= rng.Int64N(5*w + 1)
			case r < 98:
				l.Window = time.Duration(1 + rng.Int64N(int64(time.Minute)))
			default:
				l.Count = rng.Int64N(30)
			}
			got, gotR := bucket.Sliding(s, now, l)
			want, wantR := slidingReference(s, now, l)
			if got != want || gotR != wantR {
				t.Fatalf("round %d step %d: Sliding(%+v, %d, %+v):\n got %+v %+v\nwant %+v %+v", round, i, s, now, l, got, gotR, want, wantR)
			}
			if gotR.Allowed {
				s = got
			}
		}
	}
}
