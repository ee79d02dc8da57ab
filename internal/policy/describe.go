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

// Plural is "1 policy", "2 policies": n and the noun (singular, plural) that fits it.
func Plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// ProtectSummary is validate's line for the protect block: "protect: off" without one, else
// the limit, its queue, what a shed request gets and the priority classes in file order.
func ProtectSummary(c *Config) string {
	p := c.Protect
	if p == nil {
		return "protect: off"
	}
	var b strings.Builder
	cc := p.Concurrency
	if cc.Adaptive {
		fmt.Fprintf(&b, "protect: adaptive limit=%d min_limit=%d max_limit=%d", cc.Limit, cc.MinLimit, cc.MaxLimit)
	} else {
		fmt.Fprintf(&b, "protect: fixed limit=%d", cc.Limit)
	}
	fmt.Fprintf(&b, " queue_timeout=%s status=%d max_buffered_body=%d stream_share=%g",
		limitterms.ShortDuration(cc.QueueTimeout), p.Status, p.MaxBufferedBody, p.StreamShare)
	if len(p.Priorities) > 0 {
		classes := make([]string, len(p.Priorities))
		for i, pr := range p.Priorities {
			classes[i] = pr.Name
			if pr.Reserve > 0 {
				classes[i] += fmt.Sprintf("(reserve=%g)", pr.Reserve)
			}
		}
		b.WriteString(" priorities=" + strings.Join(classes, ","))
	}
	return b.String()
}

// AdminSummary is validate's line for the operators' console on admin_listen: whether writes
// and reads need a token (named by its variable, never shown), and its bounds.
func AdminSummary(c *Config) string {
	a := c.Admin
	writes, reads := "off", "open"
	if a.TokenEnv != "" {
		writes = "token:$" + a.TokenEnv
	}
	if a.ReadTokenEnv != "" {
		reads = "token:$" + a.ReadTokenEnv
	}
	s := fmt.Sprintf("admin: %s writes=%s reads=%s top_k=%d max_exemptions=%d", c.AdminListen, writes, reads, a.TopK, a.MaxExemptions)
	if len(a.Hosts) > 0 {
		s += " hosts=" + strings.Join(a.Hosts, ",")
	}
	return s
}
