// Package policy compiles the configuration into policies and charges.
//
// It turns the YAML configuration into an immutable, compiled policy Set and, for each
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

// ErrBadRequest is returned (wrapped, by a *RequestError) by Set.Plan for a request that cannot
// be judged unambiguously: the upstream might act on another identity or route than the one
// the gateway would charge. Such a request is never forwarded; as with ErrUnauthorized, Plan
// leaves in the Plan the charges of its matching ip policies only.
var ErrBadRequest = errors.New("policy: ambiguous request")

// RequestError says why Set.Plan refused a request (ErrBadRequest).
type RequestError struct {
	// Header is the canonical name of the identity header sent on several lines with
	// different values; "" when the path is at fault (see authority).
	Header string
	// authority: the path starts with "//" (or "/\"), which some servers read as a host;
	// otherwise a path without Header has a "." or ".." segment.
	authority bool
}

func (e *RequestError) Error() string {
	switch {
	case e.authority:
		return "policy: the path starts with //"
	case e.Header == "":
		return "policy: the path has a dot segment"
	}
	return "policy: header " + e.Header + " has conflicting values"
}

// Unwrap makes errors.Is(err, ErrBadRequest) hold.
func (e *RequestError) Unwrap() error { return ErrBadRequest }

// Detail is the explanation for the client.
func (e *RequestError) Detail() string {
	if e.authority {
		return `The path starts with "//", which servers read either as a path or as a host and path; send a path that starts with one "/".`
	}
	if e.Header == "" {
		return `The path has a "." or ".." segment, which servers resolve differently; send the resolved path.`
	}
	return "The header " + e.Header + " was sent several times with different values; send it once."
}

// errDotSegments is the RequestError of a path with a "." or ".." segment: upstreams disagree
// on it (Express keeps it, nginx, Tomcat and Go's ServeMux resolve it; Tomcat's `..;` is a
// known way past path-based rules), and clients resolve them before sending.
var errDotSegments = &RequestError{}

// errAuthorityPath is the RequestError of a path that starts with "//": the gateway (like
// nginx and Werkzeug) would merge the slashes and charge /x/login for //x/login, while Node's
// `new URL(req.url, base)` and Python's urlsplit read x as a host and route /login.
var errAuthorityPath = &RequestError{authority: true}

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
	// KeyKind is where the key value comes from: ip, api_key, user, global or header:name
	// (the header's name in lower case). Pseudonyms of key values are per kind.
	KeyKind string
	// Limit is the policy's default limit; a Charge may carry an override's limit instead.
	Limit bucket.Limit
	// ChargeOn, when not nil, is the set of answer statuses that consume the budget: the
	// request's charge is taken (reserved) before it is forwarded, and given back through
	// bucket.Releaser when the answer's status is not in the set (charge_on).
	ChargeOn *StatusSet
	// Cost is what one matching request spends (at least 1), unless an entry of the policy's
	// costs matches it; whatever override applies, a charge carries its request's cost.
	Cost int64
	// Lease is the policy's lease mode (off unless the file turns it on).
	Lease bucket.Lease
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
	// Values[i] is the raw key value of Charges[i], for pseudonyms in log lines (never log it
	// as is); "" for ip and global charges, whose value KeyValue gives. Set.Plan fills it;
	// other planners may leave it short.
	Values []string
	// WantIdentity asks Set.Plan to fill Identity; Reset keeps it.
	WantIdentity bool
	// Identity is, with WantIdentity, the key value of every key kind that some policy of the
	// set uses (ip, api_key, user, header:name; not global), whether or not that policy matched
	// the request; kinds the request has no value for are left out. The access log carries
	// their pseudonyms, so that a replay can charge policies that did not match when the line
	// was written. The ip value is "" here: KeyValueOf("ip") gives it.
	Identity []KindValue

	ip    [64]byte // the ip key value (netip text form) when the set has ip policies
	ipLen uint8

	route  []byte   // scratch space of the request's canonical paths
	strip  []string // header names StripUnjudged removes
	dedupe []string // header names sent on several equal lines: StripUnjudged keeps one
}

// Reset empties the plan, keeping its capacity and WantIdentity.
func (p *Plan) Reset() {
	p.Charges = p.Charges[:0]
	p.Policies = p.Policies[:0]
	p.Values = p.Values[:0]
	p.Identity = p.Identity[:0]
	p.ipLen = 0
	p.route = p.route[:0]
	p.strip = p.strip[:0]
	p.dedupe = p.dedupe[:0]
}

// StripUnjudged edits the headers of the request that Set.Plan planned into p, before it is
// forwarded, so that the upstream receives only what was judged: it removes the user header
// from a peer that is not trusted, the method-override headers with method_override strip,
// and the underscore spellings of judged headers, and it reduces an identity header sent on
// several equal lines to one line. A Plan filled by PlanFields edits nothing.
func (p *Plan) StripUnjudged(h http.Header) {
	for _, k := range p.strip {
		delete(h, k)
	}
	for _, k := range p.dedupe {
		if vs := h[k]; len(vs) > 1 {
			h[k] = vs[:1:1]
		}
	}
}

// IdentityValue returns the value of p.Identity[i]; it allocates for the ip kind only.
func (p *Plan) IdentityValue(i int) string {
	if p.Identity[i].Kind == "ip" {
		return string(p.ip[:p.ipLen])
	}
	return p.Identity[i].Value
}

// KeyValue returns the raw key value of charge i: what its pseudonym is made of. It allocates
// for ip charges only. Never log it as is.
func (p *Plan) KeyValue(i int) string {
	if i < len(p.Policies) && p.Policies[i].KeyKind == "ip" {
		return string(p.ip[:p.ipLen])
	}
	if i < len(p.Values) {
		return p.Values[i]
	}
	return ""
}

// setIP records the ip key value of the plan's ip charges.
func (p *Plan) setIP(v []byte) {
	if len(v) > len(p.ip) {
		v = v[:len(p.ip)] // cannot happen: netip text is at most 50 bytes with a prefix
	}
	p.ipLen = uint8(copy(p.ip[:], v))
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
