package rls

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/histbuckets"
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
// and rule labels (envoyrules.Rule.Label), never a descriptor's value unless a rule asks for it
// with detailed_metric or value_to_metric. A descriptor with a limit override counts under its
// domain's override label (overrideLabel), never under its entries: the caller chooses them, so
// a label built from them let one call add series of a megabyte each, kept forever. Safe for
// concurrent use; one Metrics serves every reload.
//
// The series are listed once, in docs/envoy.md ("Metrics"); the first four are the proxy's
// (answer.Counters: same names, help and labels, so that a dashboard of policies shows RLS
// rules beside them), counted per charged descriptor as the proxy counts charges.
type Metrics struct {
	shared       *answer.Counters // the series the proxy counts into too
	calls        *prometheus.CounterVec
	callDuration prometheus.Histogram
	byCall       *answer.Children[*[numCallResults]prometheus.Counter]

	mu     sync.Mutex
	valued map[string]map[string]struct{} // rule label -> the value labels it has series for
}

// NewMetrics creates the collectors and registers them on reg (nil: not registered). A
// collector already registered under the same name and help (the proxy's) is reused. An error
// means reg holds a different collector under one of these names.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	shared, err := answer.NewCounters(reg)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	m := &Metrics{shared: shared}
	var errs []error
	m.calls = register(reg, &errs, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_rls_calls_total",
		Help: "ShouldRateLimit calls by domain (\"\" when unknown) and result (ok, over_limit, unmatched, unlimited, store_error_allowed, store_error_denied, invalid).",
	}, []string{"domain", "result"}))
	m.callDuration = register(reg, &errs, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ratelimit_rls_call_duration_seconds",
		Help: "Time to answer one ShouldRateLimit call, store included (Envoy's default timeout is 20ms).",
		// 10µs to 1s, ×√10 apart: a memory decision, then the 20ms of Envoy's default timeout.
		Buckets: histbuckets.Range(10e-6, 1, 11),
	}))
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// Only configured domains (and "") get here: a caller cannot grow the series by naming domains.
	m.byCall = answer.NewChildren(func(domain string) *[numCallResults]prometheus.Counter {
		c := new([numCallResults]prometheus.Counter)
		for i, n := range callResultNames {
			c[i] = m.calls.WithLabelValues(domain, n)
		}
		return c
	})
	m.callCounters("")
	return m, nil
}

// register registers c on reg, or returns the equal collector reg already holds.
func register[C prometheus.Collector](reg prometheus.Registerer, errs *[]error, c C) C {
	got, err := answer.Register(reg, c)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("rls: %w", err))
	}
	return got
}

func (m *Metrics) rule(label string) *answer.PolicyCounters { return m.shared.Policy(label) }

// valueRule returns the counters of a rule whose metric label holds descriptor values (label,
// built per call by envoyrules.Match.Label) rather than its static label: label's own series while the
// rule has fewer than maxValueLabels of them and label is short enough, else the rule's
// overflow series. A label seen once keeps its series.
func (m *Metrics) valueRule(static, label string) *answer.PolicyCounters {
	if label == static {
		return m.rule(static)
	}
	m.mu.Lock()
	seen := m.valued[static]
	_, known := seen[label]
	if !known && len(label) <= maxValueLabelBytes && len(seen) < maxValueLabels {
		if seen == nil {
			if m.valued == nil {
				m.valued = make(map[string]map[string]struct{})
			}
			seen = make(map[string]struct{})
			m.valued[static] = seen
		}
		seen[label] = struct{}{}
		known = true
	}
	m.mu.Unlock()
	if !known {
		return m.rule(static + overflowSuffix)
	}
	return m.rule(label)
}

// callCounters returns a domain's call counters. Only configured domains (and "") get here:
// a caller cannot grow the series by naming domains.
func (m *Metrics) callCounters(domain string) *[numCallResults]prometheus.Counter {
	return m.byCall.Get(domain)
}

func (m *Metrics) store(backend string) *answer.StoreCounters { return m.shared.Store(backend) }

// overrideLabel is the policy label of every limit override in a domain ("<domain>.override"):
// one per configured domain, so the series stay bounded by the configuration whatever entries
// callers send.
func overrideLabel(domain string) string { return domain + ".override" }

// Bounds on the labels of rules with detailed_metric or value_to_metric, whose labels hold
// descriptor values that callers choose: per such rule, at most maxValueLabels distinct labels of
// at most maxValueLabelBytes each; any other value counts under the rule's label followed by
// overflowSuffix. The series stay bounded by the configuration (rules × (maxValueLabels + 1) ×
// 3 results) whatever callers send.
const (
	maxValueLabels     = 100
	maxValueLabelBytes = 256
	overflowSuffix     = ".other_values"
)
