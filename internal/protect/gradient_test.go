package protect

import (
	"math/rand/v2"
	"testing"
	"time"
)

// sim is an upstream of capacity requests served in parallel in service time each; beyond
// capacity a request's latency grows with the requests in flight (they queue inside it), under
// a demand that always has a request waiting. Time is simulated: no sleeps.
type sim struct {
	l        *Limiter
	now      time.Time
	service  time.Duration
	capacity int
	noise    float64 // +- share of latency, uniform
	rng      *rand.Rand
	ends     []time.Time // completion instants of requests in flight
	rtts     []time.Duration
	// report, when set, is the latency handed to Release instead of the true one: a sample
	// that lies (requests abandoned early, counted as measured).
	report func(time.Duration) time.Duration
}

func (s *sim) run(d time.Duration, onStep func()) {
	const dt = time.Millisecond
	for end := s.now.Add(d); s.now.Before(end); s.now = s.now.Add(dt) {
		for i := 0; i < len(s.ends); {
			if s.ends[i].After(s.now) {
				i++
				continue
			}
			rtt := s.rtts[i]
			if s.report != nil {
				rtt = s.report(rtt)
			}
			s.l.Release(Default, s.now, rtt, true)
			last := len(s.ends) - 1
			s.ends[i], s.rtts[i] = s.ends[last], s.rtts[last]
			s.ends, s.rtts = s.ends[:last], s.rtts[:last]
		}
		for s.l.TryAcquire(Default) {
			n := len(s.ends) + 1
			lat := s.service
			if n > s.capacity {
				lat = time.Duration(float64(s.service) * float64(n) / float64(s.capacity))
			}
			if s.noise > 0 {
				lat = time.Duration(float64(lat) * (1 + s.noise*(2*s.rng.Float64()-1)))
			}
			s.ends = append(s.ends, s.now.Add(lat))
			s.rtts = append(s.rtts, lat)
		}
		if onStep != nil {
			onStep()
		}
	}
}

// limitRange runs d and returns the lowest and highest limit seen in its last part, from skip on.
func (s *sim) limitRange(d, skip time.Duration) (lo, hi int) {
	lo, hi = 1<<30, 0
	from := s.now.Add(skip)
	s.run(d, func() {
		if s.now.Before(from) {
			return
		}
		n := s.l.Limit()
		lo, hi = min(lo, n), max(hi, n)
	})
	return lo, hi
}

func newSim(t *testing.T, capacity int, noise float64) *sim {
	l := mustNew(t, Options{Adaptive: true, Limit: 50, MinLimit: 2, MaxLimit: 1000})
	return &sim{l: l, now: t0, service: 20 * time.Millisecond, capacity: capacity, noise: noise, rng: rand.New(rand.NewPCG(1, 2))}
}

func TestAdaptiveSettlesFollowsCapacityAndRecovers(t *testing.T) {
	s := newSim(t, 40, 0.2)
	// Settles near the capacity: at least it (goodput), at most twice (latency).
	if lo, hi := s.limitRange(20*time.Second, 10*time.Second); lo < 40 || hi > 80 {
		t.Fatalf("capacity 40: limit ranged %d..%d in steady state, want within 40..80", lo, hi)
	}
	// Capacity halves: within 5 s the limit is in the new band and stays there (no periodic
	// collapse to the floor to re-measure the baseline).
	s.capacity = 20
	if lo, hi := s.limitRange(20*time.Second, 5*time.Second); lo < 20 || hi > 40 {
		t.Fatalf("capacity 20: limit ranged %d..%d from 5s after the drop, want within 20..40", lo, hi)
	}
	// The upstream recovers: the limit grows back.
	s.capacity = 40
	if lo, hi := s.limitRange(20*time.Second, 5*time.Second); lo < 40 || hi > 80 {
		t.Fatalf("capacity back to 40: limit ranged %d..%d from 5s on, want within 40..80", lo, hi)
	}
}

// TestAdaptiveBaselineRecoversFromPoisoning: for 2 s the samples lie (3 ms, where the
// upstream takes 20 ms: requests abandoned early and counted as measured), which teaches the
// limit a baseline far below the upstream's and takes it to the floor. Once the samples are
// true again the limit grows back to the upstream's capacity within 15 s: near the floor the
// latency is hardly the gateway's own queueing, so the baseline is relearnt there. Before,
// the baseline drifted up by 0.05% a window while saturated and the limit stayed at the floor.
func TestAdaptiveBaselineRecoversFromPoisoning(t *testing.T) {
	s := newSim(t, 40, 0.2)
	s.run(10*time.Second, nil)
	s.report = func(time.Duration) time.Duration { return 3 * time.Millisecond }
	s.run(2*time.Second, nil)
	s.report = nil
	s.run(2*time.Second, nil)
	if got := s.l.Limit(); got > 10 {
		t.Logf("2 s after the lies the limit is %d (the poisoned baseline shrinks it first)", got)
	}
	if lo, hi := s.limitRange(30*time.Second, 15*time.Second); lo < 40 || hi > 80 {
		t.Fatalf("after poisoned samples: limit ranged %d..%d from 15 s on, want within 40..80 (capacity 40)", lo, hi)
	}
}

// steady releases and re-takes one slot every millisecond, from n taken, with latency rtt(i).
func steady(t *testing.T, l *Limiter, n, samples int, rtt func(i int) time.Duration, each func(i int)) {
	t.Helper()
	for i := 0; i < n; i++ {
		if !l.TryAcquire(Default) {
			t.Fatalf("slot %d of %d not free", i+1, n)
		}
	}
	now := t0
	for i := 0; i < samples; i++ {
		now = now.Add(time.Millisecond)
		l.Release(Default, now, rtt(i), true)
		if !l.TryAcquire(Default) {
			t.Fatalf("sample %d: the slot just given back is not free", i)
		}
		if each != nil {
			each(i)
		}
	}
}

func TestAdaptiveDoesNotGrowWhileIdle(t *testing.T) {
	l := mustNew(t, Options{Adaptive: true, Limit: 50, MinLimit: 2, MaxLimit: 1000})
	// Ten requests in flight at a time, fast: the limit of 50 is not in use.
	steady(t, l, 10, 10000, func(int) time.Duration { return 20 * time.Millisecond }, nil)
	if got := l.limit(); got != 50 {
		t.Errorf("got limit %v after idle windows, want 50: an unused limit must not grow", got)
	}
}

func TestAdaptiveIgnoresASingleSlowRequest(t *testing.T) {
	l := mustNew(t, Options{Adaptive: true, Limit: 50, MinLimit: 2, MaxLimit: 1000})
	prev := l.limit()
	steady(t, l, 50, 1000, func(i int) time.Duration {
		if i == 500 {
			return 2 * time.Second // one outlier among ~100 samples of its window
		}
		return 20 * time.Millisecond
	}, func(i int) {
		if next := l.limit(); next < prev*0.95 {
			t.Fatalf("sample %d: limit fell from %v to %v on one slow request", i, prev, next)
		}
		prev = l.limit()
	})
	if prev <= 50 {
		t.Errorf("got limit %v, want it grown while in use and fast", prev)
	}
}

// At high request rates an adaptive limit times only some requests (about samplesPerWindow per
// window); a fixed one none.
func TestSampleThinsOutAtHighRates(t *testing.T) {
	if mustNew(t, Options{Limit: 5}).Sample() {
		t.Error("a fixed limit asked for a latency")
	}
	l := mustNew(t, Options{Adaptive: true, Limit: 50, MinLimit: 2, MaxLimit: 1000})
	if !l.Sample() {
		t.Fatal("an adaptive limit without a window yet did not time every request")
	}
	now := t0
	for i := 0; i < 30000; i++ { // 100,000 requests per second for 0.3 s
		now = now.Add(10 * time.Microsecond)
		l.TryAcquire(Default)
		l.Release(Default, now, 20*time.Millisecond, l.Sample()) // as the proxy: timed when sampled
	}
	n := 0
	for i := 0; i < 10000; i++ {
		if l.Sample() {
			n++
		}
	}
	// A window of 100ms held 10,000 samples: one request in 156 is timed now.
	if n < 20 || n > 200 {
		t.Errorf("%d of 10000 requests timed, want about 64 (one in 156)", n)
	}
}
