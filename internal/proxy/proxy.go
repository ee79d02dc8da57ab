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
	"strconv"
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

// OnError says what happens to a request when the limiter cannot decide (error or timeout).
type OnError uint8

const (
	// Allow forwards the request without rate-limit headers (fail open). It is the zero value.
	Allow OnError = iota
	// Deny answers 503 with Retry-After: 1 (fail closed).
	Deny
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
	// OnError applies when Take fails. (Optional) default Allow.
	OnError OnError
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
	onError      OnError
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
	stall    time.Duration // Options.WriteStallTimeout
	prot     *protection   // nil without Options.Protect
	states   sync.Pool     // *reqState
	byPolicy sync.Map      // policy name -> *policyState
	console  Console       // nil without one
	tracer   Tracer        // nil without one
}

// policyState is what the handler keeps per policy name: its counters, resolved once instead of
// per request, and the last 429 it rendered, reused while a client keeps being rejected with the
// same numbers (a hammering client sees the same Retry-After for a whole second).
type policyState struct {
	counters *policyCounters
	last     atomic.Pointer[rejection]
	lastGRPC atomic.Pointer[grpcRejection]
	// exemplarAt is when the limited counter last got an exemplar (Unix ns; see countLimited).
	exemplarAt atomic.Int64
}

// rejection is a pre-rendered 429 of one policy: the problem body and the header values, shared
// read-only by every response that carries the same numbers. The header slices have capacity 1,
// so Header.Add copies instead of writing into them.
type rejection struct {
	typ                 string // problem type: rate-limited or concurrency-limited
	retry, limit, reset int64
	cost, remaining     int64 // remaining is 0 unless cost > 1
	retryAfter          []string
	vals                [3]string // X-RateLimit-Limit, -Remaining, -Reset
	body                []byte
}

func newRejection(typ, name string, retry, limit, reset, cost, remaining int64) *rejection {
	r := &rejection{typ: typ, retry: retry, limit: limit, reset: reset, cost: cost, remaining: remaining, retryAfter: answer.RetryAfter(retry)}
	r.vals = [3]string{strconv.FormatInt(limit, 10), strconv.FormatInt(remaining, 10), strconv.FormatInt(reset, 10)}
	r.body = answer.AppendProblem(nil, answer.Problem{Type: typ, Status: http.StatusTooManyRequests,
		Policy: name, RetryAfter: retry, Cost: cost, Remaining: remaining})
	return r
}

// policy returns name's state, creating it on first use. Like the counters, the states of
// policies that a reload removed stay (one small value per name ever configured).
func (h *Handler) policy(name string) *policyState {
	if v, ok := h.byPolicy.Load(name); ok {
		return v.(*policyState)
	}
	v, _ := h.byPolicy.LoadOrStore(name, &policyState{counters: h.m.policyCounters(name)})
	return v.(*policyState)
}

// reqState is the per-request scratch space, pooled so the admitted path allocates little.
type reqState struct {
	plan    policy.Plan
	results []bucket.Result
	buf     []byte
	now     time.Time // the instant handed to the limiter; headers are relative to it
	ctx     *storeCtx // reused while no store materialised it
	taken   []bucket.Taken
	grpc    bool  // the request is a gRPC call: the gateway's own answers are gRPC statuses
	proto   uint8 // protoHTTP1, protoHTTP2 or protoGRPC: the metrics' and logs' protocol label
	// callExpired: the last Take ran out of time at the request's own deadline (a gRPC call's
	// grpc-timeout), not at StoreTimeout.
	callExpired bool

	fw forwardWriter // the writer of the forward, once there is one: its fate decides refunds
	pw timingWriter  // the writer of a forward behind a protection slot (protect.go)
	// givenBack: every charge was given back already (a request the protection shed).
	givenBack bool

	// For the access log.
	decision int    // index into decisionLabels, or decNone while undecided
	rejector string // the policy named in a 429
	sw       statusWriter
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
	if o.OnError != Allow && o.OnError != Deny {
		return nil, fmt.Errorf("proxy: on_error %d: want Allow or Deny", o.OnError)
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
		onError:      o.OnError,
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
	defer h.states.Put(st)
	st.plan.Reset()
	st.grpc = grpc
	st.proto = protocolOf(r, grpc)
	st.decision, st.rejector, st.now = decNone, "", time.Time{}
	st.fw = forwardWriter{}
	st.givenBack = false
	st.plan.WantIdentity = h.access != nil
	if h.access == nil {
		h.serve(w, r, st)
	} else {
		start := time.Now()
		st.sw = statusWriter{ResponseWriter: w}
		h.serve(&st.sw, r, st)
		h.logAccess(r, st, start, time.Now())
		st.sw = statusWriter{} // do not keep the response alive in the pool
	}
	if h.tracer != nil {
		h.traceDecision(r.Context(), st)
	}
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

// decide counts the request's decision (by its protocol) and remembers it for the access log.
func (h *Handler) decide(st *reqState, d int) {
	h.m.decided(st.proto, d)
	st.decision = d
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
		sw := &statusWriter{ResponseWriter: w}
		defer func() { h.giveBack(r, st, sw.status) }()
		h.admit(sw, r, st, pols)
		return
	}
	h.admit(w, r, st, pols)
}

// mustGiveBack reports whether an admitted group holds a charge to give back after the answer:
// a concurrency slot, or a reservation of a charge_on policy.
func (st *reqState) mustGiveBack() bool {
	for i, c := range st.plan.Charges {
		if st.results[i].Allowed && (c.Limit.Algorithm == bucket.Concurrency || st.plan.Policies[i].ChargeOn != nil) {
			return true
		}
	}
	return false
}

// giveBack releases what an admitted group must give back now that its answer, of this status
// (0: none was sent), is over: every concurrency slot, and the reservation of every charge_on
// policy whose list does not hold the status, unless the request may have reached the upstream
// without an answer from it (see forwardFate.refundable): then every reservation stays spent.
// It runs within store.timeout of its own, not the request's context, which has ended when the
// client went away; a failure is counted (the store keeps the charge: a DynamoDB slot until its
// lease expires, a refund never).
func (h *Handler) giveBack(r *http.Request, st *reqState, status int) {
	if st.givenBack {
		return // shed by the upstream protection: everything went back then
	}
	st.taken = st.taken[:0]
	refundable := st.fw.fate.refundable()
	for i, c := range st.plan.Charges {
		if !st.results[i].Allowed {
			continue
		}
		pol := st.plan.Policies[i]
		switch {
		case c.Limit.Algorithm == bucket.Concurrency:
		case pol.ChargeOn != nil && refundable && !pol.ChargeOn.Has(status):
			h.policy(pol.Name).counters.refunded.Inc()
		default:
			continue
		}
		st.taken = append(st.taken, bucket.Taken{Charge: c, At: st.now, Token: st.results[i].Token})
	}
	if len(st.taken) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.storeTimeout)
	defer cancel()
	if err := h.releaser.Release(ctx, h.now(), st.taken); err != nil {
		h.m.shared.ReleaseErrors.Inc()
		if ce := h.log.Check(zap.WarnLevel, "rate-limit store release failed"); ce != nil {
			ce.Write(zap.Int("charges", len(st.taken)), zap.Error(err))
		}
	}
	clear(st.taken) // the pool must not keep charges alive
}

// take asks the limiter about st.plan.Charges (at least one) under the store timeout, filling
// st.results and st.now, and observes the store duration. timedOut reports whether the store
// ran out of time.
func (h *Handler) take(r *http.Request, st *reqState) (admitted, timedOut bool, err error) {
	charges := st.plan.Charges
	if cap(st.results) < len(charges) {
		st.results = make([]bucket.Result, len(charges))
	}
	results := st.results[:len(charges)]
	clear(results)

	start := time.Now()
	if st.ctx == nil {
		st.ctx = new(storeCtx)
	}
	ctx := st.ctx
	ctx.init(r.Context(), start.Add(h.storeTimeout))
	st.now = start
	if !h.clockIsNow {
		st.now = h.now()
	}
	admitted, err = h.limiter.Take(ctx, st.now, charges, results)
	end := time.Now()
	h.store.Duration.Observe(end.Sub(start).Seconds())
	timedOut = ctx.timedOut(end)
	st.callExpired = timedOut && ctx.parentBound
	ctx.release()
	if ctx.reusable() {
		ctx.parent = nil // do not keep the request's context alive in the pool
	} else {
		st.ctx = nil
	}
	return admitted, timedOut, err
}

// unauthorized answers a request whose bearer token failed verification. Plan left only its ip
// charges; they are taken first, because otherwise a flood of garbage tokens would bypass the ip
// limits: a group that is not admitted gets the ordinary 429. Anything else gets 401: an admitted
// group (its charges stay consumed, but nothing reaches the upstream, so nothing is counted as
// allowed) and a store failure too, without OnError, since the request is refused either way and
// an outage must turn a 401 into neither a 503 nor a forward.
func (h *Handler) unauthorized(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	taken := false // the ip charges were admitted: they hold what giveBack must return
	if len(st.plan.Charges) > 0 {
		admitted, timedOut, err := h.take(r, st)
		taken = err == nil && admitted
		switch {
		case err != nil:
			if r.Context().Err() != nil && !timedOut {
				// The client left while we asked the store: nobody to answer.
				h.m.canceled[stageStore].Inc()
				return
			}
			reason := h.countStoreError(err, timedOut)
			if ce := h.log.Check(zap.WarnLevel, "rate-limit store error"); ce != nil {
				ce.Write(zap.String("reason", reason), zap.String("answer", "unauthorized"), zap.Error(err))
			}
		case !admitted:
			h.reject(w, r, st, pols)
			return
		}
	}
	h.decide(st, decUnauthorized)
	w.Header()["Www-Authenticate"] = wwwAuthenticate
	st.buf = writeAnswer(w, r, st.buf[:0], answer.Problem{Type: answer.ProblemUnauthorized, Status: http.StatusUnauthorized,
		Detail: "The bearer token is not valid."})
	if taken && h.releaser != nil && st.mustGiveBack() {
		// The 401 is the answer: it ends concurrency slots, and charges of ip policies whose
		// charge_on does not list 401.
		h.giveBack(r, st, http.StatusUnauthorized)
	}
}

// storeError applies OnError to a request the limiter could not decide.
func (h *Handler) storeError(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies, err error, timedOut, callExpired bool) {
	if callExpired || errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		// The call's own deadline (grpc-timeout; only gRPC calls carry one) ran out first:
		// nobody waits for a forward, and on_error cannot help. callExpired says so without
		// asking the request's context, whose own timer may fire a moment after the store's.
		h.countStoreError(err, true)
		h.m.decided(protoGRPC, decStoreErrorDenied)
		st.decision = decStoreErrorDenied
		callDeadline(w, r, "The call's deadline passed while the rate limiter decided.")
		return
	}
	if r.Context().Err() != nil && !timedOut {
		// The client left while we asked the store: not the store's fault, nobody to answer.
		h.m.canceled[stageStore].Inc()
		return
	}
	proto := protocolOf(r, isGRPC(r))
	reason := h.countStoreError(err, timedOut)
	if ce := h.log.Check(zap.WarnLevel, "rate-limit store error"); ce != nil {
		ce.Write(zap.String("reason", reason), zap.Bool("fail_open", h.onError == Allow),
			zap.String("protocol", protocolNames[proto]), zap.Error(err))
	}
	if h.onError == Allow {
		h.m.decided(proto, decStoreErrorAllowed)
		st.decision = decStoreErrorAllowed
		h.forward(w, r, st, pols)
		return
	}
	h.m.decided(proto, decStoreErrorDenied)
	st.decision = decStoreErrorDenied
	writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemUnavailable, Status: http.StatusServiceUnavailable,
		Detail: "The rate limiter is unavailable; retry shortly.", RetryAfter: 1})
}

// callDeadline answers a gRPC call whose deadline (grpc-timeout) ended, or would end, while the
// gateway itself held it: DEADLINE_EXCEEDED. Only gRPC calls carry such a deadline.
func callDeadline(w http.ResponseWriter, r *http.Request, detail string) {
	writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemTimeout, Status: http.StatusGatewayTimeout, Detail: detail})
}

// countStoreError counts a failed Take by reason and returns the reason's label.
func (h *Handler) countStoreError(err error, timedOut bool) string {
	if timedOut || errors.Is(err, context.DeadlineExceeded) {
		h.store.Timeout.Inc()
		return "timeout"
	}
	h.store.Failure.Inc()
	return "error"
}

// reject answers 429 for a group the limiter did not admit. Only the rejecting non-shadow
// charges are counted (result="limited"): nothing was committed for the others, so counting them
// as allowed would overstate what reached the upstream.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	charges, results, ps := st.plan.Charges, st.results[:len(st.plan.Charges)], st.plan.Policies
	pick := -1
	var pickState *policyState
	for i := range charges {
		if charges[i].Shadow || results[i].Allowed {
			continue
		}
		state := h.policy(ps[i].Name)
		h.countLimited(state, &st.plan, i, st.now)
		if pick < 0 || results[i].RetryAfter > results[pick].RetryAfter {
			pick, pickState = i, state
		}
	}
	if pick < 0 {
		// The store broke its contract (rejected with every enforced charge conforming); answer
		// from the first enforced charge rather than forward.
		for i := range charges {
			if !charges[i].Shadow {
				pick = i
				break
			}
		}
		if pick < 0 {
			pick = 0
		}
	}
	h.decide(st, decLimited)
	res := results[pick]
	retry := answer.CeilSeconds(res.RetryAfter)
	if retry < 1 {
		retry = 1
	}
	name := ps[pick].Name
	st.rejector = name
	if ce := h.log.Check(zap.InfoLevel, "rate limited"); ce != nil {
		ce.Write(zap.String("policy", name), h.logKey(&st.plan, pick),
			zap.Int64("retry_after_seconds", retry), zap.String("protocol", protocolNames[st.proto]))
	}
	// A request of cost 1 was rejected because nothing is left. One of a higher cost may have
	// been rejected with some left (less than its cost): the headers and the body say how much,
	// so the client sees which cost did not fit.
	cost := charges[pick].N()
	res.Remaining = min(max(res.Remaining, 0), cost-1)
	typ := answer.ProblemRateLimited
	if charges[pick].Limit.Algorithm == bucket.Concurrency {
		typ = answer.ProblemConcurrency
	}
	hc := pols.Headers()
	if st.grpc {
		h.rejectGRPC(w, r, st, hc, pick, pickState, typ, res, retry)
		return
	}
	if hc.IETF || pickState == nil {
		st.buf = setRateLimitHeaders(w.Header(), st.buf[:0], hc, st, pick, res)
		st.buf = answer.WriteProblem(w, st.buf[:0], answer.Problem{Type: typ, Status: http.StatusTooManyRequests,
			Policy: name, RetryAfter: retry, Cost: cost, Remaining: res.Remaining})
		return
	}
	// The common case: reuse the policy's last rendering when the numbers are the same.
	reset := answer.ResetValue(hc.Reset == policy.ResetDelta, st.now, res.Reset)
	rj := pickState.last.Load()
	if rj == nil || rj.typ != typ || rj.retry != retry || rj.limit != res.Limit || rj.reset != reset || rj.cost != cost || rj.remaining != res.Remaining {
		rj = newRejection(typ, name, retry, res.Limit, reset, cost, res.Remaining)
		pickState.last.Store(rj)
	}
	hdr := w.Header()
	hdr[answer.HeaderLimit] = rj.vals[0:1:1]
	hdr[answer.HeaderRemaining] = rj.vals[1:2:2]
	hdr[answer.HeaderReset] = rj.vals[2:3:3]
	answer.SetProblemHeaders(hdr, rj.retryAfter)
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(rj.body) // the client may be gone; there is nobody left to tell
}

// admit counts, sets headers, holds a leaky-bucket request if needed and forwards.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	charges, results, ps := st.plan.Charges, st.results[:len(st.plan.Charges)], st.plan.Policies
	pick := -1
	var wait time.Duration
	for i := range charges {
		c := h.policy(ps[i].Name).counters
		if !results[i].Allowed {
			// Only a shadow charge can fail in an admitted group.
			c.ShadowLimited.Inc()
			if ce := h.log.Check(zap.InfoLevel, "shadow limit exceeded"); ce != nil {
				ce.Write(zap.String("policy", ps[i].Name), h.logKey(&st.plan, i))
			}
			continue
		}
		c.Allowed.Inc()
		if charges[i].Shadow {
			// A shadow policy never shapes traffic either: its wait is ignored.
			continue
		}
		if results[i].Wait > wait {
			wait = results[i].Wait
		}
		if pick < 0 || results[i].Remaining < results[pick].Remaining {
			pick = i
		}
	}
	h.decide(st, decAllowed)
	if pick >= 0 {
		st.buf = setRateLimitHeaders(w.Header(), st.buf[:0], pols.Headers(), st, pick, results[pick])
	}
	if wait > 0 {
		if dl, ok := r.Context().Deadline(); ok && st.grpc && st.now.Add(wait).After(dl) {
			// Holding a call that its caller will abandon before its turn would only keep a
			// stream open for nothing.
			callDeadline(w, r, "The call's deadline ends before its turn in the rate limiter's queue.")
			return
		}
		h.m.leakyWait.Observe(wait.Seconds())
		if err := h.wait(r.Context(), wait); err != nil {
			if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				callDeadline(w, r, "The call's deadline passed in the rate limiter's queue.")
				return
			}
			if r.Context().Err() != nil {
				h.m.canceled[stageWait].Inc()
				return
			}
			h.log.Error("leaky-bucket wait failed", zap.Error(err))
			writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemUnavailable, Status: http.StatusServiceUnavailable,
				Detail: "The request could not be scheduled; retry shortly.", RetryAfter: 1})
			return
		}
	}
	h.forward(w, r, st, pols)
}

// forward hands the request to the reverse proxy. The request's policy set travels in its
// context only when the rewrite needs it, to judge an inbound X-Forwarded-For, -Proto or -Host:
// copying the request for a new context costs two allocations, and most requests carry none of
// them.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	rp := h.rp
	if st.grpc {
		rp = h.rpGRPC
	}
	st.plan.StripUnjudged(r.Header) // see judged.go
	h.upgrades.reviewHopByHop(r.Header)
	if len(r.Header["X-Forwarded-For"]) > 0 || len(r.Header["X-Forwarded-Proto"]) > 0 ||
		len(r.Header["X-Forwarded-Host"]) > 0 {
		r = r.WithContext(context.WithValue(r.Context(), policiesKey{}, pols))
	}
	if h.prot != nil {
		h.sendGuarded(w, r, st, rp, pols)
		return
	}
	h.send(w, r, st, rp)
}

// logKey is the "key" field of a log line about charge i of p: the pseudonym of its key value
// (see policy.Pseudonyms), never the value, nor the bucket key, which is an unkeyed digest of the
// policy and the value that small key spaces (every IPv4 address, numeric user ids) could be
// searched for. Lines are sampled, so the HMAC is not paid per request.
func (h *Handler) logKey(p *policy.Plan, i int) zap.Field {
	kind := p.Policies[i].KeyKind
	if kind == "global" {
		return zap.String("key", "global")
	}
	return zap.String("key", h.pseudonyms.Of(kind, p.KeyValue(i)))
}
