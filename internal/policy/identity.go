package policy

import (
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// ClientIP returns the address of the client that sent a request which reached us from peer.
//
// Forwarding headers are believed only when peer is trusted; from any other peer they are
// ignored and peer is the client. From a trusted peer, the X-Forwarded-For addresses (all header
// lines, comma lists) are walked from the right, skipping trusted addresses: the first
// untrusted one is the client, and when every address is trusted the left-most is. Without an
// X-Forwarded-For header, the `for=` parameters of Forwarded (RFC 7239) are walked the same way.
//
// An entry that is not an address (garbage, an empty `for=`, and also Forwarded's obfuscated
// identifiers such as `_hidden` and `unknown`) stops the walk and the last good address walked
// (the nearest trusted hop, or peer) is the client. Skipping such an entry instead would hand the
// choice to whatever the client wrote further left, which is how forwarding headers are
// spoofed. Ports (`1.2.3.4:80`, `"[2001:db8::1]:80"`) and zones are dropped; IPv4-mapped IPv6
// addresses are unmapped. ClientIP does not allocate for addresses without a zone.
func ClientIP(peer netip.Addr, h http.Header, trusted func(netip.Addr) bool) netip.Addr {
	peer = peer.Unmap()
	if !peer.IsValid() || trusted == nil || !trusted(peer) {
		return peer
	}
	w := chainWalk{trusted: trusted}
	if lines := h["X-Forwarded-For"]; len(lines) > 0 {
		for _, line := range lines {
			for line != "" {
				var elem string
				elem, line, _ = strings.Cut(line, ",")
				if elem = trimOWS(elem); elem != "" {
					w.step(parseForwardedAddr(elem))
				}
			}
		}
		return w.result(peer)
	}
	for _, line := range h["Forwarded"] {
		for line != "" {
			var forVal string
			var status elemStatus
			forVal, status, line = nextForwardedElement(line)
			switch status {
			case elemEmpty:
			case elemFor:
				w.step(parseForwardedAddr(forVal))
			default:
				w.step(netip.Addr{}, false)
			}
		}
	}
	return w.result(peer)
}

// chainWalk finds, in one left-to-right pass without storing the list, what a right-to-left walk
// finds: the right-most entry that is malformed or untrusted stops it.
type chainWalk struct {
	trusted   func(netip.Addr) bool
	n         int
	first     netip.Addr // left-most entry (answer when all are trusted)
	stopped   bool       // some entry stops a right-to-left walk
	stopAddr  netip.Addr // the right-most stop when it is an untrusted address
	stopBad   bool       // the right-most stop is malformed
	afterStop netip.Addr // the entry right of the right-most stop (the last good one)
	needAfter bool
}

func (w *chainWalk) step(a netip.Addr, ok bool) {
	w.n++
	if w.n == 1 {
		w.first = a
	}
	if !ok || !w.trusted(a) {
		w.stopped, w.stopBad, w.stopAddr, w.needAfter = true, !ok, a, true
		return
	}
	if w.needAfter {
		w.afterStop, w.needAfter = a, false
	}
}

func (w *chainWalk) result(peer netip.Addr) netip.Addr {
	switch {
	case w.n == 0:
		return peer
	case !w.stopped:
		return w.first
	case !w.stopBad:
		return w.stopAddr
	case w.needAfter:
		// The right-most entry itself is malformed: nothing good was walked.
		return peer
	default:
		return w.afterStop
	}
}

// parseForwardedAddr reads one address: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`,
// `[2001:db8::1]` or `[2001:db8::1]:8080`.
func parseForwardedAddr(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		if rest := s[end+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, false
		}
		s = s[1:end]
		if strings.IndexByte(s, ':') < 0 {
			return netip.Addr{}, false // brackets are for IPv6 only
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 && strings.IndexByte(s, ':') == i {
		// One colon: IPv4 with a port. (IPv6 without brackets has two or more.)
		if !validPort(s[i+1:]) {
			return netip.Addr{}, false
		}
		s = s[:i]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	if a.Zone() != "" {
		a = a.WithZone("")
	}
	return a.Unmap(), true
}

// validPort accepts 1 to 5 digits, or an obfuscated port (RFC 7239 §6.3: "_" and token chars),
// which carries no information we use.
func validPort(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '_' {
		return true
	}
	return len(s) <= 5 && allDigits(s)
}

// elemStatus classifies one Forwarded element.
type elemStatus uint8

const (
	elemEmpty elemStatus = iota // nothing between two commas: skipped, as lists allow
	elemFor                     // carries a for= value (an address or not)
	elemBad                     // malformed, or has no for=: not an address
)

// nextForwardedElement reads one element of a Forwarded line (RFC 7239 §4:
// `pair *( ";" pair )`, elements separated by commas, values tokens or quoted strings) and
// returns its for= value, unquoted, and the rest of the line. It does not allocate: a quoted
// value holding a backslash escape, which no address needs, is reported as malformed.
func nextForwardedElement(s string) (forVal string, status elemStatus, rest string) {
	status = elemEmpty
	i := 0
	bad := func() (string, elemStatus, string) {
		return "", elemBad, skipElement(s, i)
	}
	for {
		i = skipOWS(s, i)
		if i == len(s) {
			return forVal, status, ""
		}
		if s[i] == ',' {
			return forVal, status, s[i+1:]
		}
		if status == elemEmpty {
			status = elemBad // something is here; elemFor once a for= is read
		}
		start := i
		for i < len(s) && isTchar(s[i]) {
			i++
		}
		name := s[start:i]
		if name == "" || i == len(s) || s[i] != '=' {
			return bad()
		}
		i++
		var val string
		if i < len(s) && s[i] == '"' {
			end := i + 1
			for end < len(s) && s[end] != '"' && s[end] != '\\' {
				end++
			}
			if end == len(s) || s[end] != '"' {
				return bad()
			}
			val = s[i+1 : end]
			i = end + 1
		} else {
			start = i
			for i < len(s) && isTchar(s[i]) {
				i++
			}
			val = s[start:i]
		}
		if strings.EqualFold(name, "for") {
			if status == elemFor {
				return bad() // two for= in one element: which one is true?
			}
			forVal, status = val, elemFor
		}
		i = skipOWS(s, i)
		switch {
		case i == len(s):
			return forVal, status, ""
		case s[i] == ',':
			return forVal, status, s[i+1:]
		case s[i] == ';':
			i++
		default:
			return bad()
		}
	}
}

// skipElement returns what follows the next comma outside a quoted string at or after i.
func skipElement(s string, i int) string {
	quoted := false
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted && i+1 < len(s):
			i++
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			return s[i+1:]
		}
	}
	return ""
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

func trimOWS(s string) string { return strings.Trim(s, " \t") }

// isTchar reports RFC 9110 token characters.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', isDigit(c):
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// BearerToken returns the credentials of an `Authorization: Bearer <token>` header (the first
// Authorization line; the scheme is case-insensitive). ok is false when there is no
// Authorization header or its scheme is not Bearer: such a request simply has no user. When ok
// is true tok may still be empty or malformed; verification rejects it. Set.Plan does not stop
// at the first line: it refuses a request with several Authorization lines of which any is
// Bearer (see errAmbiguousBearer).
func BearerToken(h http.Header) (tok string, ok bool) {
	lines := h["Authorization"]
	if len(lines) == 0 {
		return "", false
	}
	return bearer(lines[0])
}

// errAmbiguousBearer refuses a request with several Authorization lines of which one or more
// is Bearer. Upstreams differ on which line they read (or join them), so a token verified here
// might not be the credential the upstream acts on; and a Basic line first would hide the
// Bearer one from the user policies.
var errAmbiguousBearer = errors.New("several Authorization lines with a Bearer one")

// bearerLines is BearerToken over all Authorization lines: ok when the only line is Bearer,
// errAmbiguousBearer when one of several is.
func bearerLines(lines []string) (tok string, ok bool, err error) {
	switch len(lines) {
	case 0:
		return "", false, nil
	case 1:
		tok, ok = bearer(lines[0])
		return tok, ok, nil
	}
	for _, l := range lines {
		if _, ok := bearer(l); ok {
			return "", false, errAmbiguousBearer
		}
	}
	return "", false, nil
}

// errAmbiguousToken refuses a request that carries a bearer token both in Authorization and in
// an access_token query parameter, or in several access_token parameters (RFC 6750 §2: a
// client must use one method; the upstream could act on the token that was not verified).
var errAmbiguousToken = errors.New("a bearer token in Authorization and in the query, or in several access_token parameters")

// queryToken adds RFC 6750's URI query parameter to the Authorization header's token (tok, ok):
// an upstream that accepts `?access_token=` would act on a token the gateway never verified,
// so one is verified like the header's, and a request with both, or with several, is refused.
// Every name that a mainstream framework reads as access_token counts as one (see
// isAccessTokenName: Access_Token, access.token, access+token, access[token, ...). A query
// that cannot name one (see mayNameToken) is not parsed and costs no allocation. Pairs that
// url.ParseQuery cannot parse (a ';' in them, a bad escape) are skipped: the reverse proxy
// drops them from the query it forwards too.
func queryToken(rawQuery, tok string, ok bool) (string, bool, error) {
	if !mayNameToken(rawQuery) {
		return tok, ok, nil
	}
	q, _ := url.ParseQuery(rawQuery) // what it could parse: see above
	var found []string
	for k, vs := range q {
		if isAccessTokenName(k) {
			found = append(found, vs...)
		}
	}
	switch {
	case len(found) == 0:
		return tok, ok, nil
	case len(found) > 1 || ok:
		return "", false, errAmbiguousToken
	}
	return found[0], true, nil
}

// bearer reads one Authorization line.
func bearer(line string) (tok string, ok bool) {
	v := trimOWS(line)
	const scheme = "bearer"
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	rest := v[len(scheme):]
	if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
		return "", false // "Bearerx": another scheme
	}
	return trimOWS(rest), true
}

// verifier checks bearer tokens and extracts the user claim. Immutable; safe for concurrent use.
type verifier struct {
	parser *jwt.Parser
	claim  string
	secret []byte
	rsa    *rsa.PublicKey
}

func newVerifier(j *JWTConfig, keys jwtKeys, now func() time.Time) *verifier {
	var algs []string
	if keys.secret != nil {
		algs = append(algs, jwt.SigningMethodHS256.Alg())
	}
	if keys.rsa != nil {
		algs = append(algs, jwt.SigningMethodRS256.Alg())
	}
	opts := []jwt.ParserOption{
		// Only the configured algorithms: this rejects alg "none" and an HS256 token signed
		// with the RSA public key's bytes (algorithm confusion).
		jwt.WithValidMethods(algs),
		jwt.WithTimeFunc(now),
		jwt.WithLeeway(j.Leeway),
		// jwt/v5 checks exp only when the token has one; a token without it would be valid
		// forever, and one leaked token a user id for good.
		jwt.WithExpirationRequired(),
		// Numbers as json.Number: a numeric user id keeps all its digits.
		jwt.WithJSONNumber(),
	}
	if j.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(j.Issuer))
	}
	if j.Audience != "" {
		opts = append(opts, jwt.WithAudience(j.Audience))
	}
	claim := j.Claim
	if claim == "" {
		claim = defaultClaim
	}
	return &verifier{parser: jwt.NewParser(opts...), claim: claim, secret: keys.secret, rsa: keys.rsa}
}

var errMissingClaim = errors.New("user claim missing or not a string or number")

// user verifies tok (signature, exp, which is required, nbf, iss, aud) and returns its user
// claim.
func (v *verifier) user(tok string) (string, error) {
	claims := jwt.MapClaims{}
	_, err := v.parser.ParseWithClaims(tok, claims, v.key)
	if err != nil {
		return "", err
	}
	switch c := claims[v.claim].(type) {
	case string:
		if c != "" {
			return c, nil
		}
	case json.Number:
		return c.String(), nil
	}
	return "", fmt.Errorf("claim %q: %w", v.claim, errMissingClaim)
}

// key picks the verification key by the token's method; WithValidMethods has already refused
// any method not configured, the type switch makes the pairing explicit.
func (v *verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if v.secret != nil {
			return v.secret, nil
		}
	case *jwt.SigningMethodRSA:
		if v.rsa != nil {
			return v.rsa, nil
		}
	}
	return nil, fmt.Errorf("unexpected signing method %q", t.Method.Alg())
}
