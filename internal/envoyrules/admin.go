package envoyrules

// This file is what the operators' console (internal/admin) reads of the rules: the rules of a
// domain, and the charge of a descriptor, to inspect and reset its bucket.

import (
	"fmt"

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
		for _, c := range n.children {
			walk(c)
		}
		for i := range n.wild {
			walk(n.wild[i].node)
		}
	}
	walk(&d.root)
	return out
}

// Charge is the charge that Envoy's rate limit service makes for a descriptor of domain, as
// the service builds it (without a per-request limit override): what the console inspects and
// resets. unlimited reports a rule without a limit.
func (r *Rules) Charge(domain string, entries []Entry) (c bucket.Charge, rule *Rule, unlimited bool, err error) {
	d := r.Domain(domain)
	if d == nil {
		return bucket.Charge{}, nil, false, fmt.Errorf("no rls domain %q", domain)
	}
	var m Match
	rule = d.Match(entries, &m)
	if rule == nil {
		return bucket.Charge{}, nil, false, fmt.Errorf("no rule of rls domain %q matches the descriptor", domain)
	}
	if rule.Unlimited {
		return bucket.Charge{}, rule, true, nil
	}
	return bucket.Charge{Key: m.Key(entries), Limit: rule.Limit, Shadow: rule.Shadow, Lease: rule.Lease, Cost: 1}, rule, false, nil
}
