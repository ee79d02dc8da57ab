package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// ErrNoPolicy is returned (wrapped) by Set.KeyCharge for a policy name the set does not have.
var ErrNoPolicy = errors.New("policy: no such policy")

// KeyCharge is the charge that the policy named name makes for the key value value, exactly as
// Plan builds it for a request with that key (the same bucket key, and the limit of an
// override that matches): what the operators' console inspects and resets. value is an ip
// policy's client address (an IPv6 address is keyed by its identity.ipv6_prefix, as Plan does),
// an api_key, user or header:NAME policy's raw value, and ignored for a global policy. unlimited
// reports an unlimited override (Plan charges nothing for such a key). It does not charge.
func (s *Set) KeyCharge(name, value string) (c bucket.Charge, pol *Policy, unlimited bool, err error) {
	var ru *rule
	for i := range s.rules {
		if s.rules[i].pol.Name == name {
			ru = &s.rules[i]
			break
		}
	}
	if ru == nil {
		return bucket.Charge{}, nil, false, fmt.Errorf("%w: %q", ErrNoPolicy, name)
	}
	var client netip.Addr
	v := value
	switch ru.kind {
	case keyGlobal:
		v = ""
	case keyIP:
		a, err := netip.ParseAddr(value)
		if err != nil {
			return bucket.Charge{}, ru.pol, false, fmt.Errorf("policy %s is keyed by ip: key %q is not an IP address", name, value)
		}
		client = a.WithZone("").Unmap()
		var buf [64]byte
		v = string(s.appendIPKey(buf[:0], client))
	default:
		if value == "" {
			return bucket.Charge{}, ru.pol, false, fmt.Errorf("policy %s: the key is empty", name)
		}
	}
	c, ok := charge(ru, v, client)
	if !ok {
		return bucket.Charge{}, ru.pol, true, nil
	}
	c.Cost = 1
	return c, ru.pol, false, nil
}

// Policy returns the compiled policy named name, or nil.
func (s *Set) Policy(name string) *Policy {
	for _, p := range s.policies {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// ReplacementLimit builds the limit that replaces p's for an exempt key, from the fields an
// override has: rate (N/s, N/m, N/h) and burst for token and leaky buckets; limit for windows,
// quotas and concurrency, and for windows an optional window (the policy's otherwise). The
// algorithm, and a quota's calendar, stay the policy's. Errors name the field and its value.
func (p *Policy) ReplacementLimit(rate string, burst, limit int64, window time.Duration) (bucket.Limit, error) {
	l := p.Limit
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		r, err := ParseRate(rate)
		if err != nil || r <= 0 {
			return l, fmt.Errorf("limit.rate %q: must be N/s, N/m or N/h with N > 0 (policy %s is a %s)", rate, p.Name, algorithmName[l.Algorithm])
		}
		if burst < 1 {
			return l, fmt.Errorf("limit.burst %d: must be at least 1", burst)
		}
		l.Rate, l.Burst = r, burst
	default:
		if limit < 1 {
			return l, fmt.Errorf("limit.limit %d: must be at least 1 (policy %s is a %s)", limit, p.Name, algorithmName[l.Algorithm])
		}
		l.Count = limit
		if window != 0 {
			if l.Algorithm != bucket.FixedWindow && l.Algorithm != bucket.SlidingWindow {
				return l, fmt.Errorf("limit.window %s: only windows have one (policy %s is a %s)", window, p.Name, algorithmName[l.Algorithm])
			}
			if window < time.Second {
				return l, fmt.Errorf("limit.window %s: must be at least 1s", window)
			}
			l.Window = window
		}
	}
	return l, nil
}

// AlgorithmName is the configuration name of a (token_bucket, fixed_window, ...).
func AlgorithmName(a bucket.Algorithm) string {
	if int(a) < len(algorithmName) {
		return algorithmName[a]
	}
	return ""
}

// Rules returns the domain's rules (those with a rate_limit block), in no particular order.
func (d *RLSDomain) Rules() []*RLSRule {
	var out []*RLSRule
	var walk func(n *rlsNode)
	walk = func(n *rlsNode) {
		if n.rule != nil {
			out = append(out, n.rule)
		}
		// children holds every descriptor of the level, wildcards included (n.wild indexes
		// those again for matching): walking both listed a wildcard's rule twice.
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(&d.root)
	return out
}

// RLSTarget is a descriptor of an rls domain as the rate limit service charges it.
type RLSTarget struct {
	// Charge is the charge the service makes (without a per-request limit override).
	Charge bucket.Charge
	// Rule is the matched rule; Unlimited reports a rule without a limit (no charge then).
	Rule      *RLSRule
	Unlimited bool
	// Entries are the descriptor's entries as the bucket key hashed them (RLSMatch.KeyEntries).
	Entries []RLSEntry
}

// RLSCharge finds what Envoy's rate limit service charges for a descriptor of domain, as the
// service builds it: what the console inspects, resets and exempts.
func (s *Set) RLSCharge(domain string, entries []RLSEntry) (RLSTarget, error) {
	d := s.RLS().Domain(domain)
	if d == nil {
		return RLSTarget{}, fmt.Errorf("no rls domain %q", domain)
	}
	var m RLSMatch
	r := d.Match(entries, &m)
	if r == nil {
		return RLSTarget{}, fmt.Errorf("no rule of rls domain %q matches the descriptor", domain)
	}
	if r.Unlimited {
		return RLSTarget{Rule: r, Unlimited: true, Entries: entries}, nil
	}
	return RLSTarget{Charge: bucket.Charge{Key: m.Key(entries), Limit: r.Limit, Shadow: r.Shadow, Lease: r.Lease, Cost: 1},
		Rule: r, Entries: m.KeyEntries(entries)}, nil
}

// RLSRuleByLabel finds the rule whose Label is label, and its domain: how the console names
// rls rules. nil when no rule has it.
func (s *Set) RLSRuleByLabel(label string) (domain string, rule *RLSRule) {
	rules := s.RLS()
	for _, dn := range rules.Domains() {
		if !strings.HasPrefix(label, dn+".") {
			continue
		}
		for _, r := range rules.Domain(dn).Rules() {
			if r.Label == label {
				return dn, r
			}
		}
	}
	return "", nil
}
