package clockref

import (
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is the tests' local epoch: a whole second, like any instant the tests' reference reads.
var t0 = time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)

// reference is a simulated reference clock offset from the local one by theta (reference minus
// local); it stamps with whole seconds, truncated, as an HTTP Date header does.
type reference struct{ theta time.Duration }

// exchange is one call sent at local instant sent that the reference reads after delay and that
// is answered rtt after it was sent: it returns what an Observe receives.
func (r reference) exchange(sent time.Time, delay, rtt time.Duration) (time.Time, time.Time, time.Time) {
	read := sent.Add(delay).Add(r.theta)
	return sent, sent.Add(rtt), read.Truncate(time.Second)
}

func TestOneExchangeBoundsTheOffsetToASecondPlusTheRoundTrip(t *testing.T) {
	e := New(Options{})
	sent := t0.Add(300 * time.Millisecond)
	e.Observe(sent, sent.Add(10*time.Millisecond), t0.Add(2*time.Second))
	est := e.Estimate(sent.Add(10 * time.Millisecond))
	// reference read [t0+2s, t0+3s) somewhere in local [t0+0.3s, t0+0.31s].
	wantLo, wantHi := 2*time.Second-310*time.Millisecond, 3*time.Second-300*time.Millisecond
	if !est.Known || est.Lo != wantLo || est.Hi != wantHi || est.Exchanges != 1 || est.MinRTT != 10*time.Millisecond {
		t.Fatalf("got %+v, want Known, [%v, %v], 1 exchange, MinRTT 10ms", est, wantLo, wantHi)
	}
	if got := New(Options{}).Estimate(t0); got.Known {
		t.Errorf("no exchange: got %+v, want unknown", got)
	}
}

// TestExchangesAtRandomPhasesNarrowToTheRoundTrip: whatever the true offset, the interval holds
// it, and a few hundred exchanges at random instants narrow it to about the round trip.
func TestExchangesAtRandomPhasesNarrowToTheRoundTrip(t *testing.T) {
	const rtt = 4 * time.Millisecond
	for _, theta := range []time.Duration{0, 2 * time.Second, -2 * time.Second, -100 * time.Millisecond,
		333 * time.Millisecond, 90 * time.Minute, -999 * time.Millisecond} {
		t.Run(theta.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(theta)))
			ref := reference{theta}
			e := New(Options{})
			now := t0
			for i := range 300 {
				now = now.Add(time.Duration(rng.Int64N(int64(100 * time.Millisecond))))
				s, r, d := ref.exchange(now, time.Duration(rng.Int64N(int64(rtt))), rtt)
				e.Observe(s, r, d)
				est := e.Estimate(r)
				if est.Lo > theta || est.Hi < theta {
					t.Fatalf("after %d exchanges: [%v, %v] does not hold the offset %v", i+1, est.Lo, est.Hi, theta)
				}
				// The correction never overshoots: it lies between 0 and the offset, so the
				// corrected clock is off by no more than the host's, and in the same direction.
				if c := est.Correction(); c < min(0, theta) || c > max(0, theta) {
					t.Fatalf("after %d exchanges: correction %v, not between 0 and the offset %v", i+1, c, theta)
				}
			}
			est := e.Estimate(now.Add(rtt))
			if w := est.Hi - est.Lo; w > rtt+20*time.Millisecond {
				t.Errorf("after 300 exchanges over %v: width %v, want at most rtt + 20ms = %v", now.Sub(t0), w, rtt+20*time.Millisecond)
			}
			if c := est.Correction(); (theta - c).Abs() > est.Hi-est.Lo {
				t.Errorf("correction %v leaves the clock off by %v, more than the width %v", c, theta-c, est.Hi-est.Lo)
			}
		})
	}
}

// TestProbesHalveTheInterval: from nothing, probes sent at NextProbe reach about the round trip
// in about log2(1s / rtt) probes, one per second.
func TestProbesHalveTheInterval(t *testing.T) {
	const rtt = 2 * time.Millisecond
	for _, theta := range []time.Duration{0, 1234567 * time.Microsecond, -2 * time.Second, 5 * time.Millisecond} {
		t.Run(theta.String(), func(t *testing.T) {
			ref := reference{theta}
			e := New(Options{})
			now := t0.Add(123 * time.Millisecond)
			probes := 0
			for est := e.Estimate(now); !est.Known || est.Hi-est.Lo > 2*rtt; est = e.Estimate(now) {
				if probes == 15 {
					t.Fatalf("15 probes: [%v, %v], width %v, want at most %v", est.Lo, est.Hi, est.Hi-est.Lo, 2*rtt)
				}
				at := NextProbe(est, now, rtt, 10*time.Millisecond, time.Second)
				if at.Before(now.Add(10 * time.Millisecond)) {
					t.Fatalf("NextProbe %v is less than lead after now %v", at, now)
				}
				s, r, d := ref.exchange(at, rtt/2, rtt)
				e.Observe(s, r, d)
				now, probes = r, probes+1
				if est := e.Estimate(now); est.Lo > theta || est.Hi < theta {
					t.Fatalf("probe %d: [%v, %v] does not hold %v", probes, est.Lo, est.Hi, theta)
				}
			}
			if probes > 11 {
				t.Errorf("%d probes to reach 2 × rtt, want at most 11 (halving 1s)", probes)
			}
		})
	}
}

func TestOldExchangesWidenThenAgeOut(t *testing.T) {
	e := New(Options{Window: time.Minute, MaxDrift: 100e-6})
	e.Observe(t0, t0.Add(time.Millisecond), t0.Add(5*time.Second))
	fresh := e.Estimate(t0.Add(time.Millisecond))
	later := e.Estimate(t0.Add(time.Millisecond + 50*time.Second))
	// 50s at 100ppm: 5ms on each side.
	if later.Lo != fresh.Lo-5*time.Millisecond || later.Hi != fresh.Hi+5*time.Millisecond {
		t.Errorf("after 50s: [%v, %v], want [%v, %v] widened by 5ms", later.Lo, later.Hi, fresh.Lo, fresh.Hi)
	}
	if got := e.Estimate(t0.Add(61 * time.Second)); got.Known {
		t.Errorf("past the window: got %+v, want unknown", got)
	}
}

// TestAStepWins: the local clock steps by 1.5s; the exchanges after the step contradict the
// ones before, and the estimate follows the new offset at once instead of an empty interval.
func TestAStepWins(t *testing.T) {
	const rtt = 2 * time.Millisecond
	rng := rand.New(rand.NewPCG(7, 7))
	e := New(Options{})
	now := t0
	for _, theta := range []time.Duration{0, 1500 * time.Millisecond, -700 * time.Millisecond} {
		ref := reference{theta}
		for range 100 {
			now = now.Add(time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
			s, r, d := ref.exchange(now, time.Duration(rng.Int64N(int64(rtt))), rtt)
			e.Observe(s, r, d)
		}
		est := e.Estimate(now.Add(rtt))
		if est.Lo > theta || est.Hi < theta || est.Hi-est.Lo > 100*time.Millisecond {
			t.Errorf("offset %v: [%v, %v], want a narrow interval holding it", theta, est.Lo, est.Hi)
		}
	}
}

func TestObserveIgnoresAnAnswerBeforeItsQuestion(t *testing.T) {
	e := New(Options{})
	e.Observe(t0, t0.Add(-time.Millisecond), t0)
	if est := e.Estimate(t0); est.Known {
		t.Errorf("got %+v, want unknown", est)
	}
}

func TestCorrectionIsTheLeastChange(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		est  Estimate
		want time.Duration
	}{
		{Estimate{}, 0},
		{Estimate{Known: true, Lo: -5 * ms, Hi: 5 * ms}, 0},
		{Estimate{Known: true, Lo: 0, Hi: 5 * ms}, 0},
		{Estimate{Known: true, Lo: 10 * ms, Hi: 20 * ms}, 10 * ms},
		{Estimate{Known: true, Lo: -2010 * ms, Hi: -1990 * ms}, -1990 * ms},
	} {
		if got := c.est.Correction(); got != c.want {
			t.Errorf("[%v, %v]: Correction %v, want %v", c.est.Lo, c.est.Hi, got, c.want)
		}
	}
	est := Estimate{Known: true, Lo: -2010 * ms, Hi: -1990 * ms}
	if est.Offset() != -2000*ms || est.Uncertainty() != 10*ms {
		t.Errorf("Offset %v ± %v, want -2s ± 10ms", est.Offset(), est.Uncertainty())
	}
}

func BenchmarkObserve(b *testing.B) {
	e := New(Options{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		now := t0
		for pb.Next() {
			now = now.Add(time.Microsecond)
			e.Observe(now, now.Add(time.Millisecond), now.Truncate(time.Second))
		}
	})
}
