// Package proxy is the gateway's HTTP request path.
//
// It is the request path of the gateway: an http.Handler that asks the compiled policy
// set which buckets a request charges, asks the limiter whether they conform, and then answers
// 401/429/503 itself (problem+json, RFC 9457) or forwards the request to the upstream through an
// httputil.ReverseProxy. It also owns the Prometheus metrics of that path and the admin handler
// (/metrics, /healthz, /readyz).
//
// The package knows nothing about YAML, DynamoDB or the algorithms: it consumes two small
// interfaces, Policies and Limiter, declared here with only the methods it calls.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Policies is what the handler needs from a compiled policy set; *policy.Set satisfies it.
// Implementations must be safe for concurrent use and immutable: the handler reads one value per
// request and uses it for every decision about that request.
type Policies interface {
	// Plan fills p with the charges for r and the policy of each (p may hold an earlier
	// request's plan; Plan resets it). An error wrapping policy.ErrUnauthorized means a bearer
	// token failed verification, one wrapping policy.ErrBadRequest that the request cannot be
	// judged unambiguously (answered 400, see judged.go); p then holds the charges (and
	// Policies entries) of the request's matching ip policies only, so that garbage tokens and
	// ambiguous requests still pay for the flood protection. On any other error p is empty.
	// Before a request is forwarded, p.StripUnjudged removes from it what was not judged.
	Plan(r *http.Request, p *policy.Plan) error
	// Headers says how rate-limit response headers are written.
	Headers() policy.Headers
	// Trusted reports whether the direct peer's forwarding headers are believed.
	Trusted(peer netip.Addr) bool
}

// Limiter is what the handler needs from a store; every bucket.Store satisfies it. It must be safe
// for concurrent use and honour ctx's deadline, and Take must not use ctx after it returned (the
// handler reuses it for a later request). See bucket.Store for the contract of Take.
type Limiter interface {
	Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error)
}

// Releaser is what the handler needs to give charges back: concurrency slots when their request
// ends, and charge_on reservations whose answer is not listed. Every bucket.Releaser satisfies
// it; a Limiter that is not one never gives anything back (the server refuses such a store for
// policies that need it). See bucket.Releaser for the contract.
type Releaser interface {
	Release(ctx context.Context, now time.Time, taken []bucket.Taken) error
}

var (
	_ Policies = (*policy.Set)(nil)
	_ Limiter  = bucket.Store(nil)
	_ Releaser = bucket.Releaser(nil)
)

// DefaultStoreTimeout is used when Options.StoreTimeout is zero. It matches the config default.
const DefaultStoreTimeout = 50 * time.Millisecond

// Options configure New. Upstream, Policies and Limiter are required; the rest have defaults.
type Options struct {
	// Upstream is the guarded service; requests keep their path and query, appended to its path.
	// The outbound Host header is the upstream's host (pr.SetURL), not the client's: the client's
	// host travels in X-Forwarded-Host. (Required)
	Upstream *url.URL
	// Policies returns the set in force; a reload swaps what it returns. It is called once per
	// request, so one request always sees one set. It must not return nil. (Required)
	Policies func() Policies
	// Limiter decides. (Required) When it is also a Releaser, the handler gives back
	// concurrency slots and charge_on reservations through it; otherwise they stay spent.
	Limiter Limiter
	// Backend labels the store metrics ("memory", "dynamodb"). (Optional) default "memory".
	Backend string
	// StoreTimeout is the context deadline around each Take. (Optional) default 50ms.
	StoreTimeout time.Duration
	// Logger receives sampled JSON log lines. (Optional) default: no logs.
	Logger *zap.Logger
	// AccessLog writes one line per request to Logger, unsampled (see logAccess).
	// (Optional) default false.
	AccessLog bool
	// Pseudonyms turn client key values into the "key" fields of log lines. (Optional)
	// default: keyed by a random secret drawn in New.
	Pseudonyms *policy.Pseudonyms
	// Metrics are the collectors to update. (Optional) default: unregistered collectors.
	Metrics *Metrics
	// Now is the clock handed to the limiter. (Optional) default time.Now.
	Now func() time.Time
	// Wait holds a leaky-bucket request for d before it is forwarded; it must return early with an
	// error when ctx ends. (Optional) default: a timer.
	Wait func(ctx context.Context, d time.Duration) error
	// Transport carries requests to the upstream, gRPC calls included, as is. (Optional)
	// default NewTransportFor(UpstreamProtocol, UpstreamTimeout), and for gRPC calls
	// NewTransportFor(UpstreamProtocol, GRPCUpstreamTimeout) when the two timeouts differ.
	Transport http.RoundTripper
	// UpstreamProtocol is the HTTP version spoken to the upstream when Transport is nil.
	// (Optional) default HTTP1.
	UpstreamProtocol Protocol
	// UpstreamTimeout bounds the wait for the upstream's response headers when Transport is nil;
	// past it the client gets 504. gRPC calls have GRPCUpstreamTimeout instead. (Optional)
	// default 0: no bound.
	UpstreamTimeout time.Duration
	// GRPCUpstreamTimeout bounds the wait for the response headers of gRPC calls (see isGRPC)
	// when Transport is nil; past it the client gets DEADLINE_EXCEEDED. (Optional) default 0:
	// no bound but the call's own deadline.
	GRPCUpstreamTimeout time.Duration
	// UpgradeProtocols are the protocols a request may switch to (Upgrade; names compared
	// case-insensitively, versions ignored); any other is removed from the request before it
	// is forwarded (see hopbyhop.go). (Optional) nil: DefaultUpgradeProtocols (WebSocket);
	// empty: none.
	UpgradeProtocols []string
	// GRPCRoutes are the path prefixes whose application/grpc requests are gRPC calls (see
	// isGRPC): their body is not bounded by the server's read timeout but by GRPCIdleTimeout,
	// and they go through the gRPC transport. (Optional) nil: every path; empty: none.
	GRPCRoutes []string
	// GRPCIdleTimeout bounds, over HTTP/2, how long a gRPC call's body may stay silent; every
	// read that brings data starts it again, and the call's own deadline ends it sooner.
	// (Optional) default 0: only the call's deadline.
	GRPCIdleTimeout time.Duration
	// WriteStallTimeout bounds how long a write (or flush) of a forwarded answer may take to
	// go through: a client that stops reading loses the request (and its protection slot)
	// within it, while one that reads, however slowly or long, does not. Over HTTP/1.1 it
	// also bounds every other answer's writes (set as the connection's write deadline when a
	// request starts). (Optional) 0: none.
	WriteStallTimeout time.Duration
	// Protect guards the upstream with a concurrency limit that requests take a slot of
	// before they are forwarded, after the policies admitted them (protect.go). (Optional)
	// default: none.
	Protect *Protection
	// Console is told about every planned and decided request (exemptions, heavy hitters, the
	// live page), and adds exemplars to the limited counters. (Optional) default: none.
	Console Console
	// Tracer is told every request's decision, for its trace span. (Optional) default: none.
	Tracer Tracer
}

// Tracer is told the decision about each request, once it is answered, with the request's
// context (which holds its span); *telemetry.Decisions satisfies it. results are the charges'
// verdicts, nil when the store decided nothing. It must not keep p or results.
type Tracer interface {
	Decided(ctx context.Context, decision string, p *policy.Plan, results []bucket.Result)
}

// Handler enforces the policies on every request and forwards the admitted ones. It serves every
// path: /metrics on the proxy port belongs to the upstream (the admin handler is separate). It is
// safe for concurrent use. Create it with New; the zero Handler is not usable.
//
// Per request: one Policies value, Plan, Take (bounded by StoreTimeout), then
//   - for an invalid bearer token, never forwarded: its ip charges (the only ones Plan leaves)
//     are taken like any others; when they are not admitted, the 429 below; otherwise, and also
//     when the store fails (OnError does not apply: the request is refused either way), a 401
//     problem; the same for a request Plan cannot judge unambiguously (an identity header with
//     conflicting values, a dot segment in the path), with a 400 problem;
//   - forward without rate-limit headers when no policy matched, or when the store failed and
//     OnError is Allow; 503 problem with Retry-After: 1 when it failed and OnError is Deny;
//   - 429 problem with Retry-After and X-RateLimit-* of the enforced policy that asks for the
//     longest wait, when the group was not admitted;
//   - otherwise X-RateLimit-* of the enforced charge with the least Remaining, an optional
//     leaky-bucket hold, and the reverse proxy.
//
// The X-RateLimit-* (and RateLimit*) headers are set before the upstream's response headers are
// copied, so an upstream that sends headers of the same names adds its values after ours.
// Forwarded requests that the upstream does not answer get a 502 problem, or 504 on timeout.
type Handler struct {
	policies     func() Policies
	limiter      Limiter
	releaser     Releaser // nil when the limiter cannot give charges back
	storeTimeout time.Duration
	now          func() time.Time
	clockIsNow   bool // now is time.Now: the store timer's start doubles as the decision instant
	wait         func(ctx context.Context, d time.Duration) error
	log          *zap.Logger // sampled
	access       *zap.Logger // unsampled, one line per request; nil without Options.AccessLog
	pseudonyms   *policy.Pseudonyms
	m            *Metrics
	store        *answer.StoreCounters // the backend's duration and errors
	rp           *httputil.ReverseProxy
	// rpGRPC forwards gRPC calls: rp, unless their response-header wait differs
	// (GRPCUpstreamTimeout; a gRPC server may send a stream's headers only with its first
	// message, so a header timer would cut a watch that stays silent at its start).
	// http.Transport's wait is per transport, so then they get a transport and connection pool
	// of their own, picked by the content-type check ServeHTTP makes anyway: other requests pay
	// nothing for it.
	rpGRPC   *httputil.ReverseProxy
	upgrades upgrades // the protocols a request may switch to
	grpcAll  bool     // every path may carry gRPC calls (Options.GRPCRoutes nil)
	grpcAt   []string // else the path prefixes that may
	grpcIdle time.Duration
	stall    time.Duration                // Options.WriteStallTimeout
	prot     *protection                  // nil without Options.Protect
	states   sync.Pool                    // *reqState
	byPolicy sync.Map                     // policy name -> *policyState
	slots    atomic.Pointer[[]policySlot] // policy index -> its state (policyOf)
	slotMu   sync.Mutex                   // serialises installing slots
	console  Console                      // nil without one
	tracer   Tracer                       // nil without one
	storeLog storeErrLog                  // how often store errors are logged
}

// New builds a Handler. It returns an error when a required option is missing or the upstream URL
// is not an absolute http(s) URL.
func New(o Options) (*Handler, error) {
	if o.Upstream == nil {
		return nil, errors.New("proxy: upstream is required")
	}
	if o.Upstream.Scheme != "http" && o.Upstream.Scheme != "https" {
		return nil, fmt.Errorf("proxy: upstream %q: scheme must be http or https", o.Upstream.Redacted())
	}
	if o.Upstream.Host == "" {
		return nil, fmt.Errorf("proxy: upstream %q: host is required", o.Upstream.Redacted())
	}
	if o.Policies == nil {
		return nil, errors.New("proxy: policies are required")
	}
	if o.Limiter == nil {
		return nil, errors.New("proxy: limiter is required")
	}
	if o.StoreTimeout < 0 {
		return nil, fmt.Errorf("proxy: store timeout %v: must not be negative", o.StoreTimeout)
	}
	if o.StoreTimeout == 0 {
		o.StoreTimeout = DefaultStoreTimeout
	}
	if o.Backend == "" {
		o.Backend = "memory"
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Pseudonyms == nil {
		o.Pseudonyms = policy.NewPseudonyms(nil)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	clockIsNow := o.Now == nil
	if clockIsNow {
		o.Now = time.Now
	}
	if o.Wait == nil {
		o.Wait = sleep
	}
	var grpcTransport http.RoundTripper // nil: gRPC calls go through Transport too
	if o.Transport == nil {
		o.Transport = NewTransportFor(o.UpstreamProtocol, o.UpstreamTimeout)
		if o.GRPCUpstreamTimeout != o.UpstreamTimeout {
			grpcTransport = NewTransportFor(o.UpstreamProtocol, o.GRPCUpstreamTimeout)
		}
	}
	h := &Handler{
		policies:     o.Policies,
		limiter:      o.Limiter,
		storeTimeout: o.StoreTimeout,
		now:          o.Now,
		clockIsNow:   clockIsNow,
		wait:         o.Wait,
		log:          sampled(o.Logger),
		pseudonyms:   o.Pseudonyms,
		m:            o.Metrics,
		store:        o.Metrics.shared.Store(o.Backend),
	}
	h.releaser, _ = o.Limiter.(Releaser)
	if o.UpgradeProtocols == nil {
		o.UpgradeProtocols = DefaultUpgradeProtocols
	}
	h.upgrades = newUpgrades(o.UpgradeProtocols)
	if o.GRPCIdleTimeout < 0 {
		return nil, fmt.Errorf("proxy: gRPC idle timeout %v: must not be negative", o.GRPCIdleTimeout)
	}
	h.grpcAll, h.grpcAt, h.grpcIdle = o.GRPCRoutes == nil, o.GRPCRoutes, o.GRPCIdleTimeout
	if o.WriteStallTimeout < 0 {
		return nil, fmt.Errorf("proxy: write stall timeout %v: must not be negative", o.WriteStallTimeout)
	}
	h.stall = o.WriteStallTimeout
	if o.Protect != nil {
		p, err := newProtection(o.Protect)
		if err != nil {
			return nil, err
		}
		h.prot = p
	}
	h.console, h.tracer = o.Console, o.Tracer
	h.states.New = func() any { return &reqState{buf: make([]byte, 0, 512)} }
	h.rp = h.newReverseProxy(o.Upstream, o.Transport)
	h.rpGRPC = h.rp
	if grpcTransport != nil {
		h.rpGRPC = h.newReverseProxy(o.Upstream, grpcTransport)
	}
	if o.AccessLog {
		h.access = o.Logger.Named("access")
	}
	return h, nil
}

// sleep is the default Wait: a timer that gives up when ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// policiesKey carries the request's Policies to the reverse proxy's Rewrite hook, so that the
// X-Forwarded-* trust decision uses the same set as the rate-limit decision.
type policiesKey struct{}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	grpc := isGRPC(r) && h.grpcRoute(r)
	if grpc {
		var cancel context.CancelFunc
		r, cancel = grpcDeadline(w, r, h.grpcIdle)
		defer cancel()
	}
	if h.stall > 0 && r.ProtoMajor == 1 {
		// Clear the write deadline a forward before on this connection left (see
		// forwardWriter.disarm): this request may wait longer than it (a queue, a hold)
		// before it answers.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
	}
	st := h.states.Get().(*reqState)
	defer h.done(st)
	st.reset(grpc, protocolOf(r, grpc), h.access != nil)
	if h.access == nil {
		h.serve(w, r, st)
	} else {
		start := time.Now()
		h.serve(st.writer(w), r, st)
		h.logAccess(r, st, start, time.Now())
	}
	if h.tracer != nil {
		h.traceDecision(r.Context(), st)
	}
}

// done returns a request's state to the pool, once the request is over (also when the reverse
// proxy aborted it with a panic): without its writer and body, which the pool must not keep
// alive.
func (h *Handler) done(st *reqState) {
	st.fw.ResponseWriter, st.fw.body = nil, nil
	h.states.Put(st)
}

// decide counts the request's decision (by its protocol) and remembers it for the access log.
func (h *Handler) decide(st *reqState, d int) {
	h.m.decided(st.proto, d)
	st.decision = d
}

// traceDecision tells the tracer the request's decision.
func (h *Handler) traceDecision(ctx context.Context, st *reqState) {
	if st.decision == decNone {
		return
	}
	var results []bucket.Result
	if (st.decision == decAllowed || st.decision == decLimited) && !st.now.IsZero() { // the store decided
		results = st.results[:len(st.plan.Charges)]
	}
	h.tracer.Decided(ctx, decisionNames[st.decision], &st.plan, results)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, st *reqState) {
	pols := h.policies()
	if pols == nil {
		// Options.Policies broke its contract; fail closed rather than forward unlimited traffic.
		h.decide(st, decError)
		h.log.Error("no policy set in force")
		writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemUnavailable, Status: http.StatusServiceUnavailable,
			Detail: "No rate-limit policy set is loaded.", RetryAfter: 1})
		return
	}
	if err := pols.Plan(r, &st.plan); err != nil {
		if errors.Is(err, policy.ErrUnauthorized) {
			h.unauthorized(w, r, st, pols)
			return
		}
		if errors.Is(err, policy.ErrBadRequest) {
			h.badRequest(w, r, st, pols, err)
			return
		}
		h.decide(st, decError)
		h.log.Error("policy plan failed", zap.Error(err))
		st.buf = writeAnswer(w, r, st.buf[:0], answer.Problem{Type: answer.ProblemInternal, Status: http.StatusInternalServerError,
			Detail: "The request could not be matched against the rate-limit policies."})
		return
	}
	if h.console != nil {
		h.console.Adjust(&st.plan)
	}
	if len(st.plan.Charges) == 0 {
		h.decide(st, decUnmatched)
		h.forward(w, r, st, pols)
		return
	}
	admitted, timedOut, err := h.take(r, st)
	if err != nil {
		h.storeError(w, r, st, pols, err, timedOut, st.callExpired)
		return
	}
	if h.console != nil {
		h.console.Observe(st.now, &st.plan, st.results[:len(st.plan.Charges)])
	}
	if !admitted {
		h.reject(w, r, st, pols)
		return
	}
	if h.releaser != nil && st.mustGiveBack() {
		// Slots and reservations are given back once the answer is complete, the client left
		// or the upstream failed, so in a defer: the reverse proxy aborts a response whose
		// upstream body fails with a panic (http.ErrAbortHandler).
		fw := st.writer(w)
		defer func() { h.giveBack(r, st, fw.status) }()
		h.admit(fw, r, st, pols)
		return
	}
	h.admit(w, r, st, pols)
}
