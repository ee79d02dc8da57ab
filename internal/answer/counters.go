package answer

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/histbuckets"
)

// Counters are the series both front ends count into, with the same names, help and labels, so
// that a dashboard of policies shows RLS rules beside proxy policies and an alert fires the
// same for either: ratelimit_requests_total, ratelimit_store_duration_seconds,
// ratelimit_store_errors_total and ratelimit_release_errors_total (docs/operations.md lists
// every series once).
//
// Labels hold policy names and rule labels from the configuration and the store's name, never
// anything a client chooses. Safe for concurrent use.
type Counters struct {
	requests      *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	// ReleaseErrors counts give-backs the store failed to make.
	ReleaseErrors prometheus.Counter

	policies *Children[*PolicyCounters]
	stores   *Children[*StoreCounters]
}

// PolicyCounters are one policy's ratelimit_requests_total children.
type PolicyCounters struct {
	Allowed, Limited, ShadowLimited prometheus.Counter
}

// StoreCounters are one store's duration and error children.
type StoreCounters struct {
	Duration         prometheus.Observer
	Timeout, Failure prometheus.Counter
}

// NewCounters creates the shared collectors and registers them on reg (nil: not registered). A
// collector reg already holds under the same name, help and labels (the other front end's) is
// reused, so that both front ends of one process count into one series. An error means reg holds
// a different collector under one of these names.
func NewCounters(reg prometheus.Registerer) (*Counters, error) {
	var errs []error
	c := &Counters{
		requests: collect(reg, &errs, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_requests_total",
			Help: "Charges evaluated per policy: allowed, limited (rejected the request) or shadow_limited (a shadow policy that would have rejected).",
		}, []string{"policy", "result"})),
		storeDuration: collect(reg, &errs, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ratelimit_store_duration_seconds",
			Help: "Time the rate-limit store took to decide one request.",
			// 10µs (an in-memory shard) to 1s (a struggling remote store), ×√10 apart.
			Buckets: histbuckets.Range(10e-6, 1, 11),
		}, []string{"backend"})),
		storeErrors: collect(reg, &errs, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_store_errors_total",
			Help: "Requests the rate-limit store could not decide, by reason (timeout, error).",
		}, []string{"backend", "reason"})),
		ReleaseErrors: collect(reg, &errs, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_release_errors_total",
			Help: "Concurrency slots or charge_on reservations the store failed to give back (held until a lease expires or a window ends).",
		})),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c.policies = NewChildren(func(name string) *PolicyCounters {
		return &PolicyCounters{
			Allowed:       c.requests.WithLabelValues(name, "allowed"),
			Limited:       c.requests.WithLabelValues(name, "limited"),
			ShadowLimited: c.requests.WithLabelValues(name, "shadow_limited"),
		}
	})
	c.stores = NewChildren(func(backend string) *StoreCounters {
		return &StoreCounters{
			Duration: c.storeDuration.WithLabelValues(backend),
			Timeout:  c.storeErrors.WithLabelValues(backend, "timeout"),
			Failure:  c.storeErrors.WithLabelValues(backend, "error"),
		}
	})
	return c, nil
}

// Policy returns the counters of policy (or rule label) name, creating its series on first use.
// Names come from the configuration, so the set stays small; a reload that renames a policy
// leaves the old series with their final values, as Prometheus counters should.
func (c *Counters) Policy(name string) *PolicyCounters { return c.policies.Get(name) }

// Store returns the counters of the store named backend.
func (c *Counters) Store(backend string) *StoreCounters { return c.stores.Get(backend) }

// Register registers col on reg (nil: not registered), or returns the equal collector reg
// already holds, so that two front ends (or two reloads) share one series.
func Register[C prometheus.Collector](reg prometheus.Registerer, col C) (C, error) {
	if reg == nil {
		return col, nil
	}
	err := reg.Register(col)
	if err == nil {
		return col, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return col, fmt.Errorf("register metrics: %w", err)
}

// collect is Register, with the error appended to errs.
func collect[C prometheus.Collector](reg prometheus.Registerer, errs *[]error, col C) C {
	got, err := Register(reg, col)
	if err != nil {
		*errs = append(*errs, err)
	}
	return got
}

// Children caches one value per label: a metric's resolved children, so that the hot path does
// no label hashing after a label's first use. The labels must come from a bounded set (the
// configuration's names): nothing is ever removed. Safe for concurrent use.
type Children[T any] struct {
	mu       sync.RWMutex
	m        map[string]T
	newValue func(label string) T
}

// NewChildren returns an empty cache whose values newValue creates, once per label.
func NewChildren[T any](newValue func(label string) T) *Children[T] {
	return &Children[T]{m: make(map[string]T), newValue: newValue}
}

// Get returns label's value, creating it on first use.
func (c *Children[T]) Get(label string) T {
	c.mu.RLock()
	v, ok := c.m[label]
	c.mu.RUnlock()
	if ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok = c.m[label]; !ok {
		v = c.newValue(label)
		c.m[label] = v
	}
	return v
}
