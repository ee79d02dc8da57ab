package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
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

	userHeader   string       // canonical name; "" when users come from JWT or nowhere
	apiKeyHeader string       // canonical name of identity.api_key_header
	jwt          *verifier    // nil without identity.jwt
	needIP       bool         // some policy is keyed by ip
	kinds        []kindSource // the distinct key kinds of the policies, global excepted
	ipv6Bits     int          // identity.ipv6_prefix: leading bits of an IPv6 client that key it
	tls          *TLSMaterial // the tls block's files as loaded; nil without one
	rls          *RLSRules    // rls.config_dir compiled; nil without an rls block

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
		zone, _ := loadZone(pc.TimeZone) // validated
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

// storeName is the name a policy's bucket keys are derived from: its pool, or its name within
// the store's namespace. The prefixes keep the three apart (a policy name never starts with a
// control byte) and leave the keys of a policy without namespace or pool as they always were.
func storeName(cfg *Config, pc *PolicyConfig) string {
	if pc.Pool != "" {
		return "\x02pool\x00" + pc.Pool
	}
	if d := cfg.Store.DynamoDB; d != nil && d.Namespace != "" {
		return "\x01ns\x00" + d.Namespace + "\x00" + pc.Name
	}
	return pc.Name
}

// keyPrefix is what a policy's bucket keys hash before the key value. A quota's also holds its
// calendar (period, zone, offset): periods of another calendar are other periods, and state
// counted in one (its End is a period end) must not be read as the other's.
func keyPrefix(cfg *Config, pc *PolicyConfig, alg bucket.Algorithm, kind keyKind, header string) []byte {
	name := storeName(cfg, pc)
	b := make([]byte, 0, len(name)+len(header)+32)
	b = append(b, name...)
	b = append(b, 0)
	b = append(b, algorithmName[alg]...)
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
		fmt.Fprintf(&b, " limit=%d window=%s", pc.Limit, shortDuration(pc.Window))
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
			b.WriteString(" ttl=" + shortDuration(l.TTL))
		}
		b.WriteString(")")
	}
	return b.String()
}

// shortDuration drops the zero tails of time.Duration.String: 1m rather than 1m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// ietfPolicy is the RateLimit-Policy item: quota q over w seconds. A bucket's quota is its burst,
// refilled in burst/rate seconds. A concurrency limit's quota is its requests in flight, in the
// draft's quota unit concurrent-requests, with no window.
func ietfPolicy(p *Policy) string {
	if p.Limit.Algorithm == bucket.Concurrency {
		return `"` + p.Name + `";q=` + strconv.FormatInt(p.Limit.Count, 10) + `;qu="concurrent-requests"`
	}
	q, w := p.Limit.Count, ceilSeconds(p.Limit.Window.Seconds())
	switch {
	case isBucket(p.Limit.Algorithm):
		q, w = p.Limit.Burst, ceilSeconds(float64(p.Limit.Burst)/p.Limit.Rate)
	case p.Limit.Algorithm == bucket.Quota:
		w = int64(p.Limit.Period.Nominal() / time.Second)
	}
	return `"` + p.Name + `";q=` + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(w, 10)
}

// Plan fills p with the charges for r.
//
// Identity. With identity.jwt configured every request that carries `Authorization: Bearer` is
// verified, whichever policies match, so a bad token is refused the same way on every path; a
// request with several Authorization lines of which any is Bearer is refused too (ambiguous
// credentials: the upstream might act on another line than the one verified). A token in an
// access_token query parameter (RFC 6750 §2.3) is verified as the header's would be, and one
// beside the header's, or a second one, is refused (see queryToken). With
// identity.user_header the header is read only when trusted_proxies is empty or the request's
// TCP peer (RemoteAddr) is one of them: from another peer the request has no user, exactly as
// without the header, and p.StripUnjudged removes the header before forwarding.
//
// The upstream gets what was judged. An identity header (the api_key header and the header of
// every header:NAME key of the set, the user header when it is read) sent on several lines is
// one value when the lines are equal (p.StripUnjudged leaves one line), and otherwise refused:
// upstreams disagree on which line they read (Go's Header.Get and Java's getHeader the first,
// Node and WSGI servers join them). Headers that CGI-style servers read as an identity or
// method-override header (X_Api_Key for X-Api-Key) are removed by p.StripUnjudged.
//
// Errors. When the bearer token fails verification (or is ambiguous), Plan returns an error
// wrapping ErrUnauthorized; when the request cannot be judged unambiguously (an identity header
// with conflicting values, a path with a "." or ".." segment), one wrapping ErrBadRequest (a
// *RequestError). Either way it leaves in p the charges, and Policies entries, of the
// request's matching ip policies only. The caller takes those charges and answers 429 when they
// are over their limit, else 401 or 400: so a flood of garbage tokens is still held by the ip
// limits, while the api_key, user, header and global pools, which legitimate traffic shares,
// are not drained by requests that never reach the upstream. On any other error p is empty.
//
// Matching. A request matches a policy by its canonical method and path (see CanonicalMethod
// and CanonicalPath; docs/algorithms.md): methods case-insensitively, and with
// method_override judge also by the methods its override headers name (each policy charged
// at most once); paths case-insensitively unless the policy has path_case_sensitive, without
// `;` parameters and repeated slashes, and a path_prefix ending in '/' also matches the path
// without it. Policies whose match fails, or whose key the request lacks (no API key, no user,
// an empty header), are skipped; ip and global keys are always present. An unlimited override
// skips its policy. A policy whose match.methods lists GET also matches HEAD (see
// matchMethods).
//
// Key values. A key's raw value, hashed into the bucket key and compared with sha256
// overrides, is the header value as received, the user id, or for ip keys: an IPv4 client's
// address text (192.0.2.1; IPv4-mapped IPv6 clients are IPv4 ones), an IPv6 client's prefix of
// identity.ipv6_prefix bits in netip.Prefix text form (2001:db8:1:2::/64), or its address text
// (2001:db8::1) when ipv6_prefix is 128. CIDR overrides still match the full client address. A
// request whose RemoteAddr is no address (a Unix socket) has the empty ip value, so all such
// requests share one ip bucket.
//
// Plan does not allocate for ip, api_key, global and header keys when p has capacity (a Plan
// reused for many requests), except for key values longer than about 200 bytes.
func (s *Set) Plan(r *http.Request, p *Plan) error {
	p.Reset()
	var peer netip.Addr
	if s.needIP || (s.userHeader != "" && len(s.trusted) > 0) {
		peer = peerAddr(r.RemoteAddr)
	}
	reqPath := ""
	if r.URL != nil {
		reqPath = r.URL.Path
	}
	// With trusted_proxies set, only they may speak for a user: a client that reaches the
	// gateway directly would otherwise pick its own user id (rotating it to escape its limit,
	// or naming someone else to drain theirs).
	readUser := s.userHeader != "" && (len(s.trusted) == 0 || s.Trusted(peer))
	overrides, bad := s.scanHeaders(r.Header, readUser, p)
	rt, err := s.route(r.Method, reqPath, overrides, p)
	if bad == nil {
		bad = err
	}
	var user string
	var authErr error // non-nil: only ip policies charge, and Plan returns ErrUnauthorized
	switch {
	case bad != nil:
	case s.jwt != nil:
		tok, ok, err := bearerLines(r.Header["Authorization"])
		if err == nil && r.URL != nil {
			tok, ok, err = queryToken(r.URL.RawQuery, tok, ok)
		}
		switch {
		case err != nil:
			authErr = err
		case ok:
			user, authErr = s.jwt.user(tok)
		}
	case readUser:
		user = headerValue(r.Header, s.userHeader)
	}

	var client netip.Addr
	var ipBuf [64]byte
	var ipText []byte
	if s.needIP {
		client = ClientIP(peer, r.Header, s.Trusted)
		ipText = s.appendIPKey(ipBuf[:0], client)
	}
	planRules(s, httpSource{r.Header}, &rt, ipText, client, user, bad != nil || authErr != nil, p)
	if bad != nil {
		return bad
	}
	if authErr != nil {
		return fmt.Errorf("%w: %w", ErrUnauthorized, authErr)
	}
	return nil
}

// route canonicalizes the request's method and path for matching, writing into p's buffer;
// overrides are the methods the override headers name (see scanHeaders). It returns
// errDotSegments for a path with a "." or ".." segment (its route is then the resolved path's,
// for the ip policies).
func (s *Set) route(method, reqPath string, overrides methodSet, p *Plan) (route, error) {
	rt := route{methods: methodBit(method) | overrides}
	var dots bool
	rt.folded, dots = canonInto(&p.route, reqPath, true)
	if s.anySensitive {
		rt.exact, _ = canonInto(&p.route, reqPath, false)
	}
	switch {
	case authorityPath(reqPath):
		return rt, errAuthorityPath
	case dots:
		return rt, errDotSegments
	}
	return rt, nil
}

// Kinds of the header names scanHeaders looks for.
const (
	nameIdentity uint8 = iota + 1 // api_key or header:NAME key
	nameUser                      // identity.user_header
	nameOverride                  // a method-override header
)

// judgedName is a header name that scanHeaders looks for.
type judgedName struct {
	name       string // canonical
	kind       uint8
	underscore bool // name has a '_': its dashed spellings are the same CGI variable
}

// judgedNames lists the names scanHeaders looks for, and the set of their lengths (bit n: some
// name has n bytes), which rules out most of a request's headers at the cost of a shift.
func (s *Set) judgedNames(userHeader string) {
	add := func(name string, kind uint8) {
		s.names = append(s.names, judgedName{name: name, kind: kind, underscore: strings.IndexByte(name, '_') >= 0})
		if len(name) < 64 {
			s.nameLens |= 1 << len(name)
		}
	}
	for _, h := range s.idHeaders {
		add(h, nameIdentity)
	}
	if userHeader != "" {
		add(userHeader, nameUser)
	}
	for _, h := range overrideHeaders {
		add(h, nameOverride)
	}
}

// scanHeaders walks the request's headers once (a walk costs less than a lookup per name) and
// judges those the upstream could act on (see Plan): it refuses an identity header sent with
// conflicting values and records in p what StripUnjudged must remove or reduce before
// forwarding: the user header when it is not read (readUser false: an untrusted peer), the
// override headers with method_override strip, and the underscore spellings of all these.
// With method_override judge it returns the methods the override headers name.
func (s *Set) scanHeaders(h http.Header, readUser bool, p *Plan) (overrides methodSet, err error) {
	for k, vs := range h {
		if len(k) >= 64 || s.nameLens&(1<<len(k)) == 0 {
			continue
		}
		for i := range s.names {
			n := &s.names[i]
			if len(n.name) != len(k) {
				continue
			}
			if k != n.name {
				// CGI-style servers (WSGI, PHP, Rack) read X_Api_Key as HTTP_X_API_KEY, as
				// they read X-Api-Key: a spelling with underscores would carry an identity
				// (or a method) past the judge, and so would the dashed spelling of a name
				// configured with underscores (X-Tenant for X_Tenant). Whichever spelling is
				// configured is judged; the others are removed. Net/http folds neither.
				if (n.underscore || strings.IndexByte(k, '_') >= 0) && sameCGIName(k, n.name) && !s.isName(k) {
					p.strip = append(p.strip, k)
					break
				}
				continue
			}
			switch {
			case n.kind == nameOverride && s.stripOverride, n.kind == nameUser && !readUser:
				p.strip = append(p.strip, k)
			case n.kind == nameOverride:
				overrides |= overrideMethods(vs)
			default:
				if e := judgeLines(k, vs, p); e != nil && err == nil {
					err = e
				}
			}
			break
		}
	}
	return overrides, err
}

// isName reports whether k is one of the judged names itself.
func (s *Set) isName(k string) bool {
	for i := range s.names {
		if s.names[i].name == k {
			return true
		}
	}
	return false
}

// sameCGIName reports whether header names a and b are the same CGI variable: equal when
// case is ignored and '_' is '-'.
func sameCGIName(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x == '_' {
			x = '-'
		}
		if y == '_' {
			y = '-'
		}
		if x != y && lowerASCII(x) != lowerASCII(y) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// judgeLines accepts a header sent on several equal lines (StripUnjudged keeps one) and
// refuses one whose lines differ.
func judgeLines(name string, vs []string, p *Plan) error {
	if len(vs) < 2 {
		return nil
	}
	for _, v := range vs[1:] {
		if v != vs[0] {
			return &RequestError{Header: name}
		}
	}
	p.dedupe = append(p.dedupe, name)
	return nil
}

// keySource gives the api_key and header:NAME key values of one request (canonical names).
type keySource interface {
	header(canonical string) string
}

// httpSource reads key values from request headers.
type httpSource struct{ h http.Header }

func (s httpSource) header(canonical string) string {
	v := headerValue(s.h, canonical)
	if isCredentialHeader(canonical) {
		return normalCredential(v) // one key however the scheme and spaces are spelled
	}
	return v
}

// planRules appends to p the charge of every rule that matches, in order. ipOnly keeps the ip
// policies only (a bearer token failed verification). It is generic so that each source's
// header method is a direct call.
func planRules[S keySource](s *Set, src S, rt *route, ipText []byte, client netip.Addr, user string, ipOnly bool, p *Plan) {
	if s.needIP {
		p.setIP(ipText)
	}
	for i := range s.rules {
		ru := &s.rules[i]
		if ipOnly && ru.kind != keyIP {
			continue
		}
		if !ru.matches(rt) {
			continue
		}
		var c bucket.Charge
		var ok bool
		var v string
		switch ru.kind {
		case keyIP:
			c, ok = charge(ru, ipText, client)
		case keyGlobal:
			c, ok = charge(ru, "", client)
		case keyUser:
			v = user
			c, ok = charge(ru, v, client)
		default:
			v = src.header(ru.header)
			c, ok = charge(ru, v, client)
		}
		if ok {
			if ru.costs != nil {
				c.Cost = ru.cost(rt)
			}
			p.Charges = append(p.Charges, c)
			p.Policies = append(p.Policies, ru.pol)
			p.Values = append(p.Values, v)
		}
	}
	if !p.WantIdentity {
		return
	}
	for _, k := range s.kinds {
		var v string
		switch k.kind {
		case keyIP:
			p.Identity = append(p.Identity, KindValue{Kind: k.name})
			continue
		case keyUser:
			v = user
		default:
			v = src.header(k.header)
		}
		if v != "" {
			p.Identity = append(p.Identity, KindValue{Kind: k.name, Value: v})
		}
	}
}

// Fields is a request as an access log line describes it, for PlanFields: the values that Plan
// would take from an *http.Request, already resolved (no forwarding headers, no token to
// verify).
type Fields struct {
	Method, Path string
	// Client is the client's address when the log has one: CIDR overrides match it and, when
	// IP is empty, the ip key value is made from it as Plan makes it (identity.ipv6_prefix).
	Client netip.Addr
	// IP is the ip key value itself, when the log holds that instead of an address (the
	// gateway's access log holds its pseudonym). It wins over Client.
	IP string
	// APIKey, User and Headers are the key values of api_key, user and header:name policies;
	// Headers holds kind/value pairs, kind being a Policy.KeyKind such as "header:x-tenant".
	// An empty value means the request had none: the policy does not charge it.
	APIKey, User string
	Headers      []KindValue
}

// KindValue is one key value of a Fields.
type KindValue struct{ Kind, Value string }

// fieldsSource reads key values from Fields.
type fieldsSource struct {
	f         *Fields
	apiHeader string // the api_key policies' canonical header
}

func (s fieldsSource) header(canonical string) string {
	if canonical == s.apiHeader {
		return s.f.APIKey
	}
	for _, kv := range s.f.Headers {
		if len(kv.Kind) == len("header:")+len(canonical) && strings.EqualFold(kv.Kind[len("header:"):], canonical) {
			return kv.Value
		}
	}
	return ""
}

// PlanFields is Plan for a request known from its log line: the same matching, overrides and
// bucket keys, so that a replay decides exactly as the gateway would have. Key values of an
// ip policy come from f.IP, or from f.Client; an ip policy of a line with neither is charged
// with the empty value (one shared bucket), as Plan does for a peer that is no address. Log
// lines hold no method-override headers: the method alone is judged. A path with a "." or
// ".." segment charges its ip policies only, as the gateway did before refusing it. It does
// not allocate when p has capacity.
func (s *Set) PlanFields(f *Fields, p *Plan) {
	p.Reset()
	var ipBuf [64]byte
	var ipText []byte
	if s.needIP {
		if f.IP != "" {
			ipText = append(ipBuf[:0], f.IP...)
		} else if f.Client.IsValid() {
			ipText = s.appendIPKey(ipBuf[:0], f.Client.Unmap())
		}
	}
	rt, bad := s.route(f.Method, f.Path, 0, p)
	planRules(s, fieldsSource{f: f, apiHeader: s.apiKeyHeader}, &rt, ipText, f.Client.Unmap(), f.User, bad != nil, p)
}

// appendIPKey appends the ip key value of client: an IPv6 client is keyed by its prefix of
// ipv6Bits bits, because one subscriber holds a whole /64 (or more) and could rotate through
// 2^64 addresses, each a fresh bucket. ClientIP has unmapped IPv4-mapped addresses, so they
// are keyed as IPv4, per address. Neither branch allocates.
func (s *Set) appendIPKey(b []byte, client netip.Addr) []byte {
	if client.Is6() && !client.Is4In6() && s.ipv6Bits < 128 {
		if pfx, err := client.WithZone("").Prefix(s.ipv6Bits); err == nil {
			return pfx.AppendTo(b)
		}
	}
	return client.AppendTo(b)
}

// charge builds the charge of one policy for the key value v. ok is false when the request lacks
// the key or an unlimited override exempts it.
func charge[V string | []byte](ru *rule, v V, client netip.Addr) (bucket.Charge, bool) {
	if len(v) == 0 && ru.kind != keyGlobal && ru.kind != keyIP {
		return bucket.Charge{}, false
	}
	lim := ru.pol.Limit
	if o := findOverride(ru, v, client); o != nil {
		if o.unlimited {
			return bucket.Charge{}, false
		}
		lim = o.limit
	}
	key := ru.globalKey
	if ru.kind != keyGlobal {
		sum := digest(ru.keyPrefix, v)
		copy(key[:], sum[:])
	}
	return bucket.Charge{Key: key, Limit: lim, Shadow: ru.pol.Shadow, Cost: ru.pol.Cost, Refundable: ru.pol.ChargeOn != nil, Lease: ru.pol.Lease,
		Pool: ru.pol.Name}, true
}

// findOverride finds the override for a key value: a CIDR containing the client (ip policies,
// most specific first), else a sha256 override of the raw value, hashed only for policies that
// have such overrides.
func findOverride[V string | []byte](ru *rule, v V, client netip.Addr) *override {
	for _, c := range ru.cidrs {
		if c.prefix.Contains(client) {
			return c.o
		}
	}
	if ru.hashed != nil {
		return ru.hashed[digest(nil, v)]
	}
	return nil
}

// digest is SHA-256(prefix || v) over a stack buffer, so that hashing allocates nothing.
func digest[V string | []byte](prefix []byte, v V) [sha256.Size]byte {
	var buf [256]byte
	b := append(buf[:0], prefix...)
	b = append(b, v...)
	return sha256.Sum256(b)
}

func (ru *rule) matches(rt *route) bool {
	return (ru.methods == 0 || ru.methods&rt.methods != 0) && ru.path.match(rt)
}

// headerValue is the value of a header, by canonical name: its first line. Plan has refused a
// request whose identity header has lines that differ, so the first is every line.
func headerValue(h http.Header, canonical string) string {
	if vs := h[canonical]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// peerAddr parses http.Request.RemoteAddr. A RemoteAddr that is no address (a Unix socket) gives
// the zero Addr, and all such requests share one ip bucket.
func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().WithZone("").Unmap()
	}
	if a, err := netip.ParseAddr(remote); err == nil {
		return a.WithZone("").Unmap()
	}
	return netip.Addr{}
}

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
