package policy

// The protect block's checks.

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
	"golang.org/x/net/http/httpguts"
)

// Priority class names of protect.priorities, from the first shed to the last.
const (
	PrioritySheddable = "sheddable"
	PriorityDefault   = "default"
	PriorityCritical  = "critical"
)

// Bounds of the protect block (its defaults are in defaults.go).
const (
	maxMaxBufferedBody = 64 << 20
	maxProtectLimit    = 100000
	maxQueueTimeout    = time.Minute
)

// checkProtect checks the protect block; nil (no block) is valid: protection is off.
func checkProtect(es *Errors, cfg *Config) {
	p := cfg.Protect
	if p == nil {
		return
	}
	if cfg.Upstream == "" && cfg.RLS != nil {
		es.add("protect", "", "set, but upstream is empty: protect guards the proxy's upstream, and there is no proxy")
	}
	c := &p.Concurrency
	limitOK := c.Limit >= 1 && c.Limit <= maxProtectLimit
	if !limitOK {
		es.add("protect.concurrency.limit", strconv.Itoa(c.Limit), fmt.Sprintf("must be from 1 to %d", maxProtectLimit))
	}
	if c.Adaptive {
		minOK := c.MinLimit >= 1 && c.MinLimit <= maxProtectLimit
		maxOK := c.MaxLimit >= 1 && c.MaxLimit <= maxProtectLimit
		if !minOK {
			es.add("protect.concurrency.min_limit", strconv.Itoa(c.MinLimit), fmt.Sprintf("must be from 1 to %d", maxProtectLimit))
		}
		if !maxOK {
			es.add("protect.concurrency.max_limit", strconv.Itoa(c.MaxLimit), fmt.Sprintf("must be from 1 to %d", maxProtectLimit))
		}
		switch {
		case minOK && maxOK && c.MinLimit > c.MaxLimit:
			es.add("protect.concurrency.min_limit", strconv.Itoa(c.MinLimit), fmt.Sprintf("must not exceed max_limit (%d)", c.MaxLimit))
		case limitOK && minOK && maxOK && (c.Limit < c.MinLimit || c.Limit > c.MaxLimit):
			es.add("protect.concurrency.limit", strconv.Itoa(c.Limit), fmt.Sprintf("must be from min_limit (%d) to max_limit (%d): it is the adaptive limit's start", c.MinLimit, c.MaxLimit))
		}
	}
	if d := c.QueueTimeout; d < 0 || d > maxQueueTimeout {
		es.add("protect.concurrency.queue_timeout", limitterms.ShortDuration(d), "must be from 0s (no waiting) to "+limitterms.ShortDuration(maxQueueTimeout))
	}
	switch p.Status {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
	default:
		es.add("protect.status", strconv.Itoa(p.Status), "must be 503 or 429")
	}
	if b := p.MaxBufferedBody; b < 0 || b > maxMaxBufferedBody {
		es.add("protect.max_buffered_body", strconv.FormatInt(b, 10), fmt.Sprintf("must be from 0 (every body streams) to %d bytes", maxMaxBufferedBody))
	}
	if r := p.StreamShare; !(r > 0 && r <= 1) {
		es.add("protect.stream_share", strconv.FormatFloat(r, 'g', -1, 64), "must be above 0 and at most 1 (a share of the limit)")
	}
	reserved := map[string]int{} // class -> the entry with its reserve
	var reserves float64
	for i := range p.Priorities {
		pr := &p.Priorities[i]
		at := fmt.Sprintf("protect.priorities[%d]", i)
		switch pr.Name {
		case PriorityCritical, PriorityDefault, PrioritySheddable:
		case "":
			es.add(at+".name", "", "required: critical, default or sheddable")
		default:
			es.add(at+".name", pr.Name, "must be critical, default or sheddable")
		}
		switch r := pr.Reserve; {
		case r < 0 || r >= 1 || r != r:
			es.add(at+".reserve", strconv.FormatFloat(r, 'g', -1, 64), "must be at least 0 and below 1 (a share of the limit)")
		case r > 0 && pr.Name == PrioritySheddable:
			es.add(at+".reserve", strconv.FormatFloat(r, 'g', -1, 64), "must be 0 for sheddable: a reserve is held back from the classes below, and none is below sheddable")
		case r > 0:
			// A class may have several entries (several ways to match it), one reserve.
			if first, dup := reserved[pr.Name]; dup {
				es.add(at+".reserve", strconv.FormatFloat(r, 'g', -1, 64), fmt.Sprintf("%s has a reserve already (protect.priorities[%d]): one reserve per class", pr.Name, first))
			} else {
				reserved[pr.Name] = i
				reserves += r
			}
		}
		m := &pr.Match
		for j, meth := range m.Methods {
			if !methods[meth] {
				es.add(fmt.Sprintf("%s.match.methods[%d]", at, j), meth, "must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE")
			}
		}
		checkPathPrefix(es, at+".match.path_prefix", m.PathPrefix)
		names := make([]string, 0, len(m.Headers))
		for name := range m.Headers {
			names = append(names, name)
		}
		sort.Strings(names) // a stable report
		for _, name := range names {
			hp := at + ".match.headers." + name
			switch {
			case !httpguts.ValidHeaderFieldName(name):
				es.add(hp, name, "must be a valid header name")
			case unseenHeader(name) != "":
				es.add(hp, name, unseenHeader(name))
			case m.Headers[name] == "":
				es.add(hp, "", "must not be empty: the value the header must have")
			}
		}
	}
	if reserves >= 1 {
		es.add("protect.priorities", strconv.FormatFloat(reserves, 'g', -1, 64), "the reserves add up to 1 or more: some class would never get a slot")
	}
}

// Warnings are what a valid configuration does that its author may not expect; `validate`
// prints them and serve logs them at start.
func Warnings(cfg *Config) []string {
	var out []string
	if cfg.Protect != nil && len(cfg.TrustedProxies) == 0 {
		for i, pr := range cfg.Protect.Priorities {
			names := make([]string, 0, len(pr.Match.Headers))
			for name := range pr.Match.Headers {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				out = append(out, fmt.Sprintf("protect.priorities[%d].match.headers.%s: any client may send this header, so a priority is believed from it only from trusted_proxies, and none is set: this entry matches no request (match on a route, or list the proxy that sets the header in trusted_proxies)", i, name))
			}
		}
	}
	return out
}
