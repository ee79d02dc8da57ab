package policy

import (
	"crypto/rsa"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// Bounds of the values a policy may hold. They keep every derived duration (burst/rate, the
// window) far inside time.Duration's range, so the bucket arithmetic cannot overflow. The bounds
// of counts and names are limitterms's, shared with Envoy's rule files.
const (
	maxRate   = 1_000_000_000         // requests per second: one per nanosecond
	minWindow = time.Millisecond      // finer windows are noise next to the store's latency
	maxWindow = 7 * 24 * time.Hour    // daily and weekly quotas, not monthly ones
	minSecret = 32                    // RFC 7518 §3.2: an HS256 key is at least 256 bits
	hexSHA256 = len("sha256:") + 2*32 // "sha256:" and 64 hex digits
)

// algorithms maps the file's names to bucket algorithms (limitterms.AlgorithmName is its inverse).
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
	c.locate(errs)
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
func (c *Config) check(getenv func(string) string) (Errors, jwtKeys, *TLSMaterial, *envoyrules.Rules) {
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
	case "memory", "dynamodb", "redis":
	default:
		es.add("store.backend", c.Store.Backend, "must be memory, dynamodb or redis")
	}
	if _, err := bucket.ParseOnError(c.Store.OnError); err != nil {
		// The values are bucket's, which applies the rule; its message names the field, ours
		// puts it in the path.
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
	if d := c.Server.WriteStallTimeout; d < 100*time.Millisecond || d > time.Hour {
		es.add("server.write_stall_timeout", limitterms.ShortDuration(d), "must be from 100ms to 1h")
	}
	checkUpgrades(&es, c.UpgradeProtocols)
	checkGRPCRoutes(&es, c.GRPCRoutes)
	positiveDuration(&es, "server.idle_timeout", c.Server.IdleTimeout)
	positiveDuration(&es, "server.drain_timeout", c.Server.DrainTimeout)
	if d := c.Server.ShutdownDelay; d < 0 || d > 10*time.Minute {
		es.add("server.shutdown_delay", limitterms.ShortDuration(d), "must be between 0s and 10m")
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
	var rls *envoyrules.Rules
	if c.RLS != nil {
		rls = checkRLS(&es, c, rlsOnly)
		checkRLSLabels(&es, c, rls)
	}
	checkProtect(&es, c)              // validate_protect.go
	checkTelemetry(&es, &c.Telemetry) // validate_telemetry.go
	return es, keys, tlsm, rls
}

// --- rls block (Envoy's rate limit service) ---

// checkRLSLabels refuses a proxy policy named like an rls rule's label or a domain's override
// label: both front ends count under that name in ratelimit_requests_total{policy}, and the
// operators' console names rules and policies by it, so the two would merge in every series,
// top list and exemption.
func checkRLSLabels(es *Errors, c *Config, rules *envoyrules.Rules) {
	if rules == nil || len(c.Policies) == 0 {
		return
	}
	names := make(map[string]int, len(c.Policies))
	for i, p := range c.Policies {
		names[p.Name] = i
	}
	for _, dn := range rules.Domains() {
		labels := []string{dn + ".override"} // the label of the domain's limit overrides (rls.overrideLabel)
		for _, r := range rules.Domain(dn).Rules() {
			labels = append(labels, r.Label)
		}
		for _, l := range labels {
			if i, ok := names[l]; ok {
				delete(names, l) // once per policy
				es.add(fmt.Sprintf("policies[%d].name", i), l, fmt.Sprintf("an rls rule of domain %q counts under this name (ratelimit_requests_total{policy}, the operators' console): rename the policy", dn))
			}
		}
	}
}

// checkRLS checks the rls block and loads the files of rls.config_dir (internal/envoyrules),
// reporting their problems as the configuration's.
func checkRLS(es *Errors, c *Config, rlsOnly bool) *envoyrules.Rules {
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
	rules, problems, err := envoyrules.Load(r.ConfigDir, envoyrules.Options{Namespace: namespace(c)})
	if err != nil {
		es.add("rls.config_dir", r.ConfigDir, err.Error())
		return nil
	}
	for _, p := range problems {
		*es = append(*es, FieldError{File: p.File, Line: p.Line, Col: p.Col, Path: p.Path, Value: p.Value, Msg: p.Msg})
	}
	return rules
}

func positiveDuration(es *Errors, path string, d time.Duration) {
	if d <= 0 {
		es.add(path, limitterms.ShortDuration(d), "must be positive")
	}
}

func nonNegativeDuration(es *Errors, path string, d time.Duration) {
	if d < 0 {
		es.add(path, limitterms.ShortDuration(d), "must not be negative")
	}
}

func positiveInt(es *Errors, path string, n int64) {
	if n <= 0 {
		es.add(path, strconv.FormatInt(n, 10), "must be positive")
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
