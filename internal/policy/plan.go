package policy

// This file plans a request: it matches the request's route and headers against the compiled
// rules and lists the buckets to charge.

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

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
	case authorityPath(reqPath) || authorityPath(rt.folded):
		// The canonical form too: "/\n;/" loses its ";" parameter and becomes "/\n/", which a
		// WHATWG parser reads as "//"; a request and its canonical form are refused alike.
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
		// The charge is built in its slot of p.Charges: a Charge is large, and building it
		// apart cost two copies of it per policy.
		p.Charges = append(p.Charges, bucket.Charge{})
		c := &p.Charges[len(p.Charges)-1]
		var ok bool
		var v string
		switch ru.kind {
		case keyIP:
			ok = chargeInto(c, ru, ipText, client)
		case keyGlobal:
			ok = chargeInto(c, ru, "", client)
		case keyUser:
			v = user
			ok = chargeInto(c, ru, v, client)
		default:
			v = src.header(ru.header)
			ok = chargeInto(c, ru, v, client)
		}
		if !ok {
			p.Charges = p.Charges[:len(p.Charges)-1]
			continue
		}
		if ru.costs != nil {
			c.Cost = ru.cost(rt)
		}
		p.Policies = append(p.Policies, ru.pol)
		p.Values = append(p.Values, v)
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
	var c bucket.Charge
	ok := chargeInto(&c, ru, v, client)
	return c, ok
}

// chargeInto is charge writing into c, which it leaves unspecified when it returns false.
func chargeInto[V string | []byte](c *bucket.Charge, ru *rule, v V, client netip.Addr) bool {
	if len(v) == 0 && ru.kind != keyGlobal && ru.kind != keyIP {
		return false
	}
	lim := ru.pol.Limit
	key := ru.globalKey
	o := cidrOverrideOf(ru, client)
	if ru.kind != keyGlobal && (o == nil || !o.unlimited) {
		var hashed *override
		key, hashed = cachedKey(ru, v)
		if o == nil {
			o = hashed
		}
	}
	if o != nil {
		if o.unlimited {
			return false
		}
		lim = o.limit
	}
	*c = bucket.Charge{Key: key, Limit: lim, Shadow: ru.pol.Shadow, Cost: ru.pol.Cost, MayGiveBack: ru.pol.ChargeOn != nil, Lease: ru.pol.Lease,
		Pool: ru.pol.Name}
	return true
}

// cidrOverrideOf finds the CIDR override containing the client (ip policies, most specific
// first). It wins over a sha256 override of the raw value (see cachedKey), which a global rule
// cannot have.
func cidrOverrideOf(ru *rule, client netip.Addr) *override {
	for _, c := range ru.cidrs {
		if c.prefix.Contains(client) {
			return c.o
		}
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

// PeerAddr is peerAddr, for the other judges of a request's peer (the upstream protection's
// priorities).
func PeerAddr(remote string) netip.Addr { return peerAddr(remote) }

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
