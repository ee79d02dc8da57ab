package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
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
	f := limitFields{rate: rate, burst: burst, limit: limit, window: window, windowSet: window != 0}
	if l.Algorithm == bucket.FixedWindow || l.Algorithm == bucket.SlidingWindow {
		if window == 0 {
			f.window, f.windowSet = l.Window, false // the policy's, which passed these checks
		}
	}
	// A policy's own checks, under the path "limit": the same bounds and the same messages.
	var es Errors
	checkFullLimit(&es, "limit", l.Algorithm, f)
	if len(es) == 0 {
		switch l.Algorithm {
		case bucket.TokenBucket, bucket.LeakyBucket:
			l.Rate, _ = ParseRate(rate)
			l.Burst = burst
		default:
			l.Count = limit
			if window != 0 {
				l.Window = window
			}
		}
		for _, pr := range limitterms.CheckLimit(l, int(l.Offset), nil, 1) {
			es.add("limit."+pr.Field, pr.Value, pr.Msg)
		}
	}
	if len(es) > 0 {
		return p.Limit, fmt.Errorf("%w (policy %s is a %s)", es, p.Name, limitterms.AlgorithmName(l.Algorithm))
	}
	return l, nil
}

// AlgorithmName is the configuration name of a (token_bucket, fixed_window, ...): limitterms's,
// which Envoy's rule files share.
func AlgorithmName(a bucket.Algorithm) string { return limitterms.AlgorithmName(a) }
