package envoyrules

// This file is what the operators' console (internal/console) reads of the rules: the rules of a
// domain, and the charge of a descriptor, to inspect and reset its bucket.

import (
	"fmt"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Rules returns the domain's rules (those with a rate_limit block), in no particular order.
func (d *Domain) Rules() []*Rule {
	var out []*Rule
	var walk func(n *node)
	walk = func(n *node) {
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

// Target is a descriptor of a domain as the rate limit service charges it.
type Target struct {
	// Charge is the charge the service makes (without a per-request limit override).
	Charge bucket.Charge
	// Rule is the matched rule; Unlimited reports a rule without a limit (no charge then).
	Rule      *Rule
	Unlimited bool
	// Entries are the descriptor's entries as the bucket key hashed them (Match.KeyEntries).
	Entries []Entry
}

// Charge finds what Envoy's rate limit service charges for a descriptor of domain, as the
// service builds it: what the console inspects, resets and exempts.
func (r *Rules) Charge(domain string, entries []Entry) (Target, error) {
	d := r.Domain(domain)
	if d == nil {
		return Target{}, fmt.Errorf("no rls domain %q", domain)
	}
	var m Match
	rule := d.Match(entries, &m)
	if rule == nil {
		return Target{}, fmt.Errorf("no rule of rls domain %q matches the descriptor", domain)
	}
	if rule.Unlimited {
		return Target{Rule: rule, Unlimited: true, Entries: entries}, nil
	}
	return Target{Charge: bucket.Charge{Key: m.Key(entries), Limit: rule.Limit, Shadow: rule.Shadow, Lease: rule.Lease, Cost: 1},
		Rule: rule, Entries: m.KeyEntries(entries)}, nil
}

// RuleByLabel finds the rule whose Label is label, and its domain: how the console names rls
// rules. nil when no rule has it.
func (r *Rules) RuleByLabel(label string) (domain string, rule *Rule) {
	for _, dn := range r.Domains() {
		if !strings.HasPrefix(label, dn+".") {
			continue
		}
		for _, ru := range r.Domain(dn).Rules() {
			if ru.Label == label {
				return dn, ru
			}
		}
	}
	return "", nil
}
