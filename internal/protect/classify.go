package protect

import (
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Classifier sorts requests into classes by the entries of protect.priorities: the first entry
// whose match matches decides; anything else is Default. It is immutable and safe for
// concurrent use.
//
// A rule that names headers matches only a request whose TCP peer is trusted (one of
// trusted_proxies, which set or strip such headers): any client can send X-Priority: critical,
// and a priority it chose itself would let it skip the shedding that protects everyone else.
// A header that arrives several times (several lines) never matches, whatever its values: it
// is one a trusted proxy did not set alone.
type Classifier struct {
	rules []rule
}

type rule struct {
	class   Class
	methods []string // canonical; GET brings HEAD
	prefix  string   // canonical path prefix ("" any), folded unless sensitive
	bare    string   // prefix without its trailing slash: /x/ also matches /x
	sens    bool
	headers []header
}

type header struct{ name, value string }

// NewClassifier compiles validated priorities (policy.Config.Validate checked them).
func NewClassifier(ps []policy.PriorityConfig) *Classifier {
	c := &Classifier{}
	for _, p := range ps {
		r := rule{class: ClassOf(p.Name), sens: p.Match.PathCaseSensitive}
		for _, m := range p.Match.Methods {
			r.methods = append(r.methods, m)
			if m == http.MethodGet {
				r.methods = append(r.methods, http.MethodHead) // served by the GET handler
			}
		}
		if p.Match.PathPrefix != "" {
			r.prefix, _ = policy.CanonicalPath(p.Match.PathPrefix, !r.sens)
			if len(r.prefix) > 1 && strings.HasSuffix(r.prefix, "/") {
				r.bare = strings.TrimSuffix(r.prefix, "/")
			}
		}
		for name, v := range p.Match.Headers {
			r.headers = append(r.headers, header{http.CanonicalHeaderKey(name), v})
		}
		c.rules = append(c.rules, r)
	}
	return c
}

// ClassOf is the class named name in the config; unknown names are Default.
func ClassOf(name string) Class {
	switch name {
	case policy.PriorityCritical:
		return Critical
	case policy.PrioritySheddable:
		return Sheddable
	}
	return Default
}

// Trust tells the classifier whose headers to believe; policy.Set (trusted_proxies) satisfies
// it, and so does the proxy's Policies.
type Trust interface {
	Trusted(peer netip.Addr) bool
}

// Classify is r's class. Paths and methods are matched in their canonical form, as policies
// match them (docs/algorithms.md, route matching), so no spelling moves a request to a class
// it would not be in otherwise. Header rules match only when t trusts r's TCP peer (nil:
// nobody is trusted); the peer is parsed only when a header rule is reached.
func (c *Classifier) Classify(r *http.Request, t Trust) Class {
	if c == nil || len(c.rules) == 0 {
		return Default
	}
	method := policy.CanonicalMethod(r.Method)
	var folded, exact string // computed on first need
	trust := 0               // 0 not yet known, 1 trusted, -1 not
	for i := range c.rules {
		ru := &c.rules[i]
		if len(ru.methods) > 0 && !contains(ru.methods, method) {
			continue
		}
		if ru.prefix != "" {
			p := &folded
			if ru.sens {
				p = &exact
			}
			if *p == "" {
				*p, _ = policy.CanonicalPath(r.URL.Path, !ru.sens)
			}
			if !strings.HasPrefix(*p, ru.prefix) && (ru.bare == "" || *p != ru.bare) {
				continue
			}
		}
		ok := true
		for _, h := range ru.headers {
			if v := r.Header[h.name]; len(v) != 1 || v[0] != h.value {
				ok = false
				break
			}
		}
		if ok && len(ru.headers) > 0 {
			// The headers match: believe them only from a trusted peer (looked up once, and
			// only here: most requests carry no priority header and cost no address parse).
			if trust == 0 {
				trust = -1
				if t != nil && t.Trusted(policy.PeerAddr(r.RemoteAddr)) {
					trust = 1
				}
			}
			ok = trust > 0
		}
		if ok {
			return ru.class
		}
	}
	return Default
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// FromConfig builds the Limiter and Classifier of a validated protect block. now is the clock
// (nil: time.Now); m may be nil.
func FromConfig(p *policy.ProtectConfig, now func() time.Time, m *Metrics) (*Limiter, *Classifier, error) {
	o := Options{
		Adaptive:     p.Concurrency.Adaptive,
		Limit:        p.Concurrency.Limit,
		MinLimit:     p.Concurrency.MinLimit,
		MaxLimit:     p.Concurrency.MaxLimit,
		QueueTimeout: p.Concurrency.QueueTimeout,
		Now:          now,
		Metrics:      m,
	}
	for _, pr := range p.Priorities {
		if pr.Reserve > 0 {
			o.Reserves[ClassOf(pr.Name)] = pr.Reserve
		}
	}
	l, err := New(o)
	if err != nil {
		return nil, nil, err
	}
	return l, NewClassifier(p.Priorities), nil
}
