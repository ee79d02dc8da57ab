package policy

import (
	"strings"
	"testing"
)

// TestAdminBlockValidation checks that every problem of the admin block is reported with its
// field, and that a token is never quoted.
func TestAdminBlockValidation(t *testing.T) {
	const secret = "s3cr3t-token-value-0123456789"
	env := map[string]string{"GOOD": secret, "SHORT": "abc"}
	getenv := func(k string) string { return env[k] }
	cases := []struct {
		admin AdminConfig
		want  []string // substrings of the error; none: valid
	}{
		{AdminConfig{TopK: 100, MaxExemptions: 1000}, nil},
		{AdminConfig{TopK: 100, MaxExemptions: 1000, TokenEnv: "GOOD", ReadTokenEnv: "GOOD"}, nil},
		{AdminConfig{TopK: 0, MaxExemptions: 1000}, []string{`admin.top_k: "0": must be from 1 to 10000`}},
		{AdminConfig{TopK: 10001, MaxExemptions: 1000}, []string{`admin.top_k: "10001"`}},
		{AdminConfig{TopK: 100, MaxExemptions: 0}, []string{`admin.max_exemptions: "0": must be from 1 to 5000`}},
		{AdminConfig{TopK: 100, MaxExemptions: 5001}, []string{`admin.max_exemptions: "5001"`}},
		{AdminConfig{TopK: 5, TokenEnv: "MISSING"}, []string{`admin.token_env: "MISSING": environment variable is not set or empty`}},
		{AdminConfig{TopK: 5, ReadTokenEnv: "SHORT"}, []string{`admin.read_token_env: "SHORT": token must be at least 16 bytes`}},
		{AdminConfig{TopK: 5, TokenEnv: secret + "-x"}, []string{`admin.token_env: environment variable is not set`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"console.example.com", "Console.Example.COM.", "10.0.0.7", "[fd00::7]", "fd00::8", "admin_svc.ns.svc"}}, nil},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"console.example.com:9090"}}, []string{`admin.hosts[0]: "console.example.com:9090": want a host name without a port`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"ok.example", "http://console.example.com"}}, []string{`admin.hosts[1]: "http://console.example.com": want a host name, without scheme or path`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"*.example.com"}}, []string{`admin.hosts[0]: "*.example.com": wildcards are not accepted`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{""}}, []string{`admin.hosts[0]: empty`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"0.0.0.0"}}, []string{`admin.hosts[0]: "0.0.0.0": an unspecified address names no host`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"a..b"}}, []string{`admin.hosts[0]: "a..b": want a DNS name`}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: []string{"caf\u00e9.example"}}, []string{`admin.hosts[0]: "café.example": character 'é'`, "xn--"}},
		{AdminConfig{TopK: 5, MaxExemptions: 1000, Hosts: make([]string, 101)}, []string{`admin.hosts: "101 names": at most 100`}},
	}
	for _, tc := range cases {
		var es Errors
		checkAdmin(&es, &tc.admin, getenv)
		got := es.Error()
		if len(tc.want) == 0 && len(es) > 0 {
			t.Errorf("%+v: got %q, want no error", tc.admin, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: got %q, want it to contain %q", tc.admin, got, w)
			}
		}
		if strings.Contains(got, secret) {
			t.Errorf("%+v: the error quotes a token: %q", tc.admin, got)
		}
	}
}

// TestAdminDefaults checks that a file without an admin block gets top_k 100 and no tokens.
func TestAdminDefaults(t *testing.T) {
	cfg, err := Parse([]byte("upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"), LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Admin.TopK != 100 || cfg.Admin.TokenEnv != "" {
		t.Fatalf("admin block %+v, want top_k 100 and no token", cfg.Admin)
	}
	if err := cfg.Validate(func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
}
