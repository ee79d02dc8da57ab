package policy

// This file describes a compiled policy in words: its one-line summary, its IETF
// RateLimit-Policy item, and the short duration format they (and error messages) use.

import (
	"fmt"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

func summary(pc *PolicyConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: key=%s %s", pc.Name, pc.Key, pc.Algorithm)
	switch alg := algorithms[pc.Algorithm]; {
	case isBucket(alg):
		fmt.Fprintf(&b, " rate=%s burst=%d", pc.Rate, pc.Burst)
	case alg == bucket.Concurrency:
		fmt.Fprintf(&b, " limit=%d in flight", pc.Limit)
	case alg == bucket.Quota:
		zone := pc.TimeZone
		if zone == "" {
			zone = "UTC"
		}
		fmt.Fprintf(&b, " limit=%d period=%s time_zone=%s", pc.Limit, pc.Period, zone)
		if pc.Offset != 0 {
			fmt.Fprintf(&b, " offset=%d", pc.Offset)
		}
	default:
		fmt.Fprintf(&b, " limit=%d window=%s", pc.Limit, limitterms.ShortDuration(pc.Window))
	}
	if pc.Cost > 1 {
		fmt.Fprintf(&b, " cost=%d", pc.Cost)
	}
	for _, c := range pc.Costs {
		route := strings.Join(c.Methods, ",")
		if c.PathPrefix != "" {
			route = strings.TrimPrefix(route+" "+c.PathPrefix, " ")
		}
		fmt.Fprintf(&b, " cost(%s)=%d", route, c.Cost)
	}
	mode := pc.Mode
	if mode == "" {
		mode = modeEnforce
	}
	b.WriteString(" " + mode)
	if len(pc.Match.Methods) > 0 {
		b.WriteString(" methods=" + strings.Join(pc.Match.Methods, ","))
	}
	if pc.Match.PathPrefix != "" {
		b.WriteString(" path_prefix=" + pc.Match.PathPrefix)
	}
	if len(pc.ChargeOn) > 0 {
		b.WriteString(" charge_on=" + strings.Join(pc.ChargeOn, ","))
	}
	if n := len(pc.Overrides); n > 0 {
		fmt.Fprintf(&b, " overrides=%d", n)
	}
	if pc.Pool != "" {
		b.WriteString(" pool=" + pc.Pool)
	}
	if l := pc.Lease; l != nil && l.Enabled {
		fmt.Fprintf(&b, " lease(shards=%d", max(l.Shards, 1))
		if l.TTL > 0 {
			b.WriteString(" ttl=" + limitterms.ShortDuration(l.TTL))
		}
		b.WriteString(")")
	}
	return b.String()
}

// ietfPolicy is the RateLimit-Policy item of p's default limit, precomputed once per compile
// (answer.AppendPolicyItem says what each algorithm advertises).
func ietfPolicy(p *Policy) string { return string(answer.AppendPolicyItem(nil, p.Name, p.Limit)) }
