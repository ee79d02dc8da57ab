package protect

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/histbuckets"
)

// Metrics are the upstream protection's collectors:
//
//	ratelimit_upstream_concurrency_limit      the limit in force (slots)
//	ratelimit_upstream_inflight               slots taken: requests in flight to the upstream
//	ratelimit_upstream_shed_total{priority}   requests shed: critical|default|sheddable
//	ratelimit_upstream_queue_seconds          time requests waited for a slot, whether they
//	    got one or were shed (requests that found a slot at once are not observed)
//
// Labels are the three class names only: never a client's value.
type Metrics struct {
	shedTotal [NumClasses]prometheus.Counter
	queue     prometheus.Histogram
	limiter   atomic.Pointer[Limiter] // read by the gauges; nil before a Limiter is attached
}

// NewMetrics registers the collectors on reg (nil: unregistered, for tests that read them
// directly). It fails when they are registered already.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{}
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_upstream_shed_total",
		Help: "Requests the upstream protection shed (no concurrency slot within queue_timeout), by priority class.",
	}, []string{"priority"})
	for c := Class(0); c < NumClasses; c++ {
		m.shedTotal[c] = shed.WithLabelValues(c.String())
	}
	m.queue = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ratelimit_upstream_queue_seconds",
		Help:    "Time requests waited for an upstream concurrency slot (admitted or shed); requests that found one at once are not observed.",
		Buckets: histbuckets.Range(100e-6, 10, 11),
	})
	limit := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_upstream_concurrency_limit",
		Help: "The upstream concurrency limit in force (fixed, or adaptive from the upstream's latency).",
	}, func() float64 {
		if l := m.limiter.Load(); l != nil {
			return float64(l.Limit())
		}
		return 0
	})
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_upstream_inflight",
		Help: "Requests in flight to the upstream that hold a concurrency slot.",
	}, func() float64 {
		if l := m.limiter.Load(); l != nil {
			return float64(l.Inflight())
		}
		return 0
	})
	if reg != nil {
		var errs []error
		for _, c := range []prometheus.Collector{shed, m.queue, limit, inflight} {
			errs = append(errs, reg.Register(c))
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) attach(l *Limiter) { m.limiter.Store(l) }

func (m *Metrics) shed(c Class) {
	if m != nil {
		m.shedTotal[c].Inc()
	}
}

func (m *Metrics) waited(d time.Duration) {
	if m != nil {
		m.queue.Observe(d.Seconds())
	}
}
