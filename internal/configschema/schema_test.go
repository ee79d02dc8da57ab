package configschema

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const repoRoot = "../.."

// TestSchemaUpToDate fails when the checked-in schema is not what the config structs generate
// today, and says how to regenerate it.
func TestSchemaUpToDate(t *testing.T) {
	want, err := Generate("../policy")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(repoRoot, File))
	if err != nil {
		t.Fatalf("%v\nGenerate it with:\n\n\t%s\n", err, RegenerateCommand)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: it differs from what the config structs in internal/policy generate "+
			"(first difference at line %d). Regenerate it with:\n\n\t%s\n\nand commit it.",
			File, firstDiffLine(got, want), RegenerateCommand)
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, File))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("ratelimit-proxy.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("ratelimit-proxy.schema.json")
	if err != nil {
		t.Fatalf("the schema does not compile: %v", err)
	}
	return s
}

// instance reads a YAML file as the JSON value the schema validates.
func instance(data []byte) (any, error) {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(b))
}

func noEnv(string) string { return "" }

// TestSchemaAcceptsGoodConfigs validates every file in configs/ (which the gateway accepts, see
// policy.TestConfigsAreValid) and the README's minimal configuration against the schema.
func TestSchemaAcceptsGoodConfigs(t *testing.T) {
	s := compileSchema(t)
	files, err := filepath.Glob(filepath.Join(repoRoot, "configs", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("got %d files in configs/, want at least 2", len(files))
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The gateway must accept it too, or the test proves nothing.
		cfg, err := policy.Parse(data, policy.LoadOptions{Getenv: noEnv})
		if err == nil {
			err = cfg.Validate(noEnv)
		}
		if err != nil {
			t.Errorf("%s: the gateway rejects it: %v", f, err)
			continue
		}
		v, err := instance(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := s.Validate(v); err != nil {
			t.Errorf("%s: the schema rejects a config the gateway accepts:\n%v", f, err)
		}
	}
}

// schemaCannotTell lists the bad configs (internal/policy/testdata/bad) whose problem spans
// fields or needs parsing the schema cannot do; `ratelimit-proxy validate` catches them. Every
// other bad config must be rejected by the schema, and every one listed here accepted (so the
// list shrinks when the schema learns more). A new bad config that the schema cannot express
// belongs here.
var schemaCannotTell = []string{
	"admin_same_as_listen",       // two fields compared
	"dynamodb_endpoint_bad",      // URL parsing
	"dynamodb_table_missing",     // the table may come from RATELIMIT_STORE_DYNAMODB_TABLE
	"dynamodb_with_memory",       // two fields compared
	"jwt_and_user_header",        // two fields compared
	"jwt_key_missing_file",       // a file read
	"jwt_key_not_rsa",            // a file read
	"jwt_secret_unset",           // an environment variable read
	"log_pseudonym_secret_unset", // an environment variable read
	"key_user_without_identity",  // two fields compared
	"listen_no_port",             // host:port parsing
	"local_without_replicas",     // replicas may come from RATELIMIT_STORE_REPLICAS
	"name_duplicate",             // across policies
	"override_cidr_on_api_key",   // depends on the policy's key
	"override_duplicate",         // across overrides
	"override_on_global",         // depends on the policy's key
	"refill_too_long",            // burst/rate computed
	"window_too_small",           // a duration compared (below 1ms)
	"trusted_proxy_bad",          // CIDR parsing
	"upstream_credentials",       // URL parsing
	"upstream_missing",           // upstream may come from RATELIMIT_UPSTREAM
}

// TestSchemaOnBadConfigs runs every bad config of internal/policy's tests through the schema.
func TestSchemaOnBadConfigs(t *testing.T) {
	s := compileSchema(t)
	files, err := filepath.Glob(filepath.Join("..", "policy", "testdata", "bad", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 30 {
		t.Fatalf("got %d bad configs, want at least 30", len(files))
	}
	seen := map[string]bool{}
	rejected := 0
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		seen[name] = true
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		v, err := instance(data)
		if err != nil {
			// Not YAML at all (yaml_syntax, yaml_duplicate_key): no schema is consulted.
			continue
		}
		err = s.Validate(v)
		cannot := slices.Contains(schemaCannotTell, name)
		switch {
		case err == nil && !cannot:
			t.Errorf("%s: the schema accepts it (%s): tighten the schema in internal/configschema, or add %q to schemaCannotTell if it cannot express the rule",
				f, firstLine(data), name)
		case err != nil && cannot:
			t.Errorf("%s: the schema now rejects it; remove %q from schemaCannotTell:\n%v", f, name, err)
		case err != nil:
			rejected++
		}
	}
	for _, name := range schemaCannotTell {
		if !seen[name] {
			t.Errorf("schemaCannotTell lists %s, which has no file in internal/policy/testdata/bad", name)
		}
	}
	t.Logf("the schema rejects %d of %d bad configs; %d need validate", rejected, len(files), len(schemaCannotTell))
}

func firstLine(b []byte) string {
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Scan()
	return s.Text()
}

// TestSchemaAcceptsValidVariants covers what configs/ does not: the shared store, JWT, every
// algorithm with overrides, header keys, unquoted numbers where strings belong. Each must pass
// the gateway's own validation first.
func TestSchemaAcceptsValidVariants(t *testing.T) {
	s := compileSchema(t)
	t.Setenv("DOCS_TEST_SECRET", strings.Repeat("s", 32))
	const head = "upstream: http://127.0.0.1:3000\n"
	variants := map[string]string{
		"dynamodb": head + `store:
  backend: dynamodb
  on_error: local
  replicas: 3
  timeout: 1.5s
  dynamodb: {table: rate-limits, region: ap-northeast-1, endpoint: "http://127.0.0.1:8000", create_table: true, mode: transaction, deny_cache: false}
policies: [{name: a, key: ip, algorithm: token_bucket, rate: 0.5/s, burst: 1}]
`,
		"jwt": head + `identity:
  jwt: {claim: sub, hs256_secret_env: DOCS_TEST_SECRET, issuer: me, audience: you, leeway: 0s}
  ipv6_prefix: 128
headers: {reset: delta, ietf_draft: true}
server: {shutdown_delay: 0s, drain_timeout: 1m30s, max_header_bytes: 1024}
log: {level: debug}
policies: [{name: u, key: user, algorithm: sliding_window, limit: 10, window: 1h}]
`,
		"every algorithm": head + `trusted_proxies: [10.0.0.0/8, 192.168.1.1]
policies:
  - {name: 2024, key: "header:X-Tenant", algorithm: leaky_bucket, rate: 10/m, burst: 5, mode: shadow}
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 5/s
    burst: 10
    match: {methods: [GET, POST], path_prefix: /api/}
    overrides:
      - {key: 10.1.0.0/16, rate: 50/s}
      - {key: "2001:db8::/32", unlimited: true}
      - {key: "sha256:24fdfedfe3f3458eae8dfd32a021ba503cb73dca09e14591a41821f5f9af91fe", burst: 100}
  - name: fw
    key: api_key
    algorithm: fixed_window
    limit: 100
    window: 1m
    overrides:
      - {key: "sha256:24fdfedfe3f3458eae8dfd32a021ba503cb73dca09e14591a41821f5f9af91fe", limit: 1000, window: 1h}
  - {name: all, key: global, algorithm: sliding_window, limit: 1000, window: 10s}
  - {name: inflight, key: api_key, algorithm: concurrency, limit: 8, overrides: [{key: "sha256:24fdfedfe3f3458eae8dfd32a021ba503cb73dca09e14591a41821f5f9af91fe", limit: 64}]}
  - {name: failures, key: ip, algorithm: token_bucket, rate: 5/m, burst: 5, charge_on: [401, "403", 5xx]}
`,
	}
	for name, y := range variants {
		t.Run(name, func(t *testing.T) {
			cfg, err := policy.Parse([]byte(y), policy.LoadOptions{Getenv: os.Getenv})
			if err == nil {
				err = cfg.Validate(os.Getenv)
			}
			if err != nil {
				t.Fatalf("the gateway rejects the variant, fix the test: %v", err)
			}
			v, err := instance([]byte(y))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Validate(v); err != nil {
				t.Errorf("the schema rejects a config the gateway accepts:\n%v", err)
			}
		})
	}
}
