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
}

func (s *sim) run(d time.Duration, onStep func()) {
	const dt = time.Millisecond
	for end := s.now.Add(d); s.now.Before(end); s.now = s.now.Add(dt) {
		for i := 0; i < len(s.ends); {
			if s.ends[i].After(s.now) {
				i++
				continue
			}
			s.l.Release(s.now, s.rtts[i], true)
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

func TestAdaptiveDoesNotGrowWhileIdle(t *testing.T) {
	g := newGradient(2, 1000)
	limit := 50.0
	now := t0
	// Ten requests in flight at a time, fast: the limit of 50 is not in use.
	for i := 0; i < 10000; i++ {
		now = now.Add(time.Millisecond)
		limit = g.sample(now, 20*time.Millisecond, 10, limit)
	}
	if limit != 50 {
		t.Errorf("got limit %v after idle windows, want 50: an unused limit must not grow", limit)
	}
}

func TestAdaptiveIgnoresASingleSlowRequest(t *testing.T) {
	g := newGradient(2, 1000)
	limit := 50.0
	now := t0
	for i := 0; i < 1000; i++ {
		now = now.Add(time.Millisecond)
		rtt := 20 * time.Millisecond
		if i == 500 {
			rtt = 2 * time.Second // one outlier among ~100 samples of its window
		}
		next := g.sample(now, rtt, 50, limit)
		if next < limit*0.95 {
			t.Fatalf("sample %d: limit fell from %v to %v on one slow request", i, limit, next)
		}
		limit = next
	}
}
