package policy

import (
	"net/http"
	"net/netip"
)

// Set is a compiled, immutable policy set. It is safe for concurrent use; reload builds a new Set.
//
// TEMPORARY STUB: replaced by the real implementation.
type Set struct {
	policies []*Policy
	headers  Headers
}

// Plan fills p with the charges for r. It returns an error wrapping ErrUnauthorized for a bearer
// token that fails verification.
func (s *Set) Plan(r *http.Request, p *Plan) error { p.Reset(); return nil }

// Headers returns the response-header settings.
func (s *Set) Headers() Headers { return s.headers }

// Policies returns the compiled policies in evaluation order.
func (s *Set) Policies() []*Policy { return s.policies }

// Trusted reports whether peer is one of trusted_proxies, whose forwarding headers are believed.
func (s *Set) Trusted(peer netip.Addr) bool { return false }
