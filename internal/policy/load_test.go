package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// minimal is the smallest valid configuration; tests append to it or replace parts.
const minimal = `upstream: http://127.0.0.1:3000
policies:
  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}
`

// env returns a getenv over a fixed map: tests never read or change the process environment.
func env(kv ...string) func(string) string {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

var noEnv = env()

// mustParse parses yaml with getenv or fails the test.
func mustParse(t *testing.T, yaml string, getenv func(string) string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(yaml), LoadOptions{Getenv: getenv})
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, yaml)
	}
	return cfg
}

// errorLines returns the lines of err, which must wrap Errors.
func errorLines(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v (%T) does not wrap Errors", err, err)
	}
	var lines []string
	for _, e := range es {
		lines = append(lines, e.Error())
	}
	return lines
}

func TestParseDefaults(t *testing.T) {
	cfg := mustParse(t, minimal+"identity: {jwt: {hs256_secret_env: S}}\n", noEnv)
	want := Config{
		Listen:           "127.0.0.1:8080",
		AdminListen:      "127.0.0.1:9090",
		Upstream:         "http://127.0.0.1:3000",
		UpstreamTimeout:  60 * time.Second,
		UpstreamProtocol: "http1",
		UpgradeProtocols: []string{"websocket"},
		Identity:         IdentityConfig{APIKeyHeader: "X-Api-Key", JWT: &JWTConfig{Claim: "sub", HS256SecretEnv: "S"}, IPv6Prefix: 64},
		Headers:          HeadersConfig{Reset: "unix"},
		Store:            StoreConfig{Backend: "memory", OnError: "allow", Timeout: 50 * time.Millisecond, MaxKeys: 1000000},
		Server: ServerConfig{
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second, GRPCIdleTimeout: 5 * time.Minute, WriteStallTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second,
			DrainTimeout: 30 * time.Second, MaxHeaderBytes: 65536, MaxConcurrentStreams: 250,
		},
		Log:            LogConfig{Level: "info"},
		Policies:       []PolicyConfig{{Name: "p", Key: "ip", Algorithm: "token_bucket", Rate: "1/s", Burst: 1, Mode: "enforce"}},
		MethodOverride: "judge",
		Admin:          AdminConfig{TopK: 100, MaxExemptions: 1000},
		Telemetry:      TelemetryConfig{OTLP: OTLPConfig{Protocol: "grpc"}, Metrics: TelemetryMetricsConfig{Interval: time.Minute}},
	}
	got := *cfg
	got.src = source{} // where the file was read; not a default
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseNoJWTUnlessConfigured(t *testing.T) {
	cfg := mustParse(t, minimal, noEnv)
	if cfg.Identity.JWT != nil {
		t.Errorf("got JWT %+v, want nil: a default must not switch JWT on", cfg.Identity.JWT)
	}
}

func TestParseExplicitZeroIsKept(t *testing.T) {
	// A default fills an absent field only: an explicit 0 reaches validation.
	cfg := mustParse(t, minimal+"store: {timeout: 0s}\n", noEnv)
	if cfg.Store.Timeout != 0 {
		t.Fatalf("got timeout %v, want 0", cfg.Store.Timeout)
	}
	got := errorLines(t, cfg.Validate(noEnv))
	want := []string{`store.timeout: "0s": must be positive`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestParseStrict(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"top level", "upstrem: http://x\n" + minimal, []string{`upstrem: unknown field (did you mean "upstream"?)`}},
		{"nested", minimal + "store: {backend: memory, timeot: 1s}\n", []string{`store.timeot: unknown field (did you mean "timeout"?)`}},
		{"two deep", minimal + "identity: {jwt: {claim: sub, hs256_secret_env: S, audiance: x}}\n", []string{`identity.jwt.audiance: unknown field (did you mean "audience"?)`}},
		{"in a policy", "upstream: http://x\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n  - {name: b, key: ip, algorithm: token_bucket, ratee: 1/s, burst: 1}\n",
			[]string{`policies[1].ratee: unknown field (did you mean "rate"?)`}},
		{"in an override", "upstream: http://x\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, overrides: [{key: 10.0.0.1, unlimted: true}]}\n",
			[]string{`policies[0].overrides[0].unlimted: unknown field (did you mean "unlimited"?)`}},
		{"in a match", "upstream: http://x\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, match: {path: /x}}\n",
			[]string{"policies[0].match.path: unknown field"}},
		{"type errors", "upstream: http://x\nheaders: {ietf_draft: maybe}\nstore: {max_keys: many, timeout: soon}\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n  - {name: b, key: ip, algorithm: token_bucket, rate: 1/s, burst: lots}\n",
			[]string{
				`headers.ietf_draft: "maybe": must be true or false`,
				`store.max_keys: "many": must be an integer`,
				`store.timeout: "soon": must be a duration such as 500ms, 1m or 2h`,
				`policies[1].burst: "lots": must be an integer`,
			}},
		{"float is not an integer", "upstream: http://x\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 2.5}\n",
			[]string{`policies[0].burst: "2.5": must be an integer`}},
		{"integral float is", "upstream: http://x\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 2.0}\n", nil},
		{"scalar for mapping", minimal + "identity: X-Api-Key\n", []string{`identity: "X-Api-Key": must be a mapping`}},
		{"scalar for list", minimal + "trusted_proxies: 10.0.0.0/8\n", []string{`trusted_proxies: "10.0.0.0/8": must be a list`}},
		{"list for scalar", minimal + "listen: [a, b]\n", []string{`listen: must be a string`}},
		{"number for string is text", "upstream: http://x\npolicies:\n  - {name: 2024, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil},
		{"in file order", "upstream: http://x\npolicies:\n" + strings.Repeat("  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", 10) +
			"  - {name: k, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, zz: 1}\n  - {name: b, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, zz: 1}\n",
			[]string{"policies[10].zz: unknown field", "policies[11].zz: unknown field"}},
		{"everything at once", "upstrem: x\nstore: {timeot: 1s}\npolicies:\n  - {name: a, burst: x, ratee: 1}\n",
			[]string{`upstrem: unknown field (did you mean "upstream"?)`, `store.timeot: unknown field (did you mean "timeout"?)`, `policies[0].burst: "x": must be an integer`, `policies[0].ratee: unknown field (did you mean "rate"?)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), LoadOptions{Getenv: noEnv})
			got := errorLines(t, err)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestParseKeysAreCaseInsensitive(t *testing.T) {
	// The decoder folds keys (configyaml.Options.FoldCase); documented on Parse.
	cfg := mustParse(t, "Upstream: http://x\nPolicies:\n  - {Name: a, KEY: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", noEnv)
	if cfg.Upstream != "http://x" || cfg.Policies[0].Name != "a" || cfg.Policies[0].Key != "ip" {
		t.Errorf("got %+v, want upstream http://x and policy a keyed by ip", cfg)
	}
}

func TestParseBadYAML(t *testing.T) {
	_, err := Parse([]byte("upstream: http://x\npolicies:\n  - name: a\n   key: ip\n"), LoadOptions{Getenv: noEnv})
	if err == nil || !strings.Contains(err.Error(), "invalid YAML: yaml: line ") {
		t.Errorf("got %v, want an invalid YAML error with a line", err)
	}
	var es Errors
	if errors.As(err, &es) {
		t.Errorf("got Errors %v for a syntax error, want a plain error", es)
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("listn: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, LoadOptions{Getenv: noEnv})
	if want := path + `: listn: unknown field (did you mean "listen"?)`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), LoadOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("got %v, want os.ErrNotExist", err)
	}
}

func TestEnvOverrides(t *testing.T) {
	getenv := env(
		"RATELIMIT_LISTEN", "0.0.0.0:8081",
		"RATELIMIT_ADMIN_LISTEN", "0.0.0.0:9091",
		"RATELIMIT_UPSTREAM", "https://api.internal",
		"RATELIMIT_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.0.1",
		"RATELIMIT_IDENTITY_USER_HEADER", "X-Auth-User",
		"RATELIMIT_IDENTITY_IPV6_PREFIX", "56",
		"RATELIMIT_HEADERS_RESET", "delta",
		"RATELIMIT_HEADERS_IETF_DRAFT", "true",
		"RATELIMIT_STORE_BACKEND", "dynamodb",
		"RATELIMIT_STORE_ON_ERROR", "deny",
		"RATELIMIT_STORE_TIMEOUT", "75ms",
		"RATELIMIT_GRPC_UPSTREAM_TIMEOUT", "90m",
		"RATELIMIT_STORE_MAX_KEYS", "5000",
		"RATELIMIT_SERVER_DRAIN_TIMEOUT", "5s",
		"RATELIMIT_SERVER_MAX_HEADER_BYTES", "1024",
		"RATELIMIT_LOG_LEVEL", "debug",
		"RATELIMIT_ADMIN_HOSTS", "admin.ns.svc,10.0.0.7",
	)
	cfg := mustParse(t, minimal+"store: {backend: memory, on_error: allow}\n", getenv)
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen", cfg.Listen, "0.0.0.0:8081"},
		{"admin_listen", cfg.AdminListen, "0.0.0.0:9091"},
		{"upstream", cfg.Upstream, "https://api.internal"},
		{"trusted_proxies", cfg.TrustedProxies, []string{"10.0.0.0/8", "192.168.0.1"}},
		{"admin.hosts", cfg.Admin.Hosts, []string{"admin.ns.svc", "10.0.0.7"}},
		{"identity.user_header", cfg.Identity.UserHeader, "X-Auth-User"},
		{"identity.api_key_header (default kept)", cfg.Identity.APIKeyHeader, "X-Api-Key"},
		{"identity.ipv6_prefix", cfg.Identity.IPv6Prefix, 56},
		{"headers.reset", cfg.Headers.Reset, "delta"},
		{"headers.ietf_draft", cfg.Headers.IETFDraft, true},
		{"store.backend", cfg.Store.Backend, "dynamodb"},
		{"store.on_error", cfg.Store.OnError, "deny"},
		{"store.timeout", cfg.Store.Timeout, 75 * time.Millisecond},
		{"grpc_upstream_timeout", cfg.GRPCUpstreamTimeout, 90 * time.Minute},
		{"upstream_timeout (default kept)", cfg.UpstreamTimeout, 60 * time.Second},
		{"store.max_keys", cfg.Store.MaxKeys, 5000},
		{"server.drain_timeout", cfg.Server.DrainTimeout, 5 * time.Second},
		{"server.idle_timeout (default kept)", cfg.Server.IdleTimeout, 120 * time.Second},
		{"server.max_header_bytes", cfg.Server.MaxHeaderBytes, 1024},
		{"log.level", cfg.Log.Level, "debug"},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestEnvOverrideNames(t *testing.T) {
	got := map[string]bool{}
	for _, e := range envVars {
		got[e.name] = true
		if strings.HasPrefix(e.path, "policies") {
			t.Errorf("got override %s for %s, want none inside policies", e.name, e.path)
		}
	}
	for _, name := range []string{
		"RATELIMIT_LISTEN", "RATELIMIT_ADMIN_LISTEN", "RATELIMIT_UPSTREAM", "RATELIMIT_TRUSTED_PROXIES",
		"RATELIMIT_IDENTITY_API_KEY_HEADER", "RATELIMIT_IDENTITY_USER_HEADER", "RATELIMIT_IDENTITY_IPV6_PREFIX",
		"RATELIMIT_IDENTITY_JWT_CLAIM", "RATELIMIT_IDENTITY_JWT_HS256_SECRET_ENV",
		"RATELIMIT_IDENTITY_JWT_RS256_PUBLIC_KEY_FILE", "RATELIMIT_IDENTITY_JWT_ISSUER",
		"RATELIMIT_IDENTITY_JWT_AUDIENCE", "RATELIMIT_IDENTITY_JWT_LEEWAY",
		"RATELIMIT_HEADERS_RESET", "RATELIMIT_HEADERS_IETF_DRAFT",
		"RATELIMIT_STORE_BACKEND", "RATELIMIT_STORE_ON_ERROR", "RATELIMIT_STORE_TIMEOUT", "RATELIMIT_STORE_MAX_KEYS",
		"RATELIMIT_SERVER_READ_HEADER_TIMEOUT", "RATELIMIT_SERVER_READ_TIMEOUT", "RATELIMIT_UPSTREAM_TIMEOUT", "RATELIMIT_SERVER_IDLE_TIMEOUT",
		"RATELIMIT_GRPC_UPSTREAM_TIMEOUT",
		"RATELIMIT_SERVER_DRAIN_TIMEOUT", "RATELIMIT_SERVER_SHUTDOWN_DELAY", "RATELIMIT_SERVER_MAX_HEADER_BYTES", "RATELIMIT_LOG_LEVEL",
		"RATELIMIT_LOG_ACCESS", "RATELIMIT_LOG_PSEUDONYM_SECRET_ENV",
		"RATELIMIT_STORE_REPLICAS", "RATELIMIT_STORE_DYNAMODB_TABLE", "RATELIMIT_STORE_DYNAMODB_REGION",
		"RATELIMIT_STORE_DYNAMODB_ENDPOINT", "RATELIMIT_STORE_DYNAMODB_CREATE_TABLE",
		"RATELIMIT_STORE_DYNAMODB_MODE", "RATELIMIT_STORE_DYNAMODB_DENY_CACHE", "RATELIMIT_STORE_DYNAMODB_SLOT_LEASE", "RATELIMIT_STORE_DYNAMODB_NAMESPACE",
		"RATELIMIT_UPSTREAM_PROTOCOL", "RATELIMIT_SERVER_MAX_CONCURRENT_STREAMS",
		"RATELIMIT_TLS_CERT_FILE", "RATELIMIT_TLS_KEY_FILE", "RATELIMIT_TLS_CLIENT_CA_FILE",
		"RATELIMIT_RLS_LISTEN", "RATELIMIT_RLS_CONFIG_DIR", "RATELIMIT_RLS_RESPONSE_HEADERS", "RATELIMIT_RLS_SHADOW_MODE",
		"RATELIMIT_METHOD_OVERRIDE",
		"RATELIMIT_UPGRADE_PROTOCOLS", "RATELIMIT_GRPC_ROUTES", "RATELIMIT_SERVER_GRPC_IDLE_TIMEOUT",
		"RATELIMIT_STORE_DYNAMODB_CLOCK_CORRECT", "RATELIMIT_STORE_DYNAMODB_CLOCK_MAX_CORRECTION",
		"RATELIMIT_STORE_DYNAMODB_CLOCK_WARN_OFFSET", "RATELIMIT_STORE_DYNAMODB_CLOCK_MAX_OFFSET",
		"RATELIMIT_PROTECT_CONCURRENCY_ADAPTIVE", "RATELIMIT_PROTECT_CONCURRENCY_LIMIT",
		"RATELIMIT_PROTECT_CONCURRENCY_MIN_LIMIT", "RATELIMIT_PROTECT_CONCURRENCY_MAX_LIMIT",
		"RATELIMIT_PROTECT_CONCURRENCY_QUEUE_TIMEOUT", "RATELIMIT_PROTECT_STATUS",
		"RATELIMIT_PROTECT_MAX_BUFFERED_BODY", "RATELIMIT_PROTECT_STREAM_SHARE", "RATELIMIT_SERVER_WRITE_STALL_TIMEOUT",
		"RATELIMIT_ADMIN_TOKEN_ENV", "RATELIMIT_ADMIN_READ_TOKEN_ENV", "RATELIMIT_ADMIN_TOP_K",
		"RATELIMIT_ADMIN_MAX_EXEMPTIONS",
		"RATELIMIT_ADMIN_HOSTS",
		"RATELIMIT_STORE_REDIS_URL", "RATELIMIT_STORE_REDIS_MODE", "RATELIMIT_STORE_REDIS_ADDRS",
		"RATELIMIT_STORE_REDIS_SENTINEL_MASTER", "RATELIMIT_STORE_REDIS_USERNAME", "RATELIMIT_STORE_REDIS_PASSWORD_ENV",
		"RATELIMIT_STORE_REDIS_KEY_PREFIX", "RATELIMIT_STORE_REDIS_WAIT_REPLICAS",
		"RATELIMIT_TELEMETRY_OTLP_ENDPOINT", "RATELIMIT_TELEMETRY_OTLP_PROTOCOL", "RATELIMIT_TELEMETRY_OTLP_INSECURE",
		"RATELIMIT_TELEMETRY_TRACES_SAMPLE_RATIO", "RATELIMIT_TELEMETRY_METRICS_OTLP", "RATELIMIT_TELEMETRY_METRICS_INTERVAL",
	} {
		if !got[name] {
			t.Errorf("no override %s", name)
		}
	}
	if len(got) != 84 {
		t.Errorf("got %d overrides, want 84: a new field needs a line above", len(got))
	}
}

func TestParseDynamoDBDefaults(t *testing.T) {
	cfg := mustParse(t, minimal+"store: {backend: dynamodb, dynamodb: {table: rate-limits}}\n", noEnv)
	want := DynamoDBConfig{Table: "rate-limits", Mode: "refund", DenyCache: true, SlotLease: 30 * time.Second,
		Clock: ClockConfig{Correct: true, MaxCorrection: 5 * time.Second, WarnOffset: 100 * time.Millisecond}}
	if cfg.Store.DynamoDB == nil || *cfg.Store.DynamoDB != want {
		t.Errorf("got %+v, want %+v", cfg.Store.DynamoDB, want)
	}
	if cfg.Store.Replicas != 0 {
		t.Errorf("got replicas %d, want 0 (no default)", cfg.Store.Replicas)
	}
}

func TestParseDynamoDBExplicitValuesKept(t *testing.T) {
	cfg := mustParse(t, minimal+"store:\n  backend: dynamodb\n  on_error: local\n  replicas: 3\n  dynamodb:\n"+
		"    table: t-1\n    region: us-east-1\n    endpoint: http://127.0.0.1:8000\n    create_table: true\n    mode: transaction\n    deny_cache: false\n    slot_lease: 2m\n"+
		"    clock: {correct: false, max_correction: 1s, warn_offset: 20ms, max_offset: 250ms}\n", noEnv)
	want := DynamoDBConfig{Table: "t-1", Region: "us-east-1", Endpoint: "http://127.0.0.1:8000", CreateTable: true, Mode: "transaction", DenyCache: false, SlotLease: 2 * time.Minute,
		Clock: ClockConfig{Correct: false, MaxCorrection: time.Second, WarnOffset: 20 * time.Millisecond, MaxOffset: 250 * time.Millisecond}}
	if cfg.Store.DynamoDB == nil || *cfg.Store.DynamoDB != want {
		t.Errorf("got %+v, want %+v", cfg.Store.DynamoDB, want)
	}
	if cfg.Store.Replicas != 3 || cfg.Store.OnError != "local" {
		t.Errorf("got replicas %d on_error %q, want 3 and local", cfg.Store.Replicas, cfg.Store.OnError)
	}
}

func TestParseNoDynamoDBBlockUnlessConfigured(t *testing.T) {
	cfg := mustParse(t, minimal, noEnv)
	if cfg.Store.DynamoDB != nil {
		t.Errorf("got %+v, want nil: a default must not create the dynamodb block", cfg.Store.DynamoDB)
	}
}

func TestEnvOverridesDynamoDB(t *testing.T) {
	getenv := env(
		"RATELIMIT_STORE_BACKEND", "dynamodb",
		"RATELIMIT_STORE_ON_ERROR", "local",
		"RATELIMIT_STORE_REPLICAS", "4",
		"RATELIMIT_STORE_DYNAMODB_TABLE", "from-env",
		"RATELIMIT_STORE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000",
		"RATELIMIT_STORE_DYNAMODB_DENY_CACHE", "false",
		"RATELIMIT_STORE_DYNAMODB_CLOCK_CORRECT", "false",
		"RATELIMIT_STORE_DYNAMODB_CLOCK_MAX_OFFSET", "1s",
	)
	cfg := mustParse(t, minimal, getenv)
	want := DynamoDBConfig{Table: "from-env", Endpoint: "http://127.0.0.1:8000", Mode: "refund", DenyCache: false, SlotLease: 30 * time.Second,
		Clock: ClockConfig{Correct: false, MaxCorrection: 5 * time.Second, WarnOffset: 100 * time.Millisecond, MaxOffset: time.Second}}
	if cfg.Store.DynamoDB == nil || *cfg.Store.DynamoDB != want {
		t.Errorf("got %+v, want %+v", cfg.Store.DynamoDB, want)
	}
	if cfg.Store.Replicas != 4 {
		t.Errorf("got replicas %d, want 4", cfg.Store.Replicas)
	}
	if err := cfg.Validate(noEnv); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestEnvOverrideErrors(t *testing.T) {
	getenv := env(
		"RATELIMIT_STORE_TIMEOUT", "soon",
		"RATELIMIT_STORE_MAX_KEYS", "1e6",
		"RATELIMIT_HEADERS_IETF_DRAFT", "yes please",
	)
	_, err := Parse([]byte(minimal), LoadOptions{Getenv: getenv})
	got := errorLines(t, err)
	want := []string{
		`RATELIMIT_HEADERS_IETF_DRAFT: "yes please": must be true or false`,
		`RATELIMIT_STORE_TIMEOUT: "soon": must be a duration such as 500ms, 1m or 2h`,
		`RATELIMIT_STORE_MAX_KEYS: "1e6": must be an integer`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestEnvOverrideDoesNotHideFileTypeError(t *testing.T) {
	// `store: memory` is wrong; an override of store.timeout must not replace it silently.
	_, err := Parse([]byte(minimal+"store: memory\n"), LoadOptions{Getenv: env("RATELIMIT_STORE_TIMEOUT", "1s")})
	got := errorLines(t, err)
	want := []string{`store: "memory": must be a mapping`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestEnvOverrideEnablesJWTBlock(t *testing.T) {
	cfg := mustParse(t, minimal, env("RATELIMIT_IDENTITY_JWT_HS256_SECRET_ENV", "MY_SECRET"))
	if cfg.Identity.JWT == nil || cfg.Identity.JWT.HS256SecretEnv != "MY_SECRET" || cfg.Identity.JWT.Claim != "sub" {
		t.Errorf("got %+v, want jwt with hs256_secret_env MY_SECRET and claim sub", cfg.Identity.JWT)
	}
}

// TestConfigsAreValid loads, validates and compiles every file in configs/.
func TestConfigsAreValid(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no files in configs/")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := Load(f, LoadOptions{Getenv: noEnv})
			if err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(noEnv); err != nil {
				t.Fatalf("Validate:\n%v", err)
			}
			if _, err := Compile(cfg, CompileOptions{Getenv: noEnv}); err != nil {
				t.Fatalf("Compile: %v", err)
			}
		})
	}
}

func TestExampleConfig(t *testing.T) {
	cfg, err := Load("../../configs/example.yaml", LoadOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	set, err := Compile(cfg, CompileOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.AdminListen != "127.0.0.1:9090" || cfg.Upstream != "http://127.0.0.1:3000" {
		t.Errorf("got listen %s admin %s upstream %s, want the documented demo addresses", cfg.Listen, cfg.AdminListen, cfg.Upstream)
	}
	var got []string
	for _, p := range set.Policies() {
		got = append(got, p.Summary)
	}
	want := []string{
		"per-ip: key=ip token_bucket rate=5/s burst=10 enforce overrides=1",
		"per-api-key: key=api_key fixed_window limit=20 window=1m enforce overrides=1",
		"per-user-writes: key=user sliding_window limit=100 window=1m enforce methods=POST,PUT path_prefix=/api/",
		"per-user-strict: key=user sliding_window limit=30 window=1m shadow",
		"account: key=global token_bucket rate=200/s burst=400 enforce",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	// The premium override's hash is that of "demo-premium-key".
	r := newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "demo-premium-key")
	var p Plan
	if err := set.Plan(r, &p); err != nil {
		t.Fatal(err)
	}
	for i, pol := range p.Policies {
		if pol.Name == "per-api-key" {
			if got := p.Charges[i].Limit.Count; got != 1000 {
				t.Errorf("demo-premium-key: got limit %d, want 1000", got)
			}
			return
		}
	}
	t.Errorf("per-api-key not charged for an API key")
}
