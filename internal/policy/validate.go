package policy

import (
	"crypto/rsa"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	// Quotas name IANA zones: the binary carries the zone database (about 450 kB), so a
	// time_zone works in a distroless or scratch image without /usr/share/zoneinfo, and means the
	// same on every replica.
	_ "time/tzdata"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/net/http/httpguts"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Bounds of the values a policy may hold. They keep every derived duration (burst/rate, the
// window) far inside time.Duration's range, so the bucket arithmetic cannot overflow.
const (
	maxCount   = 1_000_000_000         // burst and limit
	maxRate    = 1_000_000_000         // requests per second: one per nanosecond
	maxRefill  = 366 * 24 * time.Hour  // burst/rate: time for an empty bucket to fill
	minWindow  = time.Millisecond      // finer windows are noise next to the store's latency
	maxWindow  = 7 * 24 * time.Hour    // daily and weekly quotas, not monthly ones
	minSecret  = 32                    // RFC 7518 §3.2: an HS256 key is at least 256 bits
	maxNameLen = 64                    // names end up in metric labels and log lines
	hexSHA256  = len("sha256:") + 2*32 // "sha256:" and 64 hex digits
)

// algorithms maps the file's names to bucket algorithms.
var algorithms = map[string]bucket.Algorithm{
	"token_bucket":   bucket.TokenBucket,
	"leaky_bucket":   bucket.LeakyBucket,
	"fixed_window":   bucket.FixedWindow,
	"sliding_window": bucket.SlidingWindow,
	"concurrency":    bucket.Concurrency,
	"quota":          bucket.Quota,
}

// periods maps the file's quota periods to bucket periods.
var periods = map[string]bucket.Period{"day": bucket.Day, "week": bucket.Week, "month": bucket.Month}

// algorithmName is the inverse of algorithms, indexed by bucket.Algorithm.
var algorithmName = [...]string{
	bucket.TokenBucket:   "token_bucket",
	bucket.LeakyBucket:   "leaky_bucket",
	bucket.FixedWindow:   "fixed_window",
	bucket.SlidingWindow: "sliding_window",
	bucket.Concurrency:   "concurrency",
	bucket.Quota:         "quota",
}

// algorithmList is the algorithms as error messages list them.
const algorithmList = "token_bucket, leaky_bucket, fixed_window, sliding_window, concurrency or quota"

func isBucket(a bucket.Algorithm) bool { return a == bucket.TokenBucket || a == bucket.LeakyBucket }

// methods are the request methods a match may name. A closed list catches typos such as PSOT
// that would otherwise make a policy silently match nothing.
var methods = map[string]bool{
	"GET": true, "HEAD": true, "POST": true, "PUT": true, "PATCH": true,
	"DELETE": true, "CONNECT": true, "OPTIONS": true, "TRACE": true,
}

// ParseRate parses "N/s", "N/m" or "N/h" into requests per second. N is a positive decimal
// number such as 50 or 0.5; at most 1e9 per second. Errors read like `unit must be s, m or h`,
// ready to follow a field path and value.
func ParseRate(s string) (float64, error) {
	num, unit, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("must be N/s, N/m or N/h")
	}
	var per float64
	switch unit {
	case "s":
		per = 1
	case "m":
		per = 60
	case "h":
		per = 3600
	default:
		return 0, fmt.Errorf("unit must be s, m or h")
	}
	if !isDecimal(num) {
		return 0, fmt.Errorf("count must be a decimal number such as 50 or 0.5")
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil {
		// Only range errors are possible after isDecimal.
		return 0, fmt.Errorf("count is out of range")
	}
	if n <= 0 {
		return 0, fmt.Errorf("count must be positive")
	}
	r := n / per
	if r > maxRate {
		return 0, fmt.Errorf("must be at most %d/s", maxRate)
	}
	return r, nil
}

// isDecimal accepts digits with an optional fraction ("50", "0.5"), nothing ParseFloat also
// takes (exponents, hex, "Inf", underscores, signs).
func isDecimal(s string) bool {
	intPart, frac, hasDot := strings.Cut(s, ".")
	return allDigits(intPart) && (!hasDot || allDigits(frac))
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// Validate checks every field and returns Errors listing all problems, or nil. getenv reads the
// variable named by identity.jwt.hs256_secret_env (nil means os.Getenv); the public key file is
// read too, so a valid Config compiles.
func (c *Config) Validate(getenv func(string) string) error {
	errs, _, _, _ := c.check(getenv)
	return errs.err()
}

// jwtKeys is the key material found while validating, handed to Compile so that the
// environment and the key file are read once.
type jwtKeys struct {
	secret []byte
	rsa    *rsa.PublicKey
}

// check is Validate, also returning the JWT key material, the loaded tls block (nil without
// one, or when it is invalid) and the compiled rls rules (nil without an rls block).
func (c *Config) check(getenv func(string) string) (Errors, jwtKeys, *TLSMaterial, *RLSRules) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var es Errors
	var keys jwtKeys

	// Without upstream and with rls, the gateway serves RLS alone: no proxy, so no policies.
	rlsOnly := c.Upstream == "" && c.RLS != nil
	if !rlsOnly {
		checkUpstream(&es, c.Upstream)
	}
	checkHostPort(&es, "listen", c.Listen)
	checkHostPort(&es, "admin_listen", c.AdminListen)
	if c.Listen != "" && c.AdminListen != "" && sameListener(c.Listen, c.AdminListen) {
		es.add("admin_listen", c.AdminListen, "must differ from listen: metrics and health never share the proxy's port")
	}
	for i, tp := range c.TrustedProxies {
		if _, ok := parsePrefix(tp); !ok {
			es.add(fmt.Sprintf("trusted_proxies[%d]", i), tp, "must be an IP address or CIDR")
		}
	}

	id := c.Identity
	checkHeaderName(&es, "identity.api_key_header", id.APIKeyHeader, true)
	checkHeaderName(&es, "identity.user_header", id.UserHeader, false)
	if p := id.IPv6Prefix; p < 1 || p > 128 {
		es.add("identity.ipv6_prefix", strconv.Itoa(p), "must be from 1 to 128 (128: every IPv6 address is its own ip key)")
	}
	if j := id.JWT; j != nil {
		if id.UserHeader != "" {
			es.add("identity.jwt", "", "cannot be combined with identity.user_header: the user comes from one of them")
		}
		keys = checkJWT(&es, j, getenv)
	}

	switch c.Headers.Reset {
	case "unix", "delta":
	default:
		es.add("headers.reset", c.Headers.Reset, "must be unix or delta")
	}
	switch c.Store.Backend {
	case "memory", "dynamodb":
	default:
		es.add("store.backend", c.Store.Backend, "must be memory or dynamodb")
	}
	switch c.Store.OnError {
	case "allow", "deny", "local":
	default:
		es.add("store.on_error", c.Store.OnError, "must be allow, deny or local")
	}
	positiveDuration(&es, "store.timeout", c.Store.Timeout)
	positiveDuration(&es, "upstream_timeout", c.UpstreamTimeout)
	nonNegativeDuration(&es, "grpc_upstream_timeout", c.GRPCUpstreamTimeout)
	switch c.UpstreamProtocol {
	case "http1", "h2c", "auto":
	default:
		es.add("upstream_protocol", c.UpstreamProtocol, "must be http1, h2c or auto")
	}
	positiveInt(&es, "store.max_keys", int64(c.Store.MaxKeys))
	switch c.MethodOverride {
	case MethodOverrideJudge, MethodOverrideStrip:
	default:
		es.add("method_override", c.MethodOverride, "must be judge or strip")
	}
	checkStore(&es, &c.Store)
	positiveDuration(&es, "server.read_header_timeout", c.Server.ReadHeaderTimeout)
	positiveDuration(&es, "server.read_timeout", c.Server.ReadTimeout)
	positiveDuration(&es, "server.grpc_idle_timeout", c.Server.GRPCIdleTimeout)
	checkUpgrades(&es, c.UpgradeProtocols)
	checkGRPCRoutes(&es, c.GRPCRoutes)
	positiveDuration(&es, "server.idle_timeout", c.Server.IdleTimeout)
	positiveDuration(&es, "server.drain_timeout", c.Server.DrainTimeout)
	if d := c.Server.ShutdownDelay; d < 0 || d > 10*time.Minute {
		es.add("server.shutdown_delay", shortDuration(d), "must be between 0s and 10m")
	}
	positiveInt(&es, "server.max_header_bytes", int64(c.Server.MaxHeaderBytes))
	if n := c.Server.MaxConcurrentStreams; n < 1 || n > 10000 {
		es.add("server.max_concurrent_streams", strconv.Itoa(n), "must be from 1 to 10000")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		es.add("log.level", c.Log.Level, "must be debug, info, warn or error")
	}
	if name := c.Log.PseudonymSecretEnv; name != "" {
		if _, err := PseudonymSecret(name, getenv); err != nil {
			shown := name
			if !isIdentifier(name) {
				shown = "" // probably the secret itself, pasted into the wrong field
			}
			es.add("log.pseudonym_secret_env", shown, err.Error())
		}
	}

	switch {
	case rlsOnly && len(c.Policies) > 0:
		es.add("policies", "", "set, but upstream is empty: policies limit the proxy, which needs upstream (rls rules live in rls.config_dir)")
	case !rlsOnly && len(c.Policies) == 0:
		es.add("policies", "", "at least one policy is required")
	}
	seen := make(map[string]int, len(c.Policies))
	hasUser := id.UserHeader != "" || id.JWT != nil
	for i := range c.Policies {
		checkPolicy(&es, fmt.Sprintf("policies[%d]", i), &c.Policies[i], hasUser)
		if c.Store.Backend == "dynamodb" {
			checkSlotsFit(&es, fmt.Sprintf("policies[%d]", i), &c.Policies[i])
		}
		name := c.Policies[i].Name
		if first, dup := seen[name]; dup && name != "" {
			es.add(fmt.Sprintf("policies[%d].name", i), name, fmt.Sprintf("duplicate of policies[%d]", first))
		} else {
			seen[name] = i
		}
	}
	checkAdmin(&es, &c.Admin, getenv)
	var tlsm *TLSMaterial
	if c.TLS != nil {
		tlsm = checkTLS(&es, c.TLS)
	}
	var rls *RLSRules
	if c.RLS != nil {
		rls = checkRLS(&es, c, rlsOnly)
	}
	checkProtect(&es, c) // validate_protect.go
	return es, keys, tlsm, rls
}

// --- rls block (Envoy's rate limit service) ---

// checkRLS checks the rls block and loads the files of rls.config_dir (envoy.go).
func checkRLS(es *Errors, c *Config, rlsOnly bool) *RLSRules {
	r := c.RLS
	if r.Listen == "" {
		es.add("rls.listen", "", "required when rls is set: the gRPC address Envoy calls")
	} else {
		checkHostPort(es, "rls.listen", r.Listen)
		if c.AdminListen != "" && sameListener(r.Listen, c.AdminListen) {
			es.add("rls.listen", r.Listen, "must differ from admin_listen")
		}
		if !rlsOnly && c.Listen != "" && sameListener(r.Listen, c.Listen) {
			es.add("rls.listen", r.Listen, "must differ from listen: the proxy and the rate limit service each have their port")
		}
	}
	switch r.ResponseHeaders {
	case "", "ietf", "x-ratelimit", "all", "none":
	default:
		es.add("rls.response_headers", r.ResponseHeaders, "must be ietf, x-ratelimit, all or none")
	}
	if r.ConfigDir == "" {
		es.add("rls.config_dir", "", "required when rls is set: the folder of envoyproxy/ratelimit configuration files")
		return nil
	}
	return loadRLSDir(es, r.ConfigDir, c)
}

// maxReplicas bounds store.replicas: beyond it every divided limit is 1 anyway.
const maxReplicas = 10_000

// checkStore checks the fields of the shared store and of on_error local.
func checkStore(es *Errors, st *StoreConfig) {
	switch r := st.Replicas; {
	case r == 0 && st.OnError == "local":
		es.add("store.replicas", "", "required with store.on_error local: how many replicas share the limits")
	case r < 0 || r > maxReplicas:
		es.add("store.replicas", strconv.Itoa(r), fmt.Sprintf("must be from 1 to %d", maxReplicas))
	}
	d := st.DynamoDB
	if st.Backend != "dynamodb" {
		if d != nil && st.Backend == "memory" {
			// A forgotten `backend: dynamodb` would enforce every limit per replica, silently.
			es.add("store.dynamodb", "", "set, but store.backend is memory: set store.backend: dynamodb, or remove the block")
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
		es.add("store.dynamodb.slot_lease", shortDuration(l), "must be from 3s to 10m")
	}
	if ns := d.Namespace; ns != "" && (len(ns) > maxNameLen || !validName(ns)) {
		es.add("store.dynamodb.namespace", ns, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", maxNameLen))
	}
	checkClock(es, &d.Clock)
}

// checkClock checks store.dynamodb.clock. Below a millisecond is below what a round trip to
// DynamoDB can measure; above an hour is a clock no correction should trust.
func checkClock(es *Errors, c *ClockConfig) {
	inRange := func(d time.Duration) bool { return d >= time.Millisecond && d <= time.Hour }
	if !inRange(c.MaxCorrection) {
		es.add("store.dynamodb.clock.max_correction", shortDuration(c.MaxCorrection), "must be from 1ms to 1h")
	}
	if !inRange(c.WarnOffset) {
		es.add("store.dynamodb.clock.warn_offset", shortDuration(c.WarnOffset), "must be from 1ms to 1h")
	}
	if c.MaxOffset != 0 && !inRange(c.MaxOffset) {
		es.add("store.dynamodb.clock.max_offset", shortDuration(c.MaxOffset), "must be 0s (off) or from 1ms to 1h")
	}
}

// validTableName follows DynamoDB's naming rules for tables.
func validTableName(s string) bool {
	return len(s) >= 3 && len(s) <= 255 && validName(s)
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

func positiveDuration(es *Errors, path string, d time.Duration) {
	if d <= 0 {
		es.add(path, shortDuration(d), "must be positive")
	}
}

func nonNegativeDuration(es *Errors, path string, d time.Duration) {
	if d < 0 {
		es.add(path, shortDuration(d), "must not be negative")
	}
}

func positiveInt(es *Errors, path string, n int64) {
	if n <= 0 {
		es.add(path, strconv.FormatInt(n, 10), "must be positive")
	}
}

// keyKind is the source of a policy's key value.
type keyKind uint8

const (
	keyIP keyKind = iota + 1
	keyAPIKey
	keyUser
	keyGlobal
	keyHeader
)

// parseKey splits a policy's key into its kind and, for header:NAME, the header name.
func parseKey(s string) (keyKind, string, bool) {
	switch s {
	case "ip":
		return keyIP, "", true
	case "api_key":
		return keyAPIKey, "", true
	case "user":
		return keyUser, "", true
	case "global":
		return keyGlobal, "", true
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok {
		return keyHeader, name, true
	}
	return 0, "", false
}

func checkPolicy(es *Errors, at string, p *PolicyConfig, hasUser bool) {
	switch {
	case p.Name == "":
		es.add(at+".name", "", "required")
	case len(p.Name) > maxNameLen || !validName(p.Name):
		es.add(at+".name", p.Name, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", maxNameLen))
	}

	kind, header, ok := parseKey(p.Key)
	switch {
	case p.Key == "":
		es.add(at+".key", "", "required: ip, api_key, user, global or header:NAME")
	case !ok:
		es.add(at+".key", p.Key, "must be ip, api_key, user, global or header:NAME")
	case kind == keyHeader && !httpguts.ValidHeaderFieldName(header):
		es.add(at+".key", p.Key, "header:NAME needs a valid header name")
	case kind == keyHeader && unseenHeader(header) != "":
		es.add(at+".key", p.Key, unseenHeader(header))
	case kind == keyUser && !hasUser:
		es.add(at+".key", p.Key, "needs identity.user_header or identity.jwt")
	}

	alg, algOK := algorithms[p.Algorithm]
	switch {
	case p.Algorithm == "":
		es.add(at+".algorithm", "", "required: "+algorithmList)
	case !algOK:
		es.add(at+".algorithm", p.Algorithm, "must be "+algorithmList)
	default:
		before := len(*es)
		checkLimit(es, at, alg, p.fields(), true)
		if len(*es) == before && isBucket(alg) {
			r, _ := ParseRate(p.Rate)
			checkRefill(es, at+".burst", r, p.Burst)
		}
		switch {
		case alg == bucket.Concurrency && (p.Cost != 0 || p.costSet):
			es.add(at+".cost", strconv.FormatInt(p.Cost, 10), "not used by concurrency: every request holds one slot")
		case alg == bucket.Concurrency && len(p.Costs) > 0:
			es.add(at+".costs", "", "not used by concurrency: every request holds one slot")
		case len(*es) == before:
			checkCost(es, at+".cost", p.Cost, p.Cost, p.fields(), alg)
			for j, c := range p.Costs {
				checkCost(es, fmt.Sprintf("%s.costs[%d].cost", at, j), c.Cost, c.Cost, p.fields(), alg)
			}
		}
		checkCosts(es, at, p.Costs)
		checkCalendar(es, at, p, alg)
	}
	if c := p.Cost; c < 0 || c == 0 && p.costSet {
		es.add(at+".cost", strconv.FormatInt(c, 10), "must be at least 1")
	} else if c > maxCount {
		es.add(at+".cost", strconv.FormatInt(c, 10), fmt.Sprintf("must be at most %d", maxCount))
	}

	switch p.Mode {
	case "", modeEnforce, modeShadow:
	default:
		es.add(at+".mode", p.Mode, "must be enforce or shadow")
	}
	for j, m := range p.Match.Methods {
		if !methods[m] {
			es.add(fmt.Sprintf("%s.match.methods[%d]", at, j), m, "must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE")
		}
	}
	checkPathPrefix(es, at+".match.path_prefix", p.Match.PathPrefix)
	checkChargeOn(es, at, p.ChargeOn, alg, algOK)
	checkOverrides(es, at, p, kind, ok, alg, algOK)
	if p.Pool != "" && (len(p.Pool) > maxNameLen || !validName(p.Pool)) {
		es.add(at+".pool", p.Pool, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", maxNameLen))
	}
	if algOK {
		checkLease(es, at, p, alg)
	}
}

// checkLease checks a policy's lease block against its limit and every override's.
func checkLease(es *Errors, at string, p *PolicyConfig, alg bucket.Algorithm) {
	l := p.Lease
	if l == nil {
		return
	}
	at += ".lease"
	if !l.Enabled {
		if l.Shards != 0 || l.TTL != 0 {
			es.add(at+".enabled", "false", "lease fields are set, but enabled is false: set enabled: true, or remove the block")
		}
		return
	}
	if !bucket.LeaseSupported(alg) {
		es.add(at+".enabled", "true", "leases serve token_bucket and fixed_window only, not "+algorithmName[alg]+" (see docs/shared-pools.md)")
		return
	}
	if len(p.ChargeOn) > 0 {
		// A leased unit is spent when the request is admitted; giving it back after the
		// answer would need the lease still live, which a slow upstream outlasts.
		es.add(at+".enabled", "true", "cannot be combined with charge_on: a leased unit is spent when the request is admitted")
		return
	}
	if l.Shards < 0 || l.Shards > bucket.MaxLeaseShards {
		es.add(at+".shards", strconv.Itoa(l.Shards), fmt.Sprintf("must be from 1 to %d", bucket.MaxLeaseShards))
		return
	}
	if l.TTL < 0 {
		es.add(at+".ttl", shortDuration(l.TTL), "must be positive")
		return
	}
	limits := []limitFields{p.fields()}
	for i := range p.Overrides {
		if !p.Overrides[i].Unlimited {
			limits = append(limits, effective(p, &p.Overrides[i]))
		}
	}
	shards := max(l.Shards, 1)
	for _, f := range limits {
		lim := limitOf(alg, p, f)
		capacity, what := lim.Burst, "burst"
		if alg == bucket.FixedWindow {
			capacity, what = lim.Count, "limit"
		}
		if capacity <= 0 || (alg == bucket.TokenBucket && lim.Rate <= 0) {
			return // reported with the limit's own fields
		}
		if int64(shards) > capacity {
			es.add(at+".shards", strconv.Itoa(shards), fmt.Sprintf("must be at most the %s (%d): every shard holds at least one request of it", what, capacity))
			return
		}
		if ttl := bucket.LeaseTTL(lim, bucket.Lease{Shards: shards, TTL: l.TTL}); ttl > 0 {
			if most := bucket.LeaseCapacity(lim, shards, ttl); p.Cost > most {
				es.add(at+".shards", strconv.Itoa(shards), fmt.Sprintf("leaves room for %d per lease, less than the cost %d of one request", most, p.Cost))
				return
			}
			continue
		}
		if l.TTL == 0 || capacity/int64(shards) < 2 {
			es.add(at+".shards", strconv.Itoa(shards), fmt.Sprintf("leaves %d of the burst (%d) to a shard: a leased token bucket needs at least 2 per shard", capacity/int64(shards), capacity))
			return
		}
		t, tau := bucket.ShardGCRA(lim, shards, shards-1)
		es.add(at+".ttl", shortDuration(l.TTL), "must be at most "+shortDuration(time.Duration(tau-t))+
			" (the smallest shard's burst time less one interval): leased units come out of the burst less rate×ttl")
		return
	}
}

func validName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || isDigit(c) || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// limitFields are the limit fields common to a policy and an override.
type limitFields struct {
	rate      string
	burst     int64
	limit     int64
	window    time.Duration
	windowSet bool // the file wrote window, possibly as 0s
}

// fields returns the policy's limit fields.
func (p *PolicyConfig) fields() limitFields {
	return limitFields{rate: p.Rate, burst: p.Burst, limit: p.Limit, window: p.Window, windowSet: p.windowSet}
}

// fields returns the override's own limit fields (those it leaves unset are zero).
func (o *OverrideConfig) fields() limitFields {
	return limitFields{rate: o.Rate, burst: o.Burst, limit: o.Limit, window: o.Window, windowSet: o.windowSet}
}

// checkLimit checks one algorithm's fields at `at`. For a policy (full) the algorithm's fields
// are required; an override may set any subset, the rest being inherited. Fields of the other
// algorithm family are errors either way.
func checkLimit(es *Errors, at string, alg bucket.Algorithm, f limitFields, full bool) {
	name := algorithmName[alg]
	if isBucket(alg) {
		if f.limit != 0 {
			es.add(at+".limit", strconv.FormatInt(f.limit, 10), "not used by "+name+": set rate and burst")
		}
		if f.window != 0 || f.windowSet {
			es.add(at+".window", shortDuration(f.window), "not used by "+name+": set rate and burst")
		}
		if f.rate == "" && full {
			es.add(at+".rate", "", "required for "+name+": N/s, N/m or N/h")
		} else if f.rate != "" {
			if _, err := ParseRate(f.rate); err != nil {
				es.add(at+".rate", f.rate, err.Error())
			}
		}
		checkCount(es, at+".burst", f.burst, name, full)
		return
	}
	if alg == bucket.Concurrency {
		if f.rate != "" {
			es.add(at+".rate", f.rate, "not used by concurrency: set limit (requests in flight at once)")
		}
		if f.burst != 0 {
			es.add(at+".burst", strconv.FormatInt(f.burst, 10), "not used by concurrency: set limit (requests in flight at once)")
		}
		if f.window != 0 || f.windowSet {
			es.add(at+".window", shortDuration(f.window), "not used by concurrency: a slot is held while its request is in flight")
		}
		checkCount(es, at+".limit", f.limit, name, full)
		return
	}
	set := "set limit and window"
	if alg == bucket.Quota {
		set = "set limit and period"
	}
	if f.rate != "" {
		es.add(at+".rate", f.rate, "not used by "+name+": "+set)
	}
	if f.burst != 0 {
		es.add(at+".burst", strconv.FormatInt(f.burst, 10), "not used by "+name+": "+set)
	}
	checkCount(es, at+".limit", f.limit, name, full)
	if alg == bucket.Quota {
		if f.window != 0 || f.windowSet {
			es.add(at+".window", shortDuration(f.window), "not used by quota: "+set+" (day, week or month)")
		}
		return
	}
	switch w := f.window; {
	case w < 0 || w == 0 && f.windowSet:
		// Quoted like every other bad value: "required" would hide what the user wrote.
		es.add(at+".window", shortDuration(w), "must be positive")
	case w == 0 && full:
		es.add(at+".window", "", "required for "+name+": a duration such as 1m")
	case w == 0:
	case w < minWindow:
		es.add(at+".window", shortDuration(w), "must be at least "+shortDuration(minWindow))
	case w > maxWindow:
		es.add(at+".window", shortDuration(w), "must be at most "+shortDuration(maxWindow))
	}
}

// checkPathPrefix checks a path_prefix: requests are matched by their canonical path, so a
// prefix that is not canonical (but for case) would match nothing it seems to.
func checkPathPrefix(es *Errors, at, pp string) {
	switch {
	case pp == "":
	case pp[0] != '/':
		es.add(at, pp, `must start with "/"`)
	default:
		if canon, _ := CanonicalPath(pp, false); canon != pp {
			es.add(at, pp, fmt.Sprintf(`must be a canonical path (%q): requests are matched without ';' parameters, repeated slashes, "." and ".." segments, with '\\' as '/'`, canon))
		}
	}
}

// checkCosts checks the entries of a policy's costs (their costs against the limit are checked
// with the policy's own cost).
func checkCosts(es *Errors, at string, costs []CostConfig) {
	for j := range costs {
		c := &costs[j]
		cat := fmt.Sprintf("%s.costs[%d]", at, j)
		if len(c.Methods) == 0 && c.PathPrefix == "" {
			es.add(cat, "", "needs methods or path_prefix: an entry for every request is the policy's cost")
		}
		for k, m := range c.Methods {
			if !methods[m] {
				es.add(fmt.Sprintf("%s.methods[%d]", cat, k), m, "must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE")
			}
		}
		checkPathPrefix(es, cat+".path_prefix", c.PathPrefix)
		switch {
		case c.Cost == 0:
			es.add(cat+".cost", "", "required: at least 1")
		case c.Cost < 0:
			es.add(cat+".cost", strconv.FormatInt(c.Cost, 10), "must be at least 1")
		case c.Cost > maxCount:
			es.add(cat+".cost", strconv.FormatInt(c.Cost, 10), fmt.Sprintf("must be at most %d", maxCount))
		}
	}
}

// maxCost is the highest cost a request of the policy can have.
func maxCost(p *PolicyConfig) int64 {
	c := max(p.Cost, 1)
	for _, e := range p.Costs {
		c = max(c, e.Cost)
	}
	return c
}

// capacity is the most one request can cost under a valid limit: what a full bucket, a window or
// a period holds.
func capacity(alg bucket.Algorithm, f limitFields) int64 {
	switch alg {
	case bucket.TokenBucket:
		return f.burst
	case bucket.LeakyBucket:
		return f.burst + 1 // the request in service and burst waiting
	}
	return f.limit
}

// checkCost rejects a cost that the (effective, valid) limit f can never admit: every such
// request would be refused forever. path names the field to blame; shown is its value.
func checkCost(es *Errors, path string, shown, cost int64, f limitFields, alg bucket.Algorithm) {
	cost = max(cost, 1)
	if c := capacity(alg, f); cost > c {
		es.add(path, strconv.FormatInt(shown, 10), fmt.Sprintf(
			"a request costing %d never fits in what the limit holds (%d): raise the limit or lower cost", cost, c))
	}
}

// checkCalendar checks a quota's period, time_zone and offset, and refuses them on the other
// algorithms.
func checkCalendar(es *Errors, at string, p *PolicyConfig, alg bucket.Algorithm) {
	if alg != bucket.Quota {
		why := "not used by " + algorithmName[alg] + ": calendar periods are algorithm: quota"
		if p.Period != "" {
			es.add(at+".period", p.Period, why)
		}
		if p.TimeZone != "" {
			es.add(at+".time_zone", p.TimeZone, why)
		}
		if p.Offset != 0 {
			es.add(at+".offset", strconv.Itoa(p.Offset), why)
		}
		return
	}
	period, ok := periods[p.Period]
	switch {
	case p.Period == "":
		es.add(at+".period", "", "required for quota: day, week or month")
	case !ok:
		es.add(at+".period", p.Period, "must be day, week or month")
	}
	if _, err := loadZone(p.TimeZone); err != nil {
		es.add(at+".time_zone", p.TimeZone, err.Error())
	}
	if !ok {
		return
	}
	o := strconv.Itoa(p.Offset)
	switch period {
	case bucket.Day:
		if p.Offset != 0 {
			es.add(at+".offset", o, "must be 0 for period day: a day starts at midnight in time_zone")
		}
	case bucket.Week:
		if p.Offset < 0 || p.Offset > 6 {
			es.add(at+".offset", o, "must be from 0 (weeks start on Sunday) to 6 (Saturday) for period week")
		}
	case bucket.Month:
		if p.Offset < 0 || p.Offset > 27 {
			es.add(at+".offset", o, "must be from 0 (months start on the 1st) to 27 (on the 28th, which every month has) for period month")
		}
	}
}

// loadZone loads a quota's time zone: "" is UTC. Local is refused: it is whatever zone each
// replica's machine has, so replicas would disagree on when a period ends.
func loadZone(name string) (*time.Location, error) {
	switch name {
	case "":
		return time.UTC, nil
	case "Local":
		return nil, errors.New("is this machine's zone, which may differ between replicas: name the zone, such as Europe/Berlin, or UTC")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, errors.New("unknown time zone: use an IANA name such as Europe/Berlin or America/New_York, or UTC")
	}
	return loc, nil
}

func checkCount(es *Errors, path string, n int64, alg string, full bool) {
	switch {
	case n == 0 && full:
		es.add(path, "", "required for "+alg+": at least 1")
	case n == 0:
	case n < 1:
		es.add(path, strconv.FormatInt(n, 10), "must be at least 1")
	case n > maxCount:
		es.add(path, strconv.FormatInt(n, 10), fmt.Sprintf("must be at most %d", maxCount))
	}
}

// checkRefill rejects a bucket whose refill time burst/rate would not fit the bucket arithmetic.
// Called on the effective limit, after the fields themselves passed.
func checkRefill(es *Errors, path string, rate float64, burst int64) {
	if rate > 0 && burst > 0 && float64(burst)/rate > maxRefill.Seconds() {
		es.add(path, strconv.FormatInt(burst, 10), "burst/rate (the time to refill) must be at most "+shortDuration(maxRefill))
	}
}

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
				if r, err := ParseRate(eff.rate); err == nil {
					checkRefill(es, oat+".burst", r, eff.burst)
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

// ceilSeconds rounds a positive number of seconds up to a whole second, at least 1.
func ceilSeconds(s float64) int64 {
	if s <= 1 {
		return 1
	}
	return int64(math.Ceil(s))
}

// checkChargeOn checks a policy's charge_on list: each entry a status code (100 to 599) or a
// class (1xx to 5xx), for an algorithm whose charges can be refunded exactly.
func checkChargeOn(es *Errors, at string, list []string, alg bucket.Algorithm, algOK bool) {
	if list == nil {
		return
	}
	if len(list) == 0 {
		es.add(at+".charge_on", "", "must list at least one status (such as 401) or class (such as 5xx); remove it to charge every request")
		return
	}
	if algOK && (alg == bucket.LeakyBucket || alg == bucket.Concurrency) {
		why := "a leaky bucket has already held the request for its turn"
		if alg == bucket.Concurrency {
			why = "a concurrency slot is given back when the request ends, whatever its answer"
		}
		es.add(at+".charge_on", "", "not supported by "+algorithmName[alg]+": "+why+"; use token_bucket, fixed_window, sliding_window or quota")
	}
	for i, v := range list {
		if _, err := ParseStatusSet([]string{v}); err != nil {
			es.add(fmt.Sprintf("%s.charge_on[%d]", at, i), v, err.Error())
		}
	}
}

// maxDynamoSlots bounds a concurrency limit on DynamoDB: the key's item holds one lease
// attribute (about 30 bytes) per slot in flight, and an item holds at most 400 KB.
const maxDynamoSlots = 10_000

// checkSlotsFit refuses concurrency limits (the policy's and its overrides') whose slots would
// not fit one DynamoDB item.
func checkSlotsFit(es *Errors, at string, p *PolicyConfig) {
	if p.Algorithm != "concurrency" {
		return
	}
	const why = "with store.backend dynamodb a concurrency limit must be at most 10000 (one lease attribute per slot in one item)"
	if p.Limit > maxDynamoSlots {
		es.add(at+".limit", strconv.FormatInt(p.Limit, 10), why)
	}
	for j, o := range p.Overrides {
		if o.Limit > maxDynamoSlots {
			es.add(fmt.Sprintf("%s.overrides[%d].limit", at, j), strconv.FormatInt(o.Limit, 10), why)
		}
	}
}
