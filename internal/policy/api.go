// Package policy turns the YAML configuration into an immutable, compiled policy Set and, for each
// request, into the list of bucket charges that the limiter must take.
package policy

import (
	"errors"
	"net/http"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// ErrUnauthorized is returned (wrapped) by Set.Plan when the request carries a bearer token that
// fails verification, or several Authorization lines of which one is Bearer. Such a request is
// never forwarded. Plan leaves in the Plan the charges of its matching ip policies only: the
// caller takes them and answers 429 when they are over the limit, else 401, so bad tokens are
// still held by the ip limits but drain no other policy's pool.
var ErrUnauthorized = errors.New("policy: invalid bearer token")

// ResetFormat says how X-RateLimit-Reset is written.
type ResetFormat uint8

// Reset formats.
const (
	ResetUnix  ResetFormat = iota + 1 // epoch seconds of the reset instant
	ResetDelta                        // seconds from now until the reset
)

// Headers is the response-header configuration of a Set.
type Headers struct {
	Reset ResetFormat
	// IETF adds RateLimit-Policy / RateLimit (draft-ietf-httpapi-ratelimit-headers).
	IETF bool
}

// Policy is one compiled policy. It is immutable and shared by concurrent requests.
type Policy struct {
	Name   string
	Index  int  // position in the file; policies are evaluated in this order
	Shadow bool // mode: shadow counts, logs and labels but never rejects
	// Limit is the policy's default limit; a Charge may carry an override's limit instead.
	Limit bucket.Limit
	// ChargeOn, when not nil, is the set of answer statuses that consume the budget: the
	// request's charge is taken (reserved) before it is forwarded, and given back through
	// bucket.Releaser when the answer's status is not in the set (charge_on).
	ChargeOn *StatusSet
	// Cost is what one matching request spends (at least 1), unless an entry of the policy's
	// costs matches it; whatever override applies, a charge carries its request's cost.
	Cost int64
	// Summary is a one-line human description, printed by `validate`.
	Summary string
	// IETFPolicy is the precomputed RateLimit-Policy item for the default limit, e.g.
	// `"per-ip";q=100;w=60`.
	IETFPolicy string
}

// Plan is the outcome of matching one request: Charges[i] is charged for Policies[i]. A Plan is
// reusable: Set.Plan truncates and refills the slices, so a pooled Plan costs no allocations.
type Plan struct {
	Charges  []bucket.Charge
	Policies []*Policy
}

// Reset empties the plan, keeping its capacity.
func (p *Plan) Reset() {
	p.Charges = p.Charges[:0]
	p.Policies = p.Policies[:0]
}

// Now is how a Set reads the clock for JWT exp/nbf checks; tests replace it through
// CompileOptions.Now.
type Now func() time.Time

// Interface check for the proxy's consumer-side view of a Set.
var _ interface {
	Plan(*http.Request, *Plan) error
	Headers() Headers
	Policies() []*Policy
} = (*Set)(nil)
