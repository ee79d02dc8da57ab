package clockref

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fed returns an Estimator that has seen 300 exchanges at random-ish phases with a reference
// offset by theta, ending at local instant end.
func fed(theta time.Duration) (*Estimator, time.Time) {
	e := New(Options{})
	ref := reference{theta}
	now := t0
	for i := range 300 {
		now = now.Add(37*time.Millisecond + time.Duration(i%7)*time.Millisecond)
		s, r, d := ref.exchange(now, time.Millisecond, 2*time.Millisecond)
		e.Observe(s, r, d)
	}
	return e, now.Add(2 * time.Millisecond)
}

func TestMonitorCorrectsWithinTheBound(t *testing.T) {
	for _, c := range []struct {
		name      string
		theta     time.Duration
		correct   bool
		maxCorr   time.Duration
		wantLo    time.Duration // the correction applied, within [wantLo, wantHi]
		wantHi    time.Duration
		maxOffset time.Duration
		ready     bool
	}{
		{"in sync", 0, true, 5 * time.Second, 0, 0, 50 * time.Millisecond, true},
		{"2s ahead, corrected", -2 * time.Second, true, 5 * time.Second, -2 * time.Second, -1980 * time.Millisecond, 50 * time.Millisecond, true},
		{"2s behind, corrected", 2 * time.Second, true, 5 * time.Second, 1980 * time.Millisecond, 2 * time.Second, 50 * time.Millisecond, true},
		{"2s ahead, bounded", -2 * time.Second, true, time.Second, -time.Second, -time.Second, 50 * time.Millisecond, false},
		{"2s ahead, not corrected", -2 * time.Second, false, 0, 0, 0, 50 * time.Millisecond, false},
		{"2s ahead, no readiness check", -2 * time.Second, false, 0, 0, 0, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, end := fed(c.theta)
			local := end
			m, err := NewMonitor(MonitorOptions{Estimator: e, Now: func() time.Time { return local },
				Correct: c.correct, MaxCorrection: c.maxCorr, MaxOffset: c.maxOffset})
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Now(); !got.Equal(local) {
				t.Errorf("before Update: Now %v, want the local clock %v", got, local)
			}
			m.Update(end)
			if corr := m.Correction(); corr < c.wantLo || corr > c.wantHi {
				t.Errorf("correction %v, want within [%v, %v]", corr, c.wantLo, c.wantHi)
			}
			if got := m.Now().Sub(local); got != m.Correction() {
				t.Errorf("Now is local + %v, want + the correction %v", got, m.Correction())
			}
			if err := m.Ready(); (err == nil) != c.ready {
				t.Errorf("Ready: %v, want ready %v", err, c.ready)
			}
		})
	}
}

func TestMonitorGaugesAndWarnings(t *testing.T) {
	e, end := fed(-2 * time.Second)
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMonitor(MonitorOptions{Estimator: e, Correct: true, MaxCorrection: 5 * time.Second,
		WarnOffset: 100 * time.Millisecond, Log: zap.New(core), Registerer: reg, Subject: "DynamoDB"})
	if err != nil {
		t.Fatal(err)
	}
	if v := gauge(t, reg, "ratelimit_clock_offset_seconds"); !math.IsNaN(v) {
		t.Errorf("offset gauge before any estimate: %v, want NaN", v)
	}
	m.Update(end)
	off := gauge(t, reg, "ratelimit_clock_offset_seconds")
	unc := gauge(t, reg, "ratelimit_clock_offset_uncertainty_seconds")
	corr := gauge(t, reg, "ratelimit_clock_correction_seconds")
	if eb := gauge(t, reg, "ratelimit_clock_error_bound_seconds"); eb <= 0 || eb > 4*unc+1e-9 || math.Abs(off-corr) > eb {
		t.Errorf("error bound %v, want within (|offset - correction| = %v, 2 × width = %v]", eb, math.Abs(off-corr), 4*unc)
	}
	if math.Abs(off+2) > unc || unc <= 0 || unc > 0.02 || math.Abs(corr+2) > 2*unc {
		t.Errorf("gauges offset %v ± %v, correction %v; want -2 within a narrow uncertainty", off, unc, corr)
	}
	m.Update(end.Add(time.Second))      // within a minute: no second warning
	m.Update(end.Add(61 * time.Second)) // a minute later: the warning again (the exchanges aged out: unknown, no)
	if n := logs.FilterMessageSnippet("clock is off").Len(); n != 1 {
		t.Errorf("%d warnings, want 1 (then the exchanges aged out)", n)
	}
	// Back in sync: one info line.
	ref := reference{0}
	now := end.Add(62 * time.Second)
	for range 100 {
		now = now.Add(41 * time.Millisecond)
		e.Observe(ref.exchange(now, time.Millisecond, 2*time.Millisecond))
	}
	m.Update(now)
	if n := logs.FilterMessageSnippet("agrees with the reference again").Len(); n != 1 {
		t.Errorf("%d recovery lines, want 1", n)
	}
}

// gauge reads the registered gauge called name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestMonitorRunProbesUntilNarrow: an idle Monitor with a Probe narrows the interval by itself.
// The probe answers at once from a simulated reference 1.5s ahead, on the real clock: Run waits
// for the instants NextProbe picks, about one per second.
func TestMonitorRunProbesUntilNarrow(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of real probing")
	}
	e := New(Options{})
	ref := reference{1500 * time.Millisecond}
	var probes atomic.Int32
	m, err := NewMonitor(MonitorOptions{Estimator: e})
	if err != nil {
		t.Fatal(err)
	}
	probe := func(context.Context) error {
		probes.Add(1)
		sent := time.Now()
		e.Observe(ref.exchange(sent, 0, time.Since(sent)))
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, probe); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		est := m.Estimate()
		if est.Known && est.Uncertainty() < 20*time.Millisecond {
			if est.Lo > ref.theta || est.Hi < ref.theta {
				t.Fatalf("[%v, %v] does not hold %v", est.Lo, est.Hi, ref.theta)
			}
			t.Logf("%d probes: %v ± %v", probes.Load(), est.Offset(), est.Uncertainty())
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s and %d probes: %+v, want an uncertainty under 20ms", probes.Load(), est)
		}
		time.Sleep(50 * time.Millisecond) // polling a running loop with a deadline
	}
}

func TestNewMonitorRefusesBadOptions(t *testing.T) {
	for _, o := range []MonitorOptions{{}, {Estimator: New(Options{}), Correct: true}} {
		if _, err := NewMonitor(o); err == nil || !strings.HasPrefix(err.Error(), "clockref:") {
			t.Errorf("%+v: err %v, want a clockref error", o, err)
		}
	}
}

// TestMonitorGaugesOfOneEstimate: a scrape exports the gauges of one Update, however Updates
// and scrapes interleave. Read one by one, a scrape could pair a known offset with the
// correction of an estimate that had aged out (0), or the other way round.
func TestMonitorGaugesOfOneEstimate(t *testing.T) {
	e, end := fed(-2 * time.Second)
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMonitor(MonitorOptions{Estimator: e, Correct: true, MaxCorrection: 5 * time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				m.Update(end) // known: 2 s behind, corrected
			} else {
				m.Update(end.Add(time.Hour)) // the exchanges aged out: unknown, no correction
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for range 3000 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		v := map[string]float64{}
		for _, mf := range mfs {
			v[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
		off, corr := v["ratelimit_clock_offset_seconds"], v["ratelimit_clock_correction_seconds"]
		if math.IsNaN(off) != (corr == 0) {
			t.Fatalf("one scrape: offset %v with correction %v, want both of one estimate", off, corr)
		}
	}
}
