package rls

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Call results, the values of ratelimit_rls_calls_total{result}. One per ShouldRateLimit call.
const (
	callOK                = iota // answered OK (no descriptor over its limit, or shadow)
	callOverLimit                // answered OVER_LIMIT
	callUnmatched                // the domain has no rules, or no descriptor matched one
	callStoreErrorAllowed        // the store failed; answered OK (store.on_error allow)
	callStoreErrorDenied         // the store failed; answered UNAVAILABLE (store.on_error deny)
	callInvalid                  // the request was malformed: answered INVALID_ARGUMENT
	callUnlimited                // answered OK: every matched rule is unlimited (nothing charged)
	numCallResults
)

var callResultNames = [numCallResults]string{
	"ok", "over_limit", "unmatched", "store_error_allowed", "store_error_denied", "invalid", "unlimited",
}

// Metrics are the rate limit service's Prometheus collectors. Labels hold configured domains
// and rule labels (policy.RLSRule.Label), never a descriptor's value unless a rule asks for it
// with detailed_metric or value_to_metric. A descriptor with a limit override counts under its
// domain's override label (overrideLabel), never under its entries: the caller chooses them, so
// a label built from them let one call add series of a megabyte each, kept forever. Safe for
// concurrent use; one Metrics serves every reload.
//
// Series (the first four are shared with the proxy: same names, help and labels, so that a
// dashboard of policies shows RLS rules beside them):
//
//	ratelimit_requests_total{policy,result}      policy: the rule's label; result: allowed|
//	    limited|shadow_limited, one per charged descriptor as the proxy counts charges
//	ratelimit_store_duration_seconds{backend}    time spent in Store.Take
//	ratelimit_store_errors_total{backend,reason} reason: timeout|error
//	ratelimit_release_errors_total               hits_addend 0 checks the store failed to give back
//	ratelimit_rls_calls_total{domain,result}     one per call; domain "" for unknown domains
//	ratelimit_rls_call_duration_seconds          time to answer a call, store included
type Metrics struct {
	requests      *prometheus.CounterVec
	storeDuration *prometheus.HistogramVec
	storeErrors   *prometheus.CounterVec
	releaseErrors prometheus.Counter
	calls         *prometheus.CounterVec
	callDuration  prometheus.Histogram

	mu      sync.RWMutex
	byRule  map[string]*ruleCounters
	byCall  map[string]*[numCallResults]prometheus.Counter
	backend map[string]*storeCounters
}

type ruleCounters struct {
	allowed, limited, shadowLimited prometheus.Counter
}

type storeCounters struct {
	duration         prometheus.Observer
	timeout, failure prometheus.Counter
}

// NewMetrics creates the collectors and registers them on reg (nil: not registered). A
// collector already registered under the same name and help (the proxy's) is reused. An error
// means reg holds a different collector under one of these names.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		byRule:  make(map[string]*ruleCounters),
		byCall:  make(map[string]*[numCallResults]prometheus.Counter),
		backend: make(map[string]*storeCounters),
	}
	var errs []error
	m.requests = register(reg, &errs, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_requests_total",
		Help: "Charges evaluated per policy: allowed, limited (rejected the request) or shadow_limited (a shadow policy that would have rejected).",
	}, []string{"policy", "result"}))
	m.storeDuration = register(reg, &errs, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ratelimit_store_duration_seconds",
		Help:    "Time the rate-limit store took to decide one request.",
		Buckets: prometheus.ExponentialBucketsRange(10e-6, 1, 11),
	}, []string{"backend"}))
	m.storeErrors = register(reg, &errs, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_store_errors_total",
		Help: "Requests the rate-limit store could not decide, by reason (timeout, error).",
	}, []string{"backend", "reason"}))
	m.releaseErrors = register(reg, &errs, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_release_errors_total",
		Help: "Concurrency slots or charge_on reservations the store failed to give back (held until a lease expires or a window ends).",
	}))
	m.calls = register(reg, &errs, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_rls_calls_total",
		Help: "ShouldRateLimit calls by domain (\"\" when unknown) and result (ok, over_limit, unmatched, unlimited, store_error_allowed, store_error_denied, invalid).",
	}, []string{"domain", "result"}))
	m.callDuration = register(reg, &errs, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ratelimit_rls_call_duration_seconds",
		Help: "Time to answer one ShouldRateLimit call, store included (Envoy's default timeout is 20ms).",
		// 10µs to 1s, ×√10 apart: a memory decision, then the 20ms of Envoy's default timeout.
		Buckets: prometheus.ExponentialBucketsRange(10e-6, 1, 11),
	}))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m.callCounters("")
	return m, nil
}

// register registers c on reg, or returns the equal collector reg already holds.
func register[C prometheus.Collector](reg prometheus.Registerer, errs *[]error, c C) C {
	if reg == nil {
		return c
	}
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errs = append(*errs, fmt.Errorf("rls: register metrics: %w", err))
	return c
}

func (m *Metrics) rule(label string) *ruleCounters {
	m.mu.RLock()
	c := m.byRule[label]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.byRule[label]; c == nil {
		c = &ruleCounters{
			allowed:       m.requests.WithLabelValues(label, "allowed"),
			limited:       m.requests.WithLabelValues(label, "limited"),
			shadowLimited: m.requests.WithLabelValues(label, "shadow_limited"),
		}
		m.byRule[label] = c
	}
	return c
}

// callCounters returns a domain's call counters. Only configured domains (and "") get here:
// a caller cannot grow the series by naming domains.
func (m *Metrics) callCounters(domain string) *[numCallResults]prometheus.Counter {
	m.mu.RLock()
	c := m.byCall[domain]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.byCall[domain]; c == nil {
		c = new([numCallResults]prometheus.Counter)
		for i, n := range callResultNames {
			c[i] = m.calls.WithLabelValues(domain, n)
		}
		m.byCall[domain] = c
	}
	return c
}

func (m *Metrics) store(backend string) *storeCounters {
	m.mu.RLock()
	c := m.backend[backend]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.backend[backend]; c == nil {
		c = &storeCounters{
			duration: m.storeDuration.WithLabelValues(backend),
			timeout:  m.storeErrors.WithLabelValues(backend, "timeout"),
			failure:  m.storeErrors.WithLabelValues(backend, "error"),
		}
		m.backend[backend] = c
	}
	return c
}

// overrideLabel is the policy label of every limit override in a domain ("<domain>.override"):
// one per configured domain, so the series stay bounded by the configuration whatever entries
// callers send.
func overrideLabel(domain string) string { return domain + ".override" }
