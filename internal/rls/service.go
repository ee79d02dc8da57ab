// Package rls serves Envoy's rate limit service.
//
// It serves Envoy's rate limit service, envoy.service.ratelimit.v3.RateLimitService,
// on the gateway's engine: it matches each descriptor of a ShouldRateLimit call against the
// rules compiled from rls.config_dir (envoyrules.Rules), turns the matches into one group of
// bucket charges and asks the same bucket.Store as the proxy. It never imports the proxy.
//
// A call is one group: when any enforced descriptor is over its limit the answer is OVER_LIMIT
// and nothing is consumed from the call's other descriptors (envoyproxy/ratelimit goes on
// counting them). docs/envoy.md describes the protocol as served.
//
// With Options.Console the operators' console (package console, through the Console interface
// declared here) applies its exemptions to each rule's charge and is told every descriptor a
// rule charged; without one the call path calls nothing more.
package rls

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/verdict"
)

// Bounds of a call: a request past them is malformed (INVALID_ARGUMENT), not a workload.
const (
	maxDescriptors = 256
	maxEntries     = 64
)

// Options configure a Service.
type Options struct {
	// Rules returns the rules in force; called once per call. (Required)
	Rules func() *envoyrules.Rules
	// Store decides the charges. (Required) When it is a bucket.Releaser, checks that consume
	// nothing (hits_addend 0) are given back; otherwise they are refused as INVALID_ARGUMENT.
	Store bucket.Store
	// Backend labels the store metrics (memory, dynamodb).
	Backend string
	// StoreTimeout bounds each call's store time (store.timeout); a call whose deadline is
	// nearer gets less, so that Envoy has the answer before it gives up. (Required)
	StoreTimeout time.Duration
	// Headers are the response headers answered.
	Headers Headers
	// ShadowMode answers OK to every call, counting as usual.
	ShadowMode bool
	// Metrics receives the counts. (Required)
	Metrics *Metrics
	// Logger logs store failures; never descriptor values. nil means no logs.
	Logger *zap.Logger
	// Now is the clock. nil means time.Now.
	Now func() time.Time
	// Console, when set, is told every charged descriptor and applies exemptions. (Optional)
	Console Console
}

// Service implements pb.RateLimitServiceServer. Safe for concurrent use.
type Service struct {
	pb.UnimplementedRateLimitServiceServer
	o       Options
	release bucket.Releaser // nil when the store cannot give back
	store   *answer.StoreCounters
	scratch sync.Pool // *call
}

// New returns a Service.
func New(o Options) (*Service, error) {
	if o.Rules == nil || o.Store == nil || o.Metrics == nil || o.StoreTimeout <= 0 {
		return nil, errors.New("rls: Rules, Store, Metrics and StoreTimeout are required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	s := &Service{o: o, store: o.Metrics.store(o.Backend)}
	s.release, _ = o.Store.(bucket.Releaser)
	s.scratch.New = func() any { return new(call) }
	return s, nil
}

// call is the scratch space of one call, pooled.
type call struct {
	entries []envoyrules.Entry // all descriptors' entries, back to back
	bounds  []int              // descriptor i's entries are entries[bounds[i]:bounds[i+1]]
	matches []envoyrules.Match
	kinds   []uint8 // per descriptor: what applies
	charges []bucket.Charge
	results []bucket.Result
	of      []int  // charges[j] is for descriptor of[j]
	probe   []bool // charges[j] is a hits_addend 0 check
	views   []limitView
	taken   []bucket.Taken
}

// What applies to a descriptor.
const (
	kindNone      uint8 = iota // no rule (or replaced): OK, no limit
	kindRule                   // a rule with a limit
	kindUnlimited              // an unlimited rule: OK without the store
	kindOverride               // the descriptor's own limit
)

func (c *call) reset(n int) {
	c.entries, c.bounds, c.charges, c.of, c.probe, c.views, c.taken = c.entries[:0], c.bounds[:0], c.charges[:0], c.of[:0], c.probe[:0], c.views[:0], c.taken[:0]
	if cap(c.matches) < n {
		c.matches = make([]envoyrules.Match, n)
	}
	c.matches = c.matches[:n]
	if cap(c.kinds) < n {
		c.kinds = make([]uint8, n)
	}
	c.kinds = c.kinds[:n]
	clear(c.kinds)
}

func (c *call) entriesOf(i int) []envoyrules.Entry { return c.entries[c.bounds[i]:c.bounds[i+1]] }

// DomainHeader is the header metadata key of a ShouldRateLimit answer for a domain the rules do
// not name: its value is "unknown". Envoy does not read it.
const DomainHeader = "x-ratelimit-domain"

var unknownDomainMD = metadata.Pairs(DomainHeader, "unknown")

// ShouldRateLimit implements pb.RateLimitServiceServer. A call is planned (its descriptors
// matched and turned into charges), decided (one Take of the group) and answered (statuses,
// counters, headers), as the proxy plans, decides and answers a request.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	defer func() { s.o.Metrics.callDuration.Observe(time.Since(start).Seconds()) }()
	now := s.o.Now()
	dom := s.o.Rules().Domain(req.GetDomain())
	calls := s.o.Metrics.callCounters("")
	if dom != nil {
		calls = s.o.Metrics.callCounters(dom.Name)
	}
	if err := validRequest(req, s.release != nil); err != nil {
		calls[callInvalid].Inc()
		return nil, err
	}
	resp, statuses := newResponse(len(req.Descriptors))
	if dom == nil {
		// As envoyproxy/ratelimit: a domain without rules limits nothing. The call's header
		// metadata says so (Envoy ignores it; `rls check` warns), so that a misspelt domain
		// does not pass for a generous limit.
		calls[callUnmatched].Inc()
		_ = grpc.SetHeader(ctx, unknownDomainMD) // fails only outside a gRPC call (tests)
		return resp, nil
	}
	c := s.scratch.Get().(*call)
	defer s.scratch.Put(c)
	if err := s.plan(now, dom, req, c, statuses); err != nil {
		calls[callInvalid].Inc()
		return nil, err
	}
	if len(c.charges) == 0 {
		calls[c.unchargedResult()].Inc()
		return resp, nil
	}
	admitted, err := s.take(ctx, now, c.charges, c.results)
	if err != nil {
		return s.undecided(err, calls, resp, statuses)
	}
	if s.o.Console != nil {
		s.observe(now, dom.Name, c) // the per-decision hook: every decided call, once
	}
	s.respond(ctx, now, c, admitted, resp, statuses, calls)
	return resp, nil
}

// newResponse is an OK answer for n descriptors, every status OK, in one allocation for all.
func newResponse(n int) (*pb.RateLimitResponse, []pb.RateLimitResponse_DescriptorStatus) {
	resp := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, n)}
	statuses := make([]pb.RateLimitResponse_DescriptorStatus, n)
	for i := range resp.Statuses {
		statuses[i].Code = pb.RateLimitResponse_OK
		resp.Statuses[i] = &statuses[i]
	}
	return resp, statuses
}

// plan fills c with the call's charges: one per limited descriptor, each in the domain's pool
// of the memory store, and the statuses of the descriptors it answers without the store
// (unlimited) or whose limit it names. An error is the call's INVALID_ARGUMENT.
func (s *Service) plan(now time.Time, dom *envoyrules.Domain, req *pb.RateLimitRequest, c *call, statuses []pb.RateLimitResponse_DescriptorStatus) error {
	c.reset(len(req.Descriptors))
	for _, d := range req.Descriptors {
		c.bounds = append(c.bounds, len(c.entries))
		for _, e := range d.GetEntries() {
			c.entries = append(c.entries, envoyrules.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	c.bounds = append(c.bounds, len(c.entries))
	c.match(dom, req)
	pool := Pool(dom.Name)
	for i, d := range req.Descriptors {
		// The charge and its view are made in place, in the call's scratch space.
		n := len(c.charges)
		c.charges, c.views = append(c.charges, bucket.Charge{}), append(c.views, limitView{})
		ch := &c.charges[n]
		if !s.charge(now, dom, d, c, i, &statuses[i], ch, &c.views[n]) {
			c.charges, c.views = c.charges[:n], c.views[:n]
			continue
		}
		ch.Pool = pool
		probe, err := cost(ch, req.GetHitsAddend(), d.GetHitsAddend())
		if err != nil {
			return err
		}
		c.of = append(c.of, i)
		c.probe = append(c.probe, probe)
	}
	if cap(c.results) < len(c.charges) {
		c.results = make([]bucket.Result, len(c.charges))
	}
	c.results = c.results[:len(c.charges)]
	clear(c.results)
	return nil
}

// match matches every descriptor, then drops the rules that another matched rule replaces.
func (c *call) match(dom *envoyrules.Domain, req *pb.RateLimitRequest) {
	var replacing map[string]struct{}
	for i, d := range req.Descriptors {
		if d.GetLimit() != nil {
			c.kinds[i] = kindOverride
			continue
		}
		r := dom.Match(c.entriesOf(i), &c.matches[i])
		if r == nil {
			continue
		}
		c.kinds[i] = kindRule
		if r.Unlimited {
			c.kinds[i] = kindUnlimited
		}
		for _, name := range r.Replaces {
			if replacing == nil {
				replacing = make(map[string]struct{})
			}
			replacing[name] = struct{}{}
		}
	}
	for i := range c.kinds {
		if r := c.matches[i].Rule; c.kinds[i] == kindRule && r.Name != "" {
			if _, ok := replacing[r.Name]; ok {
				c.kinds[i] = kindNone
			}
		}
	}
}

// charge fills in descriptor i's charge (without its pool and cost) and what the headers say
// about it (view); false when nothing is charged for it (no rule, or unlimited: then st says so).
func (s *Service) charge(now time.Time, dom *envoyrules.Domain, d *rlext.RateLimitDescriptor, c *call, i int, st *pb.RateLimitResponse_DescriptorStatus, ch *bucket.Charge, view *limitView) bool {
	es := c.entriesOf(i)
	switch c.kinds[i] {
	case kindUnlimited:
		st.LimitRemaining = math.MaxUint32
		return false
	case kindOverride:
		o := d.GetLimit()
		l, _ := envoyrules.OverrideLimit(o.GetRequestsPerUnit(), envoyrules.Unit(o.GetUnit()), o.GetUnitMultiplier().GetValue()) // validated
		*ch = bucket.Charge{Key: dom.OverrideKey(es, l), Limit: l}
		// The caller chooses an override's entries: its label is the domain's alone.
		*view = limitView{name: overrideLabel(dom.Name), limit: l}
		view.metric = view.name
		st.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: pb.RateLimitResponse_RateLimit_Unit(o.GetUnit()), UnitMultiplier: o.GetUnitMultiplier()}
		return true
	case kindRule:
		m := &c.matches[i]
		r := m.Rule
		*ch = bucket.Charge{Key: m.Key(es), Limit: r.Limit, Shadow: r.Shadow, Lease: r.Lease}
		if s.o.Console != nil {
			if l, unlimited, exempt := s.o.Console.ExemptRLS(now, r, ch.Key); exempt && unlimited {
				// An unlimited exemption: answered as an unlimited rule is, charging nothing.
				c.kinds[i] = kindUnlimited
				st.LimitRemaining = math.MaxUint32
				return false
			} else if exempt {
				ch.Limit = l // the key's bucket, under the exemption's limit
			}
		}
		// Headers name the rule by its static label; metrics by m.Label, which holds
		// values where the rule asks for them (detailed_metric, value_to_metric).
		*view = limitView{name: r.Label, metric: m.Label(dom.Name, es), limit: ch.Limit, shadow: r.Shadow}
		cl := &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: pb.RateLimitResponse_RateLimit_Unit(r.Unit)}
		if r.UnitMultiplier > 1 {
			cl.UnitMultiplier = wrapperspb.UInt32(r.UnitMultiplier)
		}
		st.CurrentLimit = cl
		return true
	}
	return false // kindNone
}

// cost sets ch's cost from the hits of the call (callHits) and of its descriptor (descHits,
// which replaces the call's, 0 included); probe reports a hits_addend 0 check.
func cost(ch *bucket.Charge, callHits uint32, descHits *wrapperspb.UInt64Value) (probe bool, err error) {
	hits := uint64(max(callHits, 1))
	if descHits != nil {
		hits = descHits.GetValue()
	}
	if hits != 0 {
		// More than the limit holds never conforms; clamping keeps the arithmetic small.
		ch.Cost = int64(min(hits, uint64(capacity(ch.Limit))+1))
		return false, nil
	}
	if ch.Lease.On() {
		// A leased rule's capacity sits in replicas' leases: no item says what is left, and a
		// leased unit cannot be given back exactly.
		return false, status.Error(codes.InvalidArgument, "hits_addend 0 (a check) is not served on a rule with a lease")
	}
	// A check that consumes nothing: take one, refundable (never cached as a denial), straight
	// from the item (no lease), and give it back once the call is decided.
	ch.Cost, ch.MayGiveBack, ch.Lease = 1, true, bucket.Lease{}
	return true, nil
}

// unchargedResult is the call result of a call that charged nothing: unlimited when an
// unlimited rule matched, else unmatched.
func (c *call) unchargedResult() int {
	if slices.Contains(c.kinds, kindUnlimited) {
		return callUnlimited
	}
	return callUnmatched
}

// undecided renders the on_error rule the store decided for a call it could not decide
// (bucket.RuleOf). Deny is the gRPC status UNAVAILABLE, which Envoy treats as a failed call:
// with the filter's failure_mode_deny it rejects the request, without it lets it pass. Allow
// is OK with no limit in the statuses, since none was decided.
func (s *Service) undecided(err error, calls *[numCallResults]prometheus.Counter, resp *pb.RateLimitResponse, statuses []pb.RateLimitResponse_DescriptorStatus) (*pb.RateLimitResponse, error) {
	if bucket.RuleOf(err).FailsClosed() {
		calls[callStoreErrorDenied].Inc()
		return nil, status.Error(codes.Unavailable, "rate limit store unavailable")
	}
	calls[callStoreErrorAllowed].Inc()
	for i := range statuses {
		if statuses[i].CurrentLimit != nil {
			statuses[i].CurrentLimit, statuses[i].LimitRemaining = nil, 0
		}
	}
	return resp, nil
}

// respond answers a decided call: each charged descriptor's status and counter, the overall
// code, the give-back of an admitted call's checks, and the headers of the limit the verdict
// names (verdict.Of: the enforced descriptor with the longest wait when the call is over its
// limits, else the one with the least remaining), as the proxy's.
func (s *Service) respond(ctx context.Context, now time.Time, c *call, admitted bool, resp *pb.RateLimitResponse, statuses []pb.RateLimitResponse_DescriptorStatus, calls *[numCallResults]prometheus.Counter) {
	for j := range c.charges {
		ch, r, v := &c.charges[j], &c.results[j], &c.views[j]
		// Nothing of an allowed charge stays spent when it is a check (given back) or when the
		// call is over its limits (a rejected call commits nothing).
		v.result, v.remaining = *r, verdict.Remaining(ch, r, admitted && !c.probe[j])
		st := &statuses[c.of[j]]
		st.LimitRemaining = uint32(min(max(v.remaining, 0), math.MaxUint32))
		reset := r.Reset
		rc := s.o.Metrics.valueRule(v.name, v.metric)
		switch {
		case r.Allowed:
			if admitted {
				rc.Allowed.Inc()
			}
		case ch.Shadow:
			rc.ShadowLimited.Inc()
		default:
			st.Code = pb.RateLimitResponse_OVER_LIMIT
			v.over = true
			reset = r.RetryAfter
			rc.Limited.Inc()
		}
		st.DurationUntilReset = durationpb.New(reset)
	}
	if !admitted {
		resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		calls[callOverLimit].Inc()
	} else {
		calls[callOK].Inc()
		s.giveBack(ctx, now, c)
	}
	if s.o.ShadowMode {
		resp.OverallCode = pb.RateLimitResponse_OK
	}
	resp.ResponseHeadersToAdd = s.o.Headers.appendHeaders(resp.ResponseHeadersToAdd, now, c.views, verdict.Of(c.charges, c.results))
}

// observe tells the console every descriptor of the decided call c that a rule charged (not
// the limit overrides: they belong to no rule; not the checks, hits_addend 0, which consume
// nothing and must not make a key an operator only looked at rise in `admin top`).
func (s *Service) observe(now time.Time, domain string, c *call) {
	for j := range c.charges {
		if i := c.of[j]; c.kinds[i] == kindRule && !c.probe[j] {
			s.o.Console.ObserveRLS(now, domain, &c.matches[i], c.entriesOf(i), &c.charges[j], !c.results[j].Allowed)
		}
	}
}

// take asks the store within the call's budget: store.timeout, or nine tenths of what is left
// of the call's deadline when that is less, so that the answer (on_error's included) reaches
// Envoy before it gives up on the call.
func (s *Service) take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	timeout := s.o.StoreTimeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl) * 9 / 10; left < timeout {
			timeout = left
		}
	}
	if timeout <= 0 {
		s.store.Timeout.Inc()
		return false, context.DeadlineExceeded
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t0 := time.Now()
	admitted, err := s.o.Store.Take(sctx, now, charges, results)
	s.store.Duration.Observe(time.Since(t0).Seconds())
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			s.store.Timeout.Inc()
		} else {
			s.store.Failure.Inc()
		}
		s.o.Logger.Debug("rls: store could not decide", zap.Error(err))
	}
	return admitted, err
}

// giveBack returns the checks (hits_addend 0) of an admitted call.
func (s *Service) giveBack(ctx context.Context, now time.Time, c *call) {
	c.taken = verdict.AppendTaken(c.taken[:0], c.charges, c.results, now, func(j int) bool { return c.probe[j] })
	if len(c.taken) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.o.StoreTimeout)
	defer cancel()
	if err := s.release.Release(rctx, now, c.taken); err != nil {
		s.o.Metrics.shared.ReleaseErrors.Inc()
		s.o.Logger.Warn("rls: a hits_addend 0 check was not given back (stricter until its window ends)", zap.Error(err))
	}
}

// capacity is the most one charge can take of l.
func capacity(l bucket.Limit) int64 {
	if l.Algorithm == bucket.TokenBucket {
		return l.Burst
	}
	return l.Count
}

// validRequest checks what envoyproxy/ratelimit also refuses (an empty domain or descriptor
// list), the bounds, overrides, and the hits that cannot be served.
func validRequest(req *pb.RateLimitRequest, canGiveBack bool) error {
	if req.GetDomain() == "" {
		return status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(ds) > maxDescriptors {
		return status.Errorf(codes.InvalidArgument, "more than %d descriptors", maxDescriptors)
	}
	for _, d := range ds {
		if len(d.GetEntries()) > maxEntries {
			return status.Errorf(codes.InvalidArgument, "a descriptor with more than %d entries", maxEntries)
		}
		if d.GetIsNegativeHits() {
			// Adding to a budget could admit more than the limit: the engine gives back only
			// what it took.
			return status.Error(codes.InvalidArgument, "is_negative_hits is not supported")
		}
		if o := d.GetLimit(); o != nil {
			if _, ok := envoyrules.OverrideLimit(o.GetRequestsPerUnit(), envoyrules.Unit(o.GetUnit()), o.GetUnitMultiplier().GetValue()); !ok {
				return status.Error(codes.InvalidArgument, "descriptor limit override: unknown unit, or more than 1e9 requests or 366 days")
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() == 0 && !canGiveBack {
			return status.Error(codes.InvalidArgument, "hits_addend 0 needs a store that gives charges back")
		}
	}
	return nil
}

var _ pb.RateLimitServiceServer = (*Service)(nil)

// Pool is the memory store's pool (bucket.Charge.Pool) of a domain's keys: "rls:" and the domain,
// apart from every policy's (a policy name has no ':'), so that a flood of descriptor values in
// one domain fills only that domain's share of the store.
func Pool(domain string) string { return "rls:" + domain }
