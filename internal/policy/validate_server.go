package policy

// This file checks the server's settings: the store, the clock, the upstream, the listeners,
// the header names and the JWT keys.

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
	"golang.org/x/net/http/httpguts"
)

// maxReplicas bounds store.replicas: beyond it every divided limit is 1 anyway.
const maxReplicas = 10_000

// checkStore checks the fields of the shared store and of on_error local.
func checkStore(es *Errors, st *StoreConfig) {
	rule, _ := bucket.ParseOnError(st.OnError) // a bad value is reported on its own
	switch r := st.Replicas; {
	case r == 0 && rule == bucket.Local:
		es.add("store.replicas", "", "required with store.on_error local: how many replicas share the limits")
	case r < 0 || r > maxReplicas:
		es.add("store.replicas", strconv.Itoa(r), fmt.Sprintf("must be from 1 to %d", maxReplicas))
	}
	checkRedis(es, st)
	d := st.DynamoDB
	if st.Backend != "dynamodb" {
		if d != nil && st.Backend != "dynamodb" {
			// A forgotten `backend: dynamodb` would enforce every limit per replica, silently.
			es.add("store.dynamodb", "", "set, but store.backend is "+st.Backend+": set store.backend: dynamodb, or remove the block")
		}
		return
	}
	if d == nil || d.Table == "" {
		es.add("store.dynamodb.table", "", "required when store.backend is dynamodb")
	}
	if d == nil {
		return
	}
	if d.Table != "" && !validTableName(d.Table) {
		es.add("store.dynamodb.table", d.Table, "must be 3 to 255 of A-Z a-z 0-9 _ . -")
	}
	if d.Endpoint != "" {
		u, err := url.Parse(d.Endpoint)
		switch {
		case err != nil, u.Scheme != "http" && u.Scheme != "https", u.Opaque != "", u.Host == "":
			es.add("store.dynamodb.endpoint", redactURL(d.Endpoint), "must be an http or https URL with a host, such as http://127.0.0.1:8000")
		case u.User != nil:
			es.add("store.dynamodb.endpoint", redactURL(d.Endpoint), "must not carry credentials: they come from the AWS chain")
		}
	}
	if d.Region != "" && !validRegion(d.Region) {
		es.add("store.dynamodb.region", d.Region, "must be an AWS region name such as ap-northeast-1")
	}
	switch d.Mode {
	case dynamoModeRefund, dynamoModeTransaction:
	default:
		es.add("store.dynamodb.mode", d.Mode, "must be refund or transaction")
	}
	if l := d.SlotLease; l < 3*time.Second || l > 10*time.Minute {
		// Renewed every third of it: much shorter would cost writes and make a slow
		// DynamoDB call lose a slot; much longer would keep a crashed replica's slots away.
		es.add("store.dynamodb.slot_lease", limitterms.ShortDuration(l), "must be from 3s to 10m")
	}
	if ns := d.Namespace; ns != "" && (len(ns) > limitterms.MaxNameLen || !limitterms.ValidName(ns)) {
		es.add("store.dynamodb.namespace", ns, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", limitterms.MaxNameLen))
	}
	checkClock(es, &d.Clock)
}

// checkClock checks store.dynamodb.clock. Below a millisecond is below what a round trip to
// DynamoDB can measure; above an hour is a clock no correction should trust.
func checkClock(es *Errors, c *ClockConfig) {
	inRange := func(d time.Duration) bool { return d >= time.Millisecond && d <= time.Hour }
	if !inRange(c.MaxCorrection) {
		es.add("store.dynamodb.clock.max_correction", limitterms.ShortDuration(c.MaxCorrection), "must be from 1ms to 1h")
	}
	if !inRange(c.WarnOffset) {
		es.add("store.dynamodb.clock.warn_offset", limitterms.ShortDuration(c.WarnOffset), "must be from 1ms to 1h")
	}
	if c.MaxOffset != 0 && !inRange(c.MaxOffset) {
		es.add("store.dynamodb.clock.max_offset", limitterms.ShortDuration(c.MaxOffset), "must be 0s (off) or from 1ms to 1h")
	}
}

// validTableName follows DynamoDB's naming rules for tables.
func validTableName(s string) bool {
	return len(s) >= 3 && len(s) <= 255 && limitterms.ValidName(s)
}

// validRegion accepts lower-case letters, digits and '-', as every AWS region name is; it
// catches a pasted endpoint or an availability-zone typo, not an unknown region.
func validRegion(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || isDigit(c) || c == '-') {
			return false
		}
	}
	return true
}

func checkUpstream(es *Errors, s string) {
	if s == "" {
		es.add("upstream", "", "required")
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil, u.Scheme != "http" && u.Scheme != "https", u.Opaque != "":
		es.add("upstream", redactURL(s), "must be an absolute http or https URL")
	case u.Host == "":
		es.add("upstream", redactURL(s), "must name a host")
	case u.User != nil:
		// Credentials in a URL end up in logs and in `validate` output; so would this message
		// if it quoted them.
		es.add("upstream", redactURL(s), "must not carry credentials")
	}
}

// redactURL is a URL as an error message may quote it: url.URL.Redacted masks the password,
// and a user name without a password is masked as well, because that is where a bare token
// goes (https://TOKEN@host). A text that does not parse as a URL with an authority (a
// malformed escape, or a forgotten scheme making `user:pass@host` an opaque URL) has
// everything before its last '@' masked instead, past the scheme when there is one.
func redactURL(s string) string {
	const mask = "xxxxx"
	if u, err := url.Parse(s); err == nil && u.Opaque == "" {
		if u.User == nil {
			return s // as written: re-encoding would show the user another text than theirs
		}
		if _, ok := u.User.Password(); !ok {
			u.User = url.User(mask)
		}
		return u.Redacted()
	}
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return s
	}
	start := 0
	if i := strings.Index(s, "://"); i >= 0 && i < at {
		start = i + len("://")
	}
	return s[:start] + mask + s[at:]
}

func checkHostPort(es *Errors, path, s string) {
	if s == "" {
		es.add(path, "", "required")
		return
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		es.add(path, s, "must be host:port, such as 127.0.0.1:8080 or :8080")
		return
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		es.add(path, s, "port must be a number from 0 to 65535")
	}
}

// sameListener reports whether two host:port addresses would collide. Port 0 (any free port,
// used by tests) never collides.
func sameListener(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb || pa == "0" {
		return false
	}
	return ha == hb || isWildcard(ha) || isWildcard(hb)
}

func isWildcard(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::"
}

func checkHeaderName(es *Errors, path, name string, required bool) {
	switch {
	case name == "" && required:
		es.add(path, "", "required")
	case name != "" && !httpguts.ValidHeaderFieldName(name):
		es.add(path, name, "must be a valid header name")
	case name != "":
		if why := unseenHeader(name); why != "" {
			es.add(path, name, why)
		}
	}
}

// unseenHeader says why a request header cannot carry a key, or returns "". net/http's server
// moves Host to Request.Host and Transfer-Encoding to Request.TransferEncoding, deleting both
// from Request.Header (HTTP/2 never puts them there either), so a key read from them would be
// absent from every request and its policy would silently never charge. Names are compared in
// canonical form, as http.Header stores them.
func unseenHeader(name string) string {
	switch c := http.CanonicalHeaderKey(name); c {
	case "Host", "Transfer-Encoding":
		return c + " never reaches the request headers (net/http moves it out), so this key would never be present"
	}
	return gatewayHeader(name) // see validate_headers.go
}

func checkJWT(es *Errors, j *JWTConfig, getenv func(string) string) jwtKeys {
	var keys jwtKeys
	if j.HS256SecretEnv == "" && j.RS256PublicKeyFile == "" {
		es.add("identity.jwt", "", "needs hs256_secret_env or rs256_public_key_file (or both)")
	}
	if name := j.HS256SecretEnv; name != "" {
		// The variable's value is a secret: messages name the variable, never its content. A
		// "name" that is no identifier is probably the secret itself, pasted in the wrong
		// field: it is not quoted either.
		shown := name
		if !isIdentifier(name) {
			shown = ""
		}
		secret := getenv(name)
		switch {
		case secret == "":
			es.add("identity.jwt.hs256_secret_env", shown, "environment variable is not set or empty")
		case len(secret) < minSecret:
			es.add("identity.jwt.hs256_secret_env", shown, fmt.Sprintf("secret must be at least %d bytes (RFC 7518 §3.2)", minSecret))
		default:
			keys.secret = []byte(secret)
		}
	}
	if file := j.RS256PublicKeyFile; file != "" {
		pemBytes, err := os.ReadFile(file)
		if err != nil {
			es.add("identity.jwt.rs256_public_key_file", file, fmt.Sprintf("cannot read: %v", err))
		} else if key, err := jwt.ParseRSAPublicKeyFromPEM(pemBytes); err != nil {
			es.add("identity.jwt.rs256_public_key_file", file, "must hold a PEM RSA public key (PKIX, PKCS #1 or a certificate)")
		} else {
			keys.rsa = key
		}
	}
	if j.Leeway < 0 {
		es.add("identity.jwt.leeway", j.Leeway.String(), "must not be negative")
	}
	return keys
}
