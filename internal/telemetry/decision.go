package telemetry

import (
	"context"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// The decision's attributes on a request's (or an RLS call's) span.
const (
	AttrDecision   = attribute.Key("ratelimit.decision")    // allowed, limited, unmatched, ... (the decisions metric's result)
	AttrPolicy     = attribute.Key("ratelimit.policy")      // the deciding policy (or rls rule label)
	AttrAlgorithm  = attribute.Key("ratelimit.algorithm")   // its algorithm
	AttrKey        = attribute.Key("ratelimit.key")         // its key's pseudonym, "global" for a global policy
	AttrRetryAfter = attribute.Key("ratelimit.retry_after") // seconds, on a refusal
	AttrLimit      = attribute.Key("ratelimit.limit")
	AttrRemaining  = attribute.Key("ratelimit.remaining")
	AttrCharges    = attribute.Key("ratelimit.charges")  // how many charges the request made
	AttrPolicies   = attribute.Key("ratelimit.policies") // every charged policy, in order
	AttrShadow     = attribute.Key("ratelimit.shadow_limited")
	AttrDomain     = attribute.Key("ratelimit.domain") // an RLS call's domain
)

// Decisions is the proxy's decision hook (proxy.Tracer): it puts a request's decision on its
// span. An unsampled request costs a look at its span and nothing more.
type Decisions struct{ t *Telemetry }

// Decisions returns the proxy's decision hook.
func (t *Telemetry) Decisions() *Decisions { return &Decisions{t: t} }

// Decided records the decision (a ratelimit_decisions_total result) of the request whose
// context is ctx: p its plan, results the charges' verdicts (nil when the store never decided).
// The deciding charge is the refusing one that asks for the longest wait, or else the
// enforced charge with the least left, as the response headers choose.
func (d *Decisions) Decided(ctx context.Context, decision string, p *policy.Plan, results []bucket.Result) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs, AttrDecision.String(decision), AttrCharges.Int(len(p.Charges)))
	if len(p.Policies) > 0 {
		names := make([]string, len(p.Policies))
		for i, pol := range p.Policies {
			names[i] = pol.Name
		}
		attrs = append(attrs, AttrPolicies.StringSlice(names))
	}
	if len(results) >= len(p.Charges) && len(p.Charges) > 0 {
		pick, shadow := pickCharge(p, results)
		if pick >= 0 {
			pol, res := p.Policies[pick], results[pick]
			attrs = append(attrs,
				AttrPolicy.String(pol.Name),
				AttrAlgorithm.String(limitterms.AlgorithmName(p.Charges[pick].Limit.Algorithm)),
				AttrKey.String(d.key(p, pick)),
				AttrLimit.Int64(res.Limit),
				AttrRemaining.Int64(max(res.Remaining, 0)),
			)
			if !res.Allowed {
				attrs = append(attrs, AttrRetryAfter.Int64(retrySeconds(res.RetryAfter)))
			}
		}
		if shadow {
			attrs = append(attrs, AttrShadow.Bool(true))
		}
	}
	span.SetAttributes(attrs...)
}

// pickCharge picks the deciding charge of an decided plan (-1: none enforced), and reports
// whether a shadow charge did not conform.
func pickCharge(p *policy.Plan, results []bucket.Result) (pick int, shadow bool) {
	pick = -1
	refused := false
	for i := range p.Charges {
		r := &results[i]
		if p.Charges[i].Shadow {
			shadow = shadow || !r.Allowed
			continue
		}
		switch {
		case !r.Allowed && (!refused || r.RetryAfter > results[pick].RetryAfter):
			pick, refused = i, true
		case r.Allowed && !refused && (pick < 0 || r.Remaining < results[pick].Remaining):
			pick = i
		}
	}
	return pick, shadow
}

// key is charge i's key as the log names it: its pseudonym, or "global".
func (d *Decisions) key(p *policy.Plan, i int) string {
	kind := p.Policies[i].KeyKind
	if kind == "global" {
		return "global"
	}
	return d.t.ps.Of(kind, p.KeyValue(i))
}

// retrySeconds is a wait as Retry-After says it: whole seconds, rounded up, at least 1.
func retrySeconds(d time.Duration) int64 {
	s := int64(math.Ceil(d.Seconds()))
	return max(s, 1)
}
