package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Console is what the handler tells the operators' console (package console) about each request;
// *console.Console satisfies it. Both methods run on the request path, so they must be cheap and
// safe for concurrent use, and must not keep p or results.
type Console interface {
	// Adjust applies temporary exemptions to a planned request before its charges are taken:
	// it may replace a charge's Limit, or drop a charge (with its Policies and Values entries).
	Adjust(p *policy.Plan)
	// Observe counts a decided request: results[i] is charge i's verdict at now.
	Observe(now time.Time, p *policy.Plan, results []bucket.Result)
}

// exemplarEvery is how often at most a policy's limited counter gets a new exemplar: Prometheus
// keeps only the last one, and each costs the key's pseudonym (an HMAC).
const exemplarEvery = time.Second

// countLimited counts a limited charge of policy state for charge i of p. With a console, at
// most once per exemplarEvery the increment carries an OpenMetrics exemplar: the pseudonym of
// the limited key (never the key itself), so that a dashboard can link a spike to a key.
func (h *Handler) countLimited(state *policyState, p *policy.Plan, i int, now time.Time) {
	if h.console == nil {
		state.counters.Limited.Inc()
		return
	}
	// The clock first: the type assertion costs more, and is needed once a second at most.
	ns := now.UnixNano()
	last := state.exemplarAt.Load()
	if ns-last < int64(exemplarEvery) {
		state.counters.Limited.Inc()
		return
	}
	ea, ok := state.counters.Limited.(prometheus.ExemplarAdder)
	if !ok || !state.exemplarAt.CompareAndSwap(last, ns) {
		state.counters.Limited.Inc()
		return
	}
	key := "global"
	if kind := p.Policies[i].KeyKind; kind != "global" {
		key = h.pseudonyms.Of(kind, p.KeyValue(i))
	}
	ea.AddWithExemplar(1, prometheus.Labels{"key": key})
}
