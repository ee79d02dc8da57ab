package proxy

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/histbuckets"
)

// Decision results, the values of ratelimit_decisions_total{result}. One per request.
const (
	decAllowed           = iota // admitted by the limiter (including requests later held or canceled)
	decLimited                  // answered 429
	decUnauthorized             // answered 401: bearer token failed verification
	decStoreErrorAllowed        // limiter failed, forwarded (on_error allow)
	decStoreErrorDenied         // limiter failed, answered 503 (on_error deny)
	decUnmatched                // no policy matched: forwarded without charging
	decError                    // the policy set failed to plan the request: answered 500
	decBadRequest               // answered 400: cannot be judged unambiguously (judged.go)
	numDecisions
)

var decisionNames = [numDecisions]string{
	"allowed", "limited", "unauthorized", "store_error_allowed", "store_error_denied", "unmatched", "error", "bad_request",
}

// Stages at which a client that went away is noticed: ratelimit_client_canceled_total{stage}.
const (
	stageStore    = iota // while the limiter decided
	stageWait            // while a leaky-bucket request was held
	stageUpstream        // while the upstream was being asked
	numStages
)

var stageNames = [numStages]string{"store", "wait", "upstream"}

// Protocols of a request, the values of ratelimit_protocol_decisions_total{protocol} and of the
// "protocol" field of log lines: a small fixed set, never a method or a path.
const (
	protoHTTP1 = iota // HTTP/1.x
	protoHTTP2        // HTTP/2 (h2c or h2), not gRPC
	protoGRPC         // a gRPC call (content-type application/grpc...), whatever its HTTP version
	numProtocols
)

var protocolNames = [numProtocols]string{"http1", "http2", "grpc"}

// protocolOf is r's protocol; grpc is isGRPC(r).
func protocolOf(r *http.Request, grpc bool) uint8 {
	switch {
	case grpc:
		return protoGRPC
	case r.ProtoMajor == 2:
		return protoHTTP2
	default:
		return protoHTTP1
	}
}

// Upstream error reasons: ratelimit_upstream_errors_total{reason}.
const (
	upRefused = iota // connection refused, nothing listening
	upTimeout        // dial, TLS or response-header timeout, or a context deadline
	upReset          // the upstream closed or reset the connection before answering
	upOther
	// The upstream failed after its response had started: the status line has gone to the
	// client, so the only honest signal left is an aborted client connection.
	upAborted
	numUpstreamReasons
)

var upstreamReasonNames = [numUpstreamReasons]string{"refused", "timeout", "reset", "other", "aborted"}

// Client error reasons: ratelimit_client_errors_total{reason}. Faults of the client's own
// request, answered 4xx by the gateway: never upstream errors, whatever the transport saw.
const (
	// The body did not arrive in full within server.read_timeout (HTTP/1.1 and HTTP/2): 408.
	clientBodyTimeout = iota
	// The body broke its framing: bad chunked encoding, fewer bytes than its Content-Length
	// before its end (HTTP/2 END_STREAM; HTTP/1.1 a half-closed connection), an HTTP/2 stream
	// reset or frames against the stream's rules while it was read: 400.
	clientBodyMalformed
	numClientReasons
)

var clientReasonNames = [numClientReasons]string{"body_timeout", "body_malformed"}

// Metrics are the proxy's Prometheus collectors. Labels hold only values from a small fixed set
// or policy names from the configuration; never anything that identifies a client. Safe for
// concurrent use; one Metrics may be shared by several Handlers (for instance across reloads).
type Metrics struct {
	shared           *answer.Counters // the series the RLS counts into too
	decisions        *prometheus.CounterVec
	protoDecisions   *prometheus.CounterVec
	upstreamDuration prometheus.Histogram
	upstreamErrors   *prometheus.CounterVec
	leakyWait        prometheus.Histogram
	clientCanceled   *prometheus.CounterVec
	clientErrors     *prometheus.CounterVec
	bodyTimeouts     prometheus.Counter // deprecated: clientErrors{reason="body_timeout"}
	refunded         *prometheus.CounterVec

	// Resolved children, so the hot path does no label hashing.
	decision    [numDecisions]prometheus.Counter
	byProto     [numProtocols][numDecisions]prometheus.Counter
	upstreamErr [numUpstreamReasons]prometheus.Counter
	canceled    [numStages]prometheus.Counter
	clientErr   [numClientReasons]prometheus.Counter

	byPolicy *answer.Children[*policyCounters]
}

// policyCounters are one policy's ratelimit_requests_total children and its
// ratelimit_charges_refunded_total.
type policyCounters struct {
	*answer.PolicyCounters
	refunded prometheus.Counter
}

// NewMetrics creates the collectors and registers them on reg (nil: not registered, for tests
// and benchmarks). Registering twice on the same registry reuses the collectors already there,
// so two Metrics from one registry update the same series. Like MustRegister, it panics when reg
// holds a different collector under one of these names: that is a programming error.
//
// The series and their labels are listed once, in docs/operations.md ("Metrics"). A request
// with an invalid bearer token is charged only its ip policies: when they reject it, it counts
// like any rejected request; when they admit it, it is answered 401 and counts nothing in
// ratelimit_requests_total, as nothing reached the upstream.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	shared, err := answer.NewCounters(reg)
	if err != nil {
		panic(fmt.Sprintf("proxy: %v", err))
	}
	m := &Metrics{
		shared: shared,
		decisions: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Requests by decision.",
		}, []string{"result"})),
		protoDecisions: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_protocol_decisions_total",
			Help: "Requests by protocol (http1, http2, grpc) and decision; the same counts as ratelimit_decisions_total.",
		}, []string{"protocol", "result"})),
		upstreamDuration: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_upstream_duration_seconds",
			Help:    "Time from forwarding a request until the upstream's response headers arrived.",
			Buckets: histbuckets.Range(1e-3, 60, 12), // 1ms to 1m, ×2.72 apart
		})),
		upstreamErrors: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_upstream_errors_total",
			Help: "Forwarded requests that got no complete response from the upstream, by reason (aborted: the upstream failed after its response had started).",
		}, []string{"reason"})),
		leakyWait: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_leaky_wait_seconds",
			Help:    "How long leaky-bucket policies held admitted requests before forwarding them.",
			Buckets: histbuckets.Range(1e-3, 60, 12), // 1ms to 1m, ×2.72 apart
		})),
		clientCanceled: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_client_canceled_total",
			Help: "Requests abandoned by the client before they were answered, by stage.",
		}, []string{"stage"})),
		clientErrors: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_client_errors_total",
			Help: "Forwarded requests whose body failed by the client's doing, by reason: body_timeout (not received within server.read_timeout; answered 408), body_malformed (broken framing or cut short; answered 400).",
		}, []string{"reason"})),
		bodyTimeouts: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_proxy_body_timeouts_total",
			Help: "Deprecated: use ratelimit_client_errors_total{reason=\"body_timeout\"}, which counts the same. Forwarded requests whose body was not received within server.read_timeout; answered 408.",
		})),
		refunded: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_charges_refunded_total",
			Help: "charge_on policies: admitted requests whose reserved charge was given back (the upstream answered with a status not listed, or the request never reached it).",
		}, []string{"policy"})),
	}
	m.byPolicy = answer.NewChildren(func(name string) *policyCounters {
		return &policyCounters{PolicyCounters: shared.Policy(name), refunded: m.refunded.WithLabelValues(name)}
	})
	for i, n := range decisionNames {
		m.decision[i] = m.decisions.WithLabelValues(n)
		for p, pn := range protocolNames {
			m.byProto[p][i] = m.protoDecisions.WithLabelValues(pn, n)
		}
	}
	for i, n := range upstreamReasonNames {
		m.upstreamErr[i] = m.upstreamErrors.WithLabelValues(n)
	}
	for i, n := range stageNames {
		m.canceled[i] = m.clientCanceled.WithLabelValues(n)
	}
	for i, n := range clientReasonNames {
		m.clientErr[i] = m.clientErrors.WithLabelValues(n)
	}
	return m
}

// decided counts one request's decision d, of protocol proto.
func (m *Metrics) decided(proto uint8, d int) {
	m.decision[d].Inc()
	m.byProto[proto][d].Inc()
}

// register registers c on reg, or returns the equal collector reg already holds; a different
// collector under c's name is a programming error.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	got, err := answer.Register(reg, c)
	if err != nil {
		panic(fmt.Sprintf("proxy: %v", err))
	}
	return got
}

// policyCounters returns name's counters, creating its series on first use. Policy names come from
// the configuration, so the set stays small; a reload that renames a policy leaves the old
// series in place with their final values, as Prometheus counters should.
func (m *Metrics) policyCounters(name string) *policyCounters { return m.byPolicy.Get(name) }

// NewRegistry returns a registry with the Go runtime and process collectors, for NewMetrics and
// AdminHandler.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}
