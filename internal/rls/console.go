package rls

import (
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
)

// Console is what the service tells the operators' console (package console) about each call;
// *console.Console satisfies it. Both methods run on the call path, once per descriptor that a
// rule charges, so they must be cheap and safe for concurrent use, and must not keep what they
// are given.
type Console interface {
	// ExemptRLS reports the active exemption at now of rule r's bucket key: ok with the limit
	// that replaces the rule's for this call, or unlimited (the descriptor is answered OK and
	// charges nothing).
	ExemptRLS(now time.Time, r *envoyrules.Rule, key bucket.Key) (l bucket.Limit, unlimited, ok bool)
	// ObserveRLS counts a decided descriptor of domain: charge ch of the rule m matched for
	// entries, refused (limited) or not. entries are the descriptor's raw entries: the
	// console shows them only as a pseudonym.
	ObserveRLS(now time.Time, domain string, m *envoyrules.Match, entries []envoyrules.Entry, ch *bucket.Charge, limited bool)
}
