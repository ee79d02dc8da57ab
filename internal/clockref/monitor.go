package clockref

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Monitor turns an Estimator into the gateway's clock: the local clock corrected by what the
// exchanges say (Now), gauges, a rate-limited warning and a readiness check. Run keeps it up to
// date and, when given a probe, makes exchanges of its own when traffic does not.
//
// It is safe for concurrent use; the zero value is not usable (use NewMonitor).
type Monitor struct {
	o    MonitorOptions
	last atomic.Pointer[state]
	corr atomic.Int64 // ns added to the local clock by Now

	mu       sync.Mutex // serializes Update
	warnedAt time.Time  // guarded by mu
	warning  bool       // guarded by mu
}

// state is what the last Update found.
type state struct {
	est      Estimate
	corr     time.Duration
	notReady error
}

// MonitorOptions configure a Monitor.
type MonitorOptions struct {
	// Estimator gathers the exchanges (Required).
	Estimator *Estimator
	// Now is the local clock, the one the exchanges are timed with (Optional; default time.Now).
	Now func() time.Time
	// Correct makes Now correct the local clock by Estimate.Correction, bounded by
	// MaxCorrection (Optional; default false: Now is the local clock).
	Correct bool
	// MaxCorrection bounds the correction's magnitude (Required with Correct).
	MaxCorrection time.Duration
	// WarnOffset: Update logs a warning (at most once a minute) while the local clock is off by
	// more than it for certain, that is whatever the offset is in [Lo, Hi] (Optional; 0: never).
	WarnOffset time.Duration
	// MaxOffset: Ready fails while the clock of Now is off by more than it for certain
	// (Optional; 0: Ready never fails).
	MaxOffset time.Duration
	// Log receives the warnings (Optional; default none).
	Log *zap.Logger
	// Registerer receives the gauges (Optional; nil: not exported).
	Registerer prometheus.Registerer
	// Subject names the reference in logs and errors (Optional; default "the reference").
	Subject string
}

// Intervals of Run and of the warning.
const (
	updateEvery  = time.Second
	refreshEvery = 10 * time.Second // an idle replica's probe, once the interval is narrow
	warnEvery    = time.Minute
	probeLead    = 20 * time.Millisecond // a probe is scheduled at least this far ahead
	probeTimeout = 2 * time.Second
)

// NewMonitor returns a Monitor whose Now is the local clock until the first Update.
func NewMonitor(o MonitorOptions) (*Monitor, error) {
	if o.Estimator == nil {
		return nil, errors.New("clockref: MonitorOptions.Estimator is required")
	}
	if o.Correct && o.MaxCorrection <= 0 {
		return nil, errors.New("clockref: MonitorOptions.MaxCorrection must be positive with Correct")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Subject == "" {
		o.Subject = "the reference"
	}
	m := &Monitor{o: o}
	m.last.Store(&state{})
	if o.Registerer != nil {
		unknown := math.NaN()
		known := func(f func(*state) float64) func(*state) float64 {
			return func(s *state) float64 {
				if !s.est.Known {
					return unknown
				}
				return f(s)
			}
		}
		c := &gauges{m: m}
		c.add("ratelimit_clock_offset_seconds",
			"Measured offset of this host's clock: "+o.Subject+"'s time minus the local time (middle of the interval; NaN until measured).",
			known(func(s *state) float64 { return s.est.Offset().Seconds() }))
		c.add("ratelimit_clock_offset_uncertainty_seconds",
			"Half the width of the interval that holds the clock offset (NaN until measured).",
			known(func(s *state) float64 { return s.est.Uncertainty().Seconds() }))
		c.add("ratelimit_clock_error_bound_seconds",
			"Bound on how far the clock decisions use is from "+o.Subject+"'s, whatever the offset is within the measured interval (NaN until measured).",
			known(func(s *state) float64 { return s.est.ErrorBound(s.corr).Seconds() }))
		c.add("ratelimit_clock_correction_seconds",
			"Correction added to the local clock for decisions (0 when store.dynamodb.clock.correct is off).",
			func(s *state) float64 { return s.corr.Seconds() })
		if err := o.Registerer.Register(c); err != nil {
			return nil, fmt.Errorf("register clock metrics: %w", err)
		}
	}
	return m, nil
}

// Now is the clock decisions use: the local clock plus the correction of the last Update.
func (m *Monitor) Now() time.Time { return m.o.Now().Add(time.Duration(m.corr.Load())) }

// Estimate returns the estimate of the last Update.
func (m *Monitor) Estimate() Estimate { return m.last.Load().est }

// Correction returns the correction Now applies.
func (m *Monitor) Correction() time.Duration { return time.Duration(m.corr.Load()) }

// Ready fails while the clock of Now is off by more than MaxOffset for certain.
func (m *Monitor) Ready() error { return m.last.Load().notReady }

// Update recomputes the estimate at local instant now, the correction, the gauges, the
// readiness and the warning. Run calls it every second; tests call it directly.
func (m *Monitor) Update(now time.Time) Estimate {
	m.mu.Lock()
	defer m.mu.Unlock()
	est := m.o.Estimator.Estimate(now)
	s := &state{est: est}
	if m.o.Correct {
		s.corr = max(-m.o.MaxCorrection, min(m.o.MaxCorrection, est.Correction()))
	}
	// The clock of Now is off by offset − corr, somewhere in [Lo − corr, Hi − corr].
	if mo := m.o.MaxOffset; mo > 0 && est.Known && (est.Lo-s.corr > mo || est.Hi-s.corr < -mo) {
		s.notReady = fmt.Errorf("the decision clock is %s %s's by %v ± %v (host clock corrected by %v): more than store.dynamodb.clock.max_offset %v",
			aheadOrBehind(est.Offset()-s.corr), m.o.Subject, (est.Offset() - s.corr).Abs().Round(time.Microsecond),
			est.Uncertainty().Round(time.Microsecond), s.corr, mo)
	}
	m.corr.Store(int64(s.corr))
	m.last.Store(s)
	m.warn(now, s)
	return est
}

// aheadOrBehind says how a clock relates to the reference for an offset (reference minus clock).
func aheadOrBehind(offset time.Duration) string {
	if offset < 0 {
		return "ahead of"
	}
	return "behind"
}

// warn logs while the local clock is off by more than WarnOffset for certain: once, then once a
// minute while it stays so, and once when it comes back.
func (m *Monitor) warn(now time.Time, s *state) {
	wo := m.o.WarnOffset
	if wo <= 0 {
		return
	}
	est := s.est
	off := est.Known && (est.Lo > wo || est.Hi < -wo)
	switch {
	case off && (!m.warning || now.Sub(m.warnedAt) >= warnEvery):
		m.o.Log.Warn("this host's clock is off; fix its time synchronization (NTP)",
			zap.String("reference", m.o.Subject), zap.String("host_clock", aheadOrBehind(est.Offset())),
			zap.Duration("offset", est.Offset()), zap.Duration("uncertainty", est.Uncertainty()),
			zap.Duration("warn_offset", wo), zap.Duration("correction", s.corr), zap.Bool("correct", m.o.Correct))
		m.warning, m.warnedAt = true, now
	case !off && m.warning && est.Known:
		m.o.Log.Info("this host's clock agrees with the reference again",
			zap.String("reference", m.o.Subject),
			zap.Duration("offset", est.Offset()), zap.Duration("uncertainty", est.Uncertainty()))
		m.warning = false
	}
}

// needsProbe reports whether an exchange of the Monitor's own would teach something: none yet,
// an interval much wider than the round trip allows, or the newest exchange getting old.
func needsProbe(est Estimate, now time.Time) bool {
	return !est.Known || est.Uncertainty() > est.MinRTT+time.Millisecond || now.Sub(est.Newest) > refreshEvery
}

// Run updates the Monitor every second until ctx ends. With a probe, which makes one exchange
// with the reference, timed and observed like any other (the Estimator's Observe is called on
// its way back), it also sends probes timed to halve the interval (NextProbe) while it is wide,
// and one every 10s while traffic makes none. nil: only traffic's exchanges.
func (m *Monitor) Run(ctx context.Context, probe func(ctx context.Context) error) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := m.o.Now()
		est := m.Update(now)
		if probe == nil || !needsProbe(est, now) {
			t.Reset(updateEvery)
			continue
		}
		at := NextProbe(est, now, est.MinRTT, probeLead, DefaultResolution)
		w := time.NewTimer(at.Sub(now))
		select {
		case <-ctx.Done():
			w.Stop()
			return
		case <-w.C:
		}
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		if err := probe(pctx); err != nil && ctx.Err() == nil {
			m.o.Log.Debug("clock probe failed", zap.String("reference", m.o.Subject), zap.Error(err))
		}
		cancel()
		t.Reset(0)
	}
}

// gauges exports the clock gauges of one Update's state per scrape: read one by one while
// Updates go on, a scrape could pair one estimate's offset with the next one's correction.
type gauges struct {
	m     *Monitor
	descs []*prometheus.Desc
	vals  []func(*state) float64
}

func (g *gauges) add(name, help string, f func(*state) float64) {
	g.descs = append(g.descs, prometheus.NewDesc(name, help, nil, nil))
	g.vals = append(g.vals, f)
}

// Describe implements prometheus.Collector.
func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range g.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	s := g.m.last.Load()
	for i, d := range g.descs {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, g.vals[i](s))
	}
}
