package exactcheck

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// point is a decision known to the nanosecond.
func point(sec float64) Decision { return Decision{Start: at(sec), End: at(sec), Cost: 1} }

func wantExcess(t *testing.T, what string, v Violation, want int64) {
	t.Helper()
	if got := v.Excess(); got != want {
		t.Errorf("%s: excess got %d, want %d (worst interval %v..%v: %d admitted, bound %.3f)",
			what, got, want, v.From.Sub(t0), v.To.Sub(t0), v.Admitted, v.Bound)
	}
}

func TestGCRACatchesTheGiveBackOverAdmission(t *testing.T) {
	// The example: burst 2 at 1/s; B at 0.5 s, C at 0.501 s and E at 1.0 s all admitted
	// after A (0 s) was given back. [0.5, 1.0] holds 3 where the bound is 2 + 0.5.
	l := Limit{Kind: GCRA, Rate: 1, Burst: 2}
	v := Check(l, []Decision{point(0.5), point(0.501), point(1.0)})
	wantExcess(t, "B, C, E", v, 1)
	if !v.From.Equal(at(0.5)) || !v.To.Equal(at(1.0)) {
		t.Errorf("witness got %v..%v, want 0.5s..1s", v.From.Sub(t0), v.To.Sub(t0))
	}
	// What a bucket that never saw A admits: B and C, then E is rejected until 1.5 s.
	wantExcess(t, "B, C, then 1.5 s", Check(l, []Decision{point(0.5), point(0.501), point(1.5)}), 0)
	// The same violation, but each decision known only within ±0.3 s: [0.2, 1.3] holds three,
	// whose bound 2 + 1.1 admits them. Wide intervals weaken the check, never raise a false alarm.
	wide := []Decision{}
	for _, d := range []Decision{point(0.5), point(0.501), point(1.0)} {
		wide = append(wide, Decision{Start: d.Start.Add(-300 * time.Millisecond), End: d.End.Add(300 * time.Millisecond), Cost: 1})
	}
	wantExcess(t, "B, C, E within ±0.3 s", Check(l, wide), 0)
}

func TestGCRACountsCost(t *testing.T) {
	l := Limit{Kind: GCRA, Rate: 10, Burst: 5}
	ds := []Decision{{Start: at(0), End: at(0), Cost: 3}, {Start: at(0.05), End: at(0.06), Cost: 3}}
	wantExcess(t, "6 units in 60 ms at burst 5", Check(l, ds), 1)
}

// exactBucket admits what one exact GCRA bucket admits, in the order of the readings it is given.
type exactBucket struct {
	tat, t, tau float64
}

func (b *exactBucket) allow(now float64) bool {
	tat := math.Max(b.tat, now)
	if tat+b.t-now > b.tau+1e-12 {
		return false
	}
	b.tat = tat + b.t
	return true
}

func TestGCRAHoldsForAnExactBucketWithSkewedClocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	offsets := []time.Duration{0, 150 * time.Millisecond, -100 * time.Millisecond}
	b := &exactBucket{t: 1.0 / 20, tau: 10.0 / 20}
	var ds []Decision
	now := 0.0
	for range 20000 {
		now += rng.ExpFloat64() / 60 // 3x the rate
		r := rng.IntN(len(offsets))
		if b.allow(now + offsets[r].Seconds()) {
			ds = append(ds, Decision{Replica: r, Start: at(now), End: at(now), Cost: 1})
		}
	}
	l := Limit{Kind: GCRA, Rate: 20, Burst: 10, MinOffset: -100 * time.Millisecond, MaxOffset: 150 * time.Millisecond}
	wantExcess(t, "an exact bucket, skew allowed", Check(l, ds), 0)

	// The example: burst 10 at 100/s, two replicas 100 ms apart, at one real instant.
	// The one behind drains the bucket; the one ahead finds it refilled and admits 10 more.
	b = &exactBucket{t: 1.0 / 100, tau: 10.0 / 100}
	ds = ds[:0]
	for r, off := range []float64{0, 0.1} {
		for range 10 {
			if b.allow(off) {
				ds = append(ds, Decision{Replica: r, Start: at(0), End: at(0), Cost: 1})
			}
		}
	}
	l = Limit{Kind: GCRA, Rate: 100, Burst: 10, MaxOffset: 100 * time.Millisecond}
	wantExcess(t, "10 + 10 at one instant, clocks 100 ms apart allowed for", Check(l, ds), 0)
	l.MaxOffset = 0
	wantExcess(t, "10 + 10 at one instant, no skew allowed", Check(l, ds), 10)
}

// bruteGCRA is the O(n^2 log n) definition: every t1 = a Start, t2 = an End.
func bruteGCRA(l Limit, ds []Decision) float64 {
	worst := math.Inf(-1)
	for _, a := range ds {
		for _, b := range ds {
			if b.End.Before(a.Start) {
				continue
			}
			var c int64
			for _, d := range ds {
				if !d.Start.Before(a.Start) && !d.End.After(b.End) {
					c += d.Cost
				}
			}
			bound := l.Burst + l.Rate*(b.End.Sub(a.Start)+l.Skew()).Seconds()
			worst = math.Max(worst, float64(c)-bound)
		}
	}
	return worst
}

func TestGCRASweepAgreesWithBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 300 {
		var ds []Decision
		for range 1 + rng.IntN(25) {
			s := rng.Float64() * 3
			ds = append(ds, Decision{Start: at(s), End: at(s + rng.Float64()*0.3*float64(rng.IntN(2))), Cost: 1 + rng.Int64N(3)})
		}
		l := Limit{Kind: GCRA, Rate: 1 + rng.Float64()*5, Burst: float64(rng.IntN(5)), MaxOffset: time.Duration(rng.IntN(2)) * 100 * time.Millisecond}
		v := Check(l, ds)
		want := bruteGCRA(l, ds)
		if got := float64(v.Admitted) - v.Bound; math.Abs(got-want) > 1e-6 {
			t.Fatalf("trial %d: sweep's worst margin %.6f, brute force %.6f (history %v, limit %+v)", trial, got, want, ds, l)
		}
	}
}

func TestFixedWindowPerWindowWithSkewAtTheBoundaries(t *testing.T) {
	l := Limit{Kind: FixedWindow, Limit: 3, Window: time.Second}
	four := []Decision{point(0.2), point(0.4), point(0.6), point(0.8)}
	wantExcess(t, "4 in one window of 3", Check(l, four), 1)
	// 2 at the end of one window and 2 at the start of the next: 4 across the boundary is allowed.
	wantExcess(t, "2 + 2 across a boundary", Check(l, []Decision{point(0.8), point(0.9), point(1.1), point(1.2)}), 0)
	// Clocks within ±100 ms: a decision at 0.05 s may have been counted in the window before.
	l.MinOffset, l.MaxOffset = -100*time.Millisecond, 100*time.Millisecond
	wantExcess(t, "4 with one near the boundary, skew allowed", Check(l, []Decision{point(0.05), point(0.4), point(0.6), point(0.8)}), 0)
	wantExcess(t, "4 inside the window's sure part", Check(l, four), 1)
	// A decision known only within [0.5, 1.5] belongs to neither window for sure.
	wide := append([]Decision{}, point(0.2), point(0.4), point(0.6), Decision{Start: at(0.5), End: at(1.5), Cost: 1})
	wantExcess(t, "a wide decision across the boundary", Check(l, wide), 0)
}

func TestQuotaDayIsA24hWindow(t *testing.T) {
	l := Limit{Kind: FixedWindow, Limit: 2, Window: 24 * time.Hour}
	day := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	ds := []Decision{{Start: day.Add(time.Hour), End: day.Add(time.Hour), Cost: 1}, {Start: day.Add(23 * time.Hour), End: day.Add(23 * time.Hour), Cost: 2}}
	wantExcess(t, "3 units in one UTC day of 2", Check(l, ds), 1)
	ds[1].Start, ds[1].End = day.Add(25*time.Hour), day.Add(25*time.Hour)
	wantExcess(t, "one per day", Check(l, ds), 0)
}

func TestSlidingWindowEveryInterval(t *testing.T) {
	l := Limit{Kind: SlidingWindow, Limit: 3, Window: time.Second}
	wantExcess(t, "4 within 0.9 s", Check(l, []Decision{point(0.5), point(0.9), point(1.2), point(1.4)}), 1)
	wantExcess(t, "4 spread over 1.2 s", Check(l, []Decision{point(0.2), point(0.9), point(1.2), point(1.4)}), 0)
	// With 300 ms of skew only 0.7 s intervals are sure.
	l.MaxOffset = 300 * time.Millisecond
	wantExcess(t, "4 within 0.9 s, skew 0.3 s", Check(l, []Decision{point(0.5), point(0.9), point(1.2), point(1.4)}), 0)
	wantExcess(t, "4 within 0.6 s, skew 0.3 s", Check(l, []Decision{point(0.8), point(0.9), point(1.2), point(1.4)}), 1)
}

func TestConcurrencyAtEveryInstant(t *testing.T) {
	iv := func(a, b float64) Interval { return Interval{Enter: at(a), Exit: at(b)} }
	v := CheckConcurrency(2, []Interval{iv(0, 1), iv(0.5, 1.5), iv(0.9, 1.1), iv(2, 3)})
	wantExcess(t, "3 at 0.9 s", v, 1)
	if !v.From.Equal(at(0.9)) {
		t.Errorf("witness got %v, want 0.9s", v.From.Sub(t0))
	}
	wantExcess(t, "back to back", CheckConcurrency(1, []Interval{iv(0, 1), iv(1, 2), iv(2, 3)}), 0)
}

func TestWidths(t *testing.T) {
	var ds []Decision
	for i := 1; i <= 100; i++ {
		ds = append(ds, Decision{Start: t0, End: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	if w := Widths(ds); w.P50 != 51*time.Millisecond || w.P99 != 100*time.Millisecond || w.Max != 100*time.Millisecond {
		t.Errorf("widths got %+v, want p50 51ms, p99 and max 100ms", w)
	}
}

func BenchmarkGCRA100k(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	ds := make([]Decision, 100000)
	for i := range ds {
		s := rng.Float64() * 600
		ds[i] = Decision{Start: at(s), End: at(s + rng.Float64()*0.05), Cost: 1}
	}
	b.ReportAllocs()
	for b.Loop() {
		Check(Limit{Kind: GCRA, Rate: 100, Burst: 50}, ds)
	}
}
