package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
)

// The rls block: its own fields are checked here, the files of rls.config_dir by
// internal/envoyrules (whose tests hold the rule format's).

// rlsDir writes files (name → content) into a fresh folder and returns it.
func rlsDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// rlsConfig is an RLS-only configuration for dir.
func rlsConfig(t *testing.T, dir, extra string) *Config {
	t.Helper()
	cfg, err := Parse([]byte("admin_listen: 127.0.0.1:9090\nrls:\n  listen: 127.0.0.1:8081\n  config_dir: "+dir+"\n"+extra), LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRLSOnlyConfig(t *testing.T) {
	dir := rlsDir(t, map[string]string{"a.yaml": "domain: d\n"})
	// admin_listen, store and rls: complete, no upstream, listen or policies.
	if err := rlsConfig(t, dir, "store:\n  backend: memory\n").Validate(nil); err != nil {
		t.Fatalf("RLS-only config: %v", err)
	}
	err := rlsConfig(t, dir, "policies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n").Validate(nil)
	if err == nil || !strings.Contains(err.Error(), "policies: set, but upstream is empty") {
		t.Errorf("policies without upstream: got %v", err)
	}
	cfg := rlsConfig(t, dir, "")
	cfg.RLS.Listen = cfg.AdminListen
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), "rls.listen: \"127.0.0.1:9090\": must differ from admin_listen") {
		t.Errorf("rls.listen = admin_listen: got %v", err)
	}
	cfg = rlsConfig(t, dir, "")
	cfg.RLS.ConfigDir = filepath.Join(dir, "missing")
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), "rls.config_dir: ") {
		t.Errorf("missing folder: got %v", err)
	}
	cfg = rlsConfig(t, dir, "")
	cfg.RLS.ResponseHeaders = "draft"
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), `rls.response_headers: "draft"`) {
		t.Errorf("response_headers draft: got %v", err)
	}
	// Without rls, upstream stays required.
	cfg = rlsConfig(t, dir, "")
	cfg.RLS = nil
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), "upstream: required") {
		t.Errorf("no upstream, no rls: got %v", err)
	}
}

// TestRLSFileProblemsAreConfigErrors: the problems of the rule files are the configuration's
// Errors, in the files' order and after the rls block's own, each naming its file and field.
func TestRLSFileProblemsAreConfigErrors(t *testing.T) {
	dir := rlsDir(t, map[string]string{
		"a.yaml": "domain: d\n",
		"b.yml":  "domain: d\n",
		"c.yaml": "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: days, requests_per_unit: 1}\n",
	})
	cfg := rlsConfig(t, dir, "")
	cfg.RLS.ResponseHeaders = "draft"
	var es Errors
	if err := cfg.Validate(nil); !errors.As(err, &es) {
		t.Fatalf("got %v, want Errors", err)
	}
	want := Errors{
		{Line: 3, Col: 3, Path: "rls.response_headers", Value: "draft", Msg: "must be ietf, x-ratelimit, all or none"},
		{File: filepath.Join(dir, "b.yml"), Line: 1, Col: 9, Path: "domain", Value: "d", Msg: "also the domain of " + filepath.Join(dir, "a.yaml") + ": each domain is in one file"},
		{File: filepath.Join(dir, "c.yaml"), Line: 4, Col: 24, Path: "descriptors[0].rate_limit.unit", Value: "days", Msg: "must be second, minute, hour, day, week, month or year"},
	}
	if !reflect.DeepEqual(es, want) {
		t.Errorf("got\n%#v\nwant\n%#v", es, want)
	}
}

// TestRLSRulesInTheStoreNamespace: store.dynamodb.namespace reaches the rules, whose keys it
// scopes as it scopes the policies'.
func TestRLSRulesInTheStoreNamespace(t *testing.T) {
	dir := rlsDir(t, map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"})
	key := func(r *envoyrules.Rules) bucket.Key {
		t.Helper()
		e := []envoyrules.Entry{{Key: "k", Value: "v"}}
		tg, err := r.Charge("a", e)
		if err != nil {
			t.Fatal(err)
		}
		return tg.Charge.Key
	}
	compiled := func(extra string) *envoyrules.Rules {
		t.Helper()
		set, err := Compile(rlsConfig(t, dir, extra), CompileOptions{Getenv: func(string) string { return "" }})
		if err != nil {
			t.Fatal(err)
		}
		return set.RLS()
	}
	loaded := func(ns string) *envoyrules.Rules {
		t.Helper()
		r, problems, err := envoyrules.Load(dir, envoyrules.Options{Namespace: ns})
		if err != nil || problems != nil {
			t.Fatal(err, problems)
		}
		return r
	}
	spaced := compiled("store:\n  backend: dynamodb\n  dynamodb: {table: rate-limits, region: us-east-1, namespace: team}\n")
	if got, want := key(spaced), key(loaded("team")); got != want {
		t.Errorf("namespace team: key %s, want the rules' in namespace team %s", got, want)
	}
	if got, want := key(compiled("")), key(loaded("")); got != want {
		t.Errorf("no namespace: key %s, want %s", got, want)
	}
	if key(spaced) == key(compiled("")) {
		t.Error("a namespace leaves the rules' keys as they were")
	}
}

// TestRLSLabelClashesWithPolicy: a proxy policy named like an RLS rule's label (the name both
// count under in ratelimit_requests_total{policy} and the operators' console names them by)
// would merge the two in every series and in the console: the configuration is refused,
// naming the policy and the rule's domain. So is a policy named like a domain's override label.
func TestRLSLabelClashesWithPolicy(t *testing.T) {
	dir := rlsDir(t, map[string]string{"edge.yaml": "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"})
	base := "listen: 127.0.0.1:8080\nupstream: http://127.0.0.1:3000\n"
	pol := func(name string) string {
		return "policies:\n  - {name: " + name + ", key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"
	}
	if err := rlsConfig(t, dir, base+pol("edge.other")).Validate(nil); err != nil {
		t.Fatalf("distinct names: %v", err)
	}
	err := rlsConfig(t, dir, base+pol("edge.api_key")).Validate(nil)
	if err == nil || !strings.Contains(err.Error(), `policies[0].name: "edge.api_key": an rls rule of domain "edge" counts under this name`) {
		t.Errorf("a policy named like an rls label: got %v", err)
	}
	err = rlsConfig(t, dir, base+pol("edge.override")).Validate(nil)
	if err == nil || !strings.Contains(err.Error(), `policies[0].name: "edge.override": an rls rule of domain "edge" counts under this name`) {
		t.Errorf("a policy named like a domain's override label: got %v", err)
	}
}

// TestOneLimitCheckForBothFormats: the same limit written in both formats gets the same
// problem from the one check they share (limitterms.CheckLimit): a token bucket of 1/h with a
// burst of 10,000 (a refill of 416 days), a monthly quota starting on the 29th, and a leased
// token bucket whose ttl outlasts its burst.
func TestOneLimitCheckForBothFormats(t *testing.T) {
	for _, c := range []struct {
		name, policy, rule, field string
	}{
		{"refill", "{name: p, key: ip, algorithm: token_bucket, rate: 1/h, burst: 10000}",
			"{unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 10000}", "burst"},
		{"offset", "{name: p, key: ip, algorithm: quota, limit: 5, period: month, offset: 28}",
			"{unit: month, requests_per_unit: 5, algorithm: quota, offset: 28}", "offset"},
		{"lease", "{name: p, key: ip, algorithm: token_bucket, rate: 10/s, burst: 2, lease: {enabled: true, ttl: 1h}}",
			"{unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 2, lease: {enabled: true, ttl: 1h}}", "lease.ttl"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var pe Errors
			cfg := mustParse(t, "upstream: http://x\npolicies:\n  - "+c.policy+"\n", noEnv)
			if !errors.As(cfg.Validate(noEnv), &pe) || len(pe) != 1 || pe[0].Path != "policies[0]."+c.field {
				t.Fatalf("policy: got %v, want one problem of %s", pe, c.field)
			}
			dir := rlsDir(t, map[string]string{"r.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + c.rule + "\n"})
			var re Errors
			if !errors.As(rlsConfig(t, dir, "").Validate(noEnv), &re) || len(re) != 1 || re[0].Path != "descriptors[0].rate_limit."+c.field {
				t.Fatalf("rule: got %v, want one problem of %s", re, c.field)
			}
			if pe[0].Msg != re[0].Msg || pe[0].Value != re[0].Value {
				t.Errorf("the formats disagree:\npolicy: %s\nrule:   %s", pe[0].Error(), re[0].Error())
			}
		})
	}
}
