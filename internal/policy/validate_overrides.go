package policy

// This file checks a policy's overrides and the keys they name.

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

func checkOverrides(es *Errors, at string, p *PolicyConfig, kind keyKind, kindOK bool, alg bucket.Algorithm, algOK bool) {
	if len(p.Overrides) == 0 {
		return
	}
	if kind == keyGlobal {
		es.add(at+".overrides", "", "a global policy has a single key: change its limit instead")
		return
	}
	seen := make(map[string]int, len(p.Overrides))
	for j := range p.Overrides {
		o := &p.Overrides[j]
		oat := fmt.Sprintf("%s.overrides[%d]", at, j)
		norm, ok := overrideKey(o.Key, kind)
		switch {
		case o.Key == "":
			es.add(oat+".key", "", `required: "sha256:" and the hex SHA-256 of the key value`)
		case ok:
			if first, dup := seen[norm]; dup {
				es.add(oat+".key", o.Key, fmt.Sprintf("duplicate of overrides[%d]", first))
			} else {
				seen[norm] = j
			}
		case kindOK && kind == keyIP:
			es.add(oat+".key", o.Key, `must be "sha256:" and 64 lower-case hex digits, or an IP address or CIDR`)
		case isAddrOrPrefix(o.Key):
			es.add(oat+".key", o.Key, `addresses and CIDRs are keys of ip policies only; use "sha256:" and the hex SHA-256 of the value`)
		case hasFoldPrefix(o.Key, "sha256:"):
			es.add(oat+".key", o.Key, `must be "sha256:" and 64 lower-case hex digits`)
		default:
			// Most likely the raw key itself, pasted where its hash belongs: quoting it would
			// put a credential into stderr and the reload log.
			es.add(oat+".key", "", `must be "sha256:" and 64 lower-case hex digits (the value is not shown: it may be a raw key; hash it with printf %s KEY | sha256sum)`)
		}
		f := o.fields()
		setsLimit := f != (limitFields{})
		switch {
		case o.Unlimited && setsLimit:
			es.add(oat+".unlimited", "", "cannot be combined with rate, burst, limit or window")
		case !o.Unlimited && !setsLimit:
			es.add(oat, "", "sets neither unlimited: true nor a limit")
		case setsLimit && algOK:
			before := len(*es)
			checkLimit(es, oat, alg, f, false)
			eff := effective(p, o)
			if len(*es) == before && isBucket(alg) {
				for _, pr := range limitterms.CheckLimit(limitOf(alg, p, eff), 0, nil, 1) {
					es.add(oat+"."+pr.Field, pr.Value, pr.Msg) // the refill time
				}
			}
			if len(*es) == before {
				// Blame the field that made the limit too small for the policy's cost.
				field, shown := ".limit", eff.limit
				if isBucket(alg) {
					field, shown = ".burst", eff.burst
				}
				checkCost(es, oat+field, shown, maxCost(p), eff, alg)
			}
		}
	}
}

// effective is the override's limit: its own fields, the policy's for those it leaves unset.
func effective(p *PolicyConfig, o *OverrideConfig) limitFields {
	f := p.fields()
	if o.Rate != "" {
		f.rate = o.Rate
	}
	if o.Burst != 0 {
		f.burst = o.Burst
	}
	if o.Limit != 0 {
		f.limit = o.Limit
	}
	if o.Window != 0 {
		f.window = o.Window
	}
	return f
}

// overrideKey normalizes an override's key for duplicate detection: "sha256:<hex>" as is, an
// address or CIDR (ip policies only) as its masked prefix.
func overrideKey(s string, kind keyKind) (string, bool) {
	if isSHA256Key(s) {
		return s, true
	}
	if kind != keyIP {
		return "", false
	}
	if p, ok := parsePrefix(s); ok {
		return p.String(), true
	}
	return "", false
}

func isSHA256Key(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(s) != hexSHA256 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; !isDigit(c) && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// hasFoldPrefix is strings.HasPrefix, ignoring ASCII case.
func hasFoldPrefix(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// isIdentifier reports a C identifier, the shape of a portable environment variable name.
func isIdentifier(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || i > 0 && isDigit(c)) {
			return false
		}
	}
	return s != ""
}

func isAddrOrPrefix(s string) bool {
	_, ok := parsePrefix(s)
	return ok
}

// parsePrefix reads a CIDR or a single address (as a /32 or /128), unmapping IPv4-in-IPv6 so
// that it matches the unmapped client addresses; the result is masked.
func parsePrefix(s string) (netip.Prefix, bool) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, false
		}
		if a := p.Addr(); a.Is4In6() {
			if p.Bits() < 96 {
				return netip.Prefix{}, false
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), true
}
