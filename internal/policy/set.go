package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// CompileOptions are the inputs of Compile besides the Config.
type CompileOptions struct {
	// Getenv reads the HS256 secret's variable. nil means os.Getenv. Read once, at compile time.
	Getenv func(string) string
	// Now is the clock for JWT exp and nbf checks. nil means time.Now.
	Now func() time.Time
}

// Set is a compiled, immutable policy set, built by Compile. It is safe for concurrent use;
// reload builds a new Set beside the running one and swaps it in. The zero Set plans nothing.
type Set struct {
	policies []*Policy
	rules    []rule // rules[i] compiles policies[i]
	headers  Headers
	trusted  []netip.Prefix

	userHeader   string            // canonical name; "" when users come from JWT or nowhere
	apiKeyHeader string            // canonical name of identity.api_key_header
	jwt          *verifier         // nil without identity.jwt
	needIP       bool              // some policy is keyed by ip
	kinds        []kindSource      // the distinct key kinds of the policies, global excepted
	ipv6Bits     int               // identity.ipv6_prefix: leading bits of an IPv6 client that key it
	tls          *TLSMaterial      // the tls block's files as loaded; nil without one
	rls          *envoyrules.Rules // rls.config_dir compiled; nil without an rls block

	// What the upstream must receive exactly as judged (see judgeHeaders).
	idHeaders     []string     // canonical names of the api_key and header:NAME keys of the policies
	names         []judgedName // idHeaders, the user header and the override headers
	nameLens      uint64       // bit n: some name of names has n bytes
	stripOverride bool         // method_override: strip
	anySensitive  bool         // some matcher has path_case_sensitive
}

// kindSource is one key kind that the set's policies use, for Plan.Identity.
type kindSource struct {
	name   string // Policy.KeyKind
	kind   keyKind
	header string // canonical header name of api_key and header kinds
}

// rule is the request-time side of one policy.
type rule struct {
	pol     *Policy
	kind    keyKind
	header  string      // canonical header name for api_key and header:NAME keys
	methods methodSet   // 0: any method
	path    pathMatcher // match.path_prefix; empty: any path
	costs   []costRule  // costs by route, first match wins; the policy's Cost otherwise
	// keyPrefix is `name 0x00 algorithm 0x00 key-kind 0x00`: the bucket key hashes it before
	// the value, so two policies never share a bucket.
	keyPrefix []byte
	// globalKey is the bucket key of a global policy, whose key value is always empty: hashed
	// once here rather than on every request.
	globalKey bucket.Key
	hashed    map[[sha256.Size]byte]*override // sha256 overrides; nil when there are none
	cidrs     []cidrOverride                  // ip overrides, most specific prefix first
	keys      *keyCache                       // the values seen last; nil for a global rule
}

// override is one compiled override: no charge at all, or another limit.
type override struct {
	unlimited bool
	limit     bucket.Limit
}

type cidrOverride struct {
	prefix netip.Prefix
	o      *override
}

// Compile validates cfg (returning its Errors) and builds the immutable Set. cfg is not
// retained or modified.
func Compile(cfg *Config, opts CompileOptions) (*Set, error) {
	errs, keys, tlsm, rlsRules := cfg.check(opts.Getenv)
	cfg.locate(errs)
	if err := errs.err(); err != nil {
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	s := &Set{headers: Headers{Reset: ResetUnix, IETF: cfg.Headers.IETFDraft}, ipv6Bits: cfg.Identity.IPv6Prefix, tls: tlsm, rls: rlsRules}
	if cfg.Headers.Reset == "delta" {
		s.headers.Reset = ResetDelta
	}
	for _, tp := range cfg.TrustedProxies {
		p, _ := parsePrefix(tp) // validated
		s.trusted = append(s.trusted, p)
	}
	switch id := cfg.Identity; {
	case id.JWT != nil:
		s.jwt = newVerifier(id.JWT, keys, now)
	case id.UserHeader != "":
		s.userHeader = http.CanonicalHeaderKey(id.UserHeader)
	}
	apiKeyHeader := http.CanonicalHeaderKey(cfg.Identity.APIKeyHeader)
	s.apiKeyHeader = apiKeyHeader

	s.policies = make([]*Policy, len(cfg.Policies))
	s.rules = make([]rule, len(cfg.Policies))
	for i := range cfg.Policies {
		pc := &cfg.Policies[i]
		alg := algorithms[pc.Algorithm]
		kind, hdr, _ := parseKey(pc.Key)
		pol := &Policy{
			Name:    pc.Name,
			Index:   i,
			Shadow:  pc.Mode == modeShadow,
			KeyKind: kindName(kind, hdr),
			Limit:   limitOf(alg, pc, pc.fields()),
			Cost:    max(pc.Cost, 1),
		}
		if pc.ChargeOn != nil {
			pol.ChargeOn, _ = ParseStatusSet(pc.ChargeOn) // validated
		}
		if l := pc.Lease; l != nil && l.Enabled {
			pol.Lease = bucket.Lease{Shards: max(l.Shards, 1), TTL: l.TTL}
		}
		pol.Summary = summary(pc)
		pol.IETFPolicy = ietfPolicy(pol)
		ru := rule{
			pol:       pol,
			kind:      kind,
			methods:   methodsOf(pc.Match.Methods),
			costs:     costRules(pc.Costs, pc.Match.PathCaseSensitive),
			path:      newPathMatcher(pc.Match.PathPrefix, pc.Match.PathCaseSensitive),
			keyPrefix: keyPrefix(cfg, pc, alg, kind, hdr),
		}
		if kind == keyGlobal {
			sum := digest(ru.keyPrefix, "")
			copy(ru.globalKey[:], sum[:])
		} else {
			ru.keys = newKeyCache()
		}
		switch kind {
		case keyAPIKey:
			ru.header = apiKeyHeader
		case keyHeader:
			ru.header = http.CanonicalHeaderKey(hdr)
		case keyIP:
			s.needIP = true
		}
		for j := range pc.Overrides {
			oc := &pc.Overrides[j]
			o := &override{unlimited: oc.Unlimited}
			if !o.unlimited {
				o.limit = limitOf(alg, pc, effective(pc, oc))
			}
			if h, ok := strings.CutPrefix(oc.Key, "sha256:"); ok && isSHA256Key(oc.Key) {
				var sum [sha256.Size]byte
				_, _ = hex.Decode(sum[:], []byte(h)) // validated: 64 hex digits
				if ru.hashed == nil {
					ru.hashed = make(map[[sha256.Size]byte]*override)
				}
				ru.hashed[sum] = o
				continue
			}
			p, _ := parsePrefix(oc.Key) // validated: ip policies only
			ru.cidrs = append(ru.cidrs, cidrOverride{prefix: p, o: o})
		}
		slices.SortStableFunc(ru.cidrs, func(a, b cidrOverride) int { return cmp.Compare(b.prefix.Bits(), a.prefix.Bits()) })
		s.policies[i] = pol
		s.rules[i] = ru
		if kind != keyGlobal && !slices.ContainsFunc(s.kinds, func(k kindSource) bool { return k.name == pol.KeyKind }) {
			s.kinds = append(s.kinds, kindSource{name: pol.KeyKind, kind: kind, header: ru.header})
		}
		if ru.header != "" && !slices.Contains(s.idHeaders, ru.header) {
			s.idHeaders = append(s.idHeaders, ru.header)
		}
		if pc.Match.PathCaseSensitive {
			s.anySensitive = true
		}
	}
	s.stripOverride = cfg.MethodOverride == MethodOverrideStrip
	s.judgedNames(s.userHeader)
	return s, nil
}

// costRule is one compiled entry of a policy's costs.
type costRule struct {
	methods methodSet   // 0: any method
	path    pathMatcher // empty: any path
	cost    int64
}

// costRules compiles a policy's costs; their paths follow the policy's path_case_sensitive.
func costRules(cs []CostConfig, sensitive bool) []costRule {
	var out []costRule
	for _, c := range cs {
		out = append(out, costRule{methods: methodsOf(c.Methods), path: newPathMatcher(c.PathPrefix, sensitive), cost: c.Cost})
	}
	return out
}

// cost is what a request spends of the rule's policy: the first cost entry that matches, else
// the policy's cost. A request judged by several methods (method_override judge) spends the
// most that any one of them would.
func (ru *rule) cost(rt *route) int64 {
	ms := rt.methods
	if ms&(ms-1) == 0 {
		return ru.costFor(ms, rt)
	}
	var c int64
	for ; ms != 0; ms &= ms - 1 {
		c = max(c, ru.costFor(ms&-ms, rt))
	}
	return c
}

func (ru *rule) costFor(m methodSet, rt *route) int64 {
	for i := range ru.costs {
		c := &ru.costs[i]
		if (c.methods == 0 || c.methods&m != 0) && c.path.match(rt) {
			return c.cost
		}
	}
	return ru.pol.Cost
}

// matchMethods is the methods a policy matches: those listed and, when GET is, also HEAD.
// net/http (and so every Go upstream, and most others) answers HEAD with the GET handler, so a
// GET-only policy that let HEAD through would let a client run the same handler unlimited.
func matchMethods(listed []string) []string {
	ms := slices.Clone(listed)
	if slices.Contains(ms, http.MethodGet) && !slices.Contains(ms, http.MethodHead) {
		ms = append(ms, http.MethodHead)
	}
	return ms
}

// limitOf builds the bucket limit of policy pc (or of one of its overrides) from validated
// fields f; a quota takes its calendar from the policy.
func limitOf(alg bucket.Algorithm, pc *PolicyConfig, f limitFields) bucket.Limit {
	switch {
	case isBucket(alg):
		r, _ := ParseRate(f.rate)
		return bucket.Limit{Algorithm: alg, Rate: r, Burst: f.burst}
	case alg == bucket.Quota:
		zone, _ := limitterms.LoadZone(pc.TimeZone) // validated
		return bucket.Limit{Algorithm: alg, Count: f.limit, Period: periods[pc.Period], Offset: uint8(pc.Offset), Zone: zone}
	}
	return bucket.Limit{Algorithm: alg, Count: f.limit, Window: f.window}
}

// kindName is the key kind as hashed into bucket keys; header names are folded to lower case so
// that respelling a header's case in the file keeps its buckets.
func kindName(kind keyKind, header string) string {
	switch kind {
	case keyIP:
		return "ip"
	case keyAPIKey:
		return "api_key"
	case keyUser:
		return "user"
	case keyGlobal:
		return "global"
	}
	return "header:" + strings.ToLower(header)
}

// namespace is store.dynamodb.namespace: it scopes the bucket keys of the policies without a
// pool, and of the Envoy rules. "" when unset.
func namespace(cfg *Config) string {
	if d := cfg.Store.DynamoDB; d != nil {
		return d.Namespace
	}
	return ""
}

// keyPrefix is what a policy's bucket keys hash before the key value. A quota's also holds its
// calendar (period, zone, offset): periods of another calendar are other periods, and state
// counted in one (its End is a period end) must not be read as the other's.
func keyPrefix(cfg *Config, pc *PolicyConfig, alg bucket.Algorithm, kind keyKind, header string) []byte {
	name := limitterms.StoreName(namespace(cfg), pc.Name, pc.Pool)
	b := make([]byte, 0, len(name)+len(header)+32)
	b = append(b, name...)
	b = append(b, 0)
	b = append(b, limitterms.AlgorithmName(alg)...)
	b = append(b, 0)
	b = append(b, kindName(kind, header)...)
	if alg == bucket.Quota {
		zone := pc.TimeZone
		if zone == "" {
			zone = "UTC"
		}
		b = append(b, 0)
		b = append(b, pc.Period+"/"+zone+"/"+strconv.Itoa(pc.Offset)...)
	}
	return append(b, 0)
}

// RLS returns the compiled rls.config_dir rules, or nil without an rls block.
func (s *Set) RLS() *envoyrules.Rules { return s.rls }

// Headers returns the response-header settings.
func (s *Set) Headers() Headers { return s.headers }

// TLS returns the certificate and client CAs loaded from the tls block when the set was
// compiled (so a reload re-reads them), or nil without a tls block.
func (s *Set) TLS() *TLSMaterial { return s.tls }

// Policies returns the compiled policies in evaluation order. Callers must not modify them.
func (s *Set) Policies() []*Policy { return s.policies }

// Trusted reports whether peer is one of trusted_proxies, whose forwarding headers are believed.
func (s *Set) Trusted(peer netip.Addr) bool {
	peer = peer.WithZone("").Unmap()
	for _, p := range s.trusted {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}
