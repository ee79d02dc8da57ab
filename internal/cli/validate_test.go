package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runValidate(t *testing.T, yaml string, env map[string]string) (code int, stdout, stderr string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	code = Run(context.Background(), []string{"validate", "--config", path}, &out, &errs, func(k string) string { return env[k] }, Options{})
	return code, strings.ReplaceAll(out.String(), path, "FILE"), strings.ReplaceAll(errs.String(), path, "FILE")
}

// TestValidateSummarisesEverything: a good file's report counts in words that fit ("1 policy"),
// and summarises protect and the operators' console besides the policies.
func TestValidateSummarisesEverything(t *testing.T) {
	code, out, errs := runValidate(t, `upstream: http://127.0.0.1:3000
admin: {token_env: ADMIN_TOKEN, read_token_env: READ_TOKEN, top_k: 50, hosts: [gw.internal]}
protect:
  concurrency: {limit: 80, queue_timeout: 50ms}
  priorities:
    - {name: critical, match: {path_prefix: /pay}, reserve: 0.2}
    - {name: sheddable, match: {path_prefix: /reports}}
policies:
  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}
`, map[string]string{"ADMIN_TOKEN": "0123456789abcdef0123456789abcdef", "READ_TOKEN": "fedcba9876543210fedcba9876543210"})
	want := `FILE: ok, 1 policy
  p: key=ip token_bucket rate=1/s burst=1 enforce
  protect: adaptive limit=80 min_limit=2 max_limit=1000 queue_timeout=50ms status=503 max_buffered_body=65536 stream_share=0.1 priorities=critical(reserve=0.2),sheddable
  admin: 127.0.0.1:9090 writes=token:$ADMIN_TOKEN reads=token:$READ_TOKEN top_k=50 max_exemptions=1000 hosts=gw.internal
`
	if code != 0 || out != want {
		t.Errorf("exit %d, got\n%s%s\nwant\n%s", code, out, errs, want)
	}
	if strings.Contains(out, "0123456789abcdef") || strings.Contains(out, "fedcba98") {
		t.Error("the report shows a token")
	}

	code, out, _ = runValidate(t, "upstream: http://x\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n  - {name: b, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil)
	if code != 0 || !strings.HasPrefix(out, "FILE: ok, 2 policies\n") || !strings.Contains(out, "\n  protect: off\n  admin: 127.0.0.1:9090 writes=off reads=open top_k=100 max_exemptions=1000\n") {
		t.Errorf("exit %d, got\n%s", code, out)
	}
}

// TestValidateReportsEveryProblemWithItsPlace: a bad file's report is every problem at once,
// each at FILE:LINE:COL.
func TestValidateReportsEveryProblemWithItsPlace(t *testing.T) {
	code, out, errs := runValidate(t, "upstream: http://x\nstore: {timeot: 1s, on_error: maybe}\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/x, burst: 1}\n", nil)
	want := `FILE: invalid
  FILE:2:9: store.timeot: unknown field (did you mean "timeout"?)
  FILE:2:31: store.on_error: "maybe": must be allow, deny or local
  FILE:4:55: policies[0].rate: "1/x": unit must be s, m or h
`
	if code != 1 || out != "" || errs != want {
		t.Errorf("exit %d, got\n%s%s\nwant\n%s", code, out, errs, want)
	}
}

// TestValidateSummarisesRLS: the rate limit service's line counts its rules and files in
// words that fit, and says "domain" for one ("in domain edge", not "in domains edge").
func TestValidateSummarisesRLS(t *testing.T) {
	dir := t.TempDir()
	rule := "domain: %s\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(fmt.Sprintf(rule, "edge")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := "store: {backend: memory}\nrls: {listen: 127.0.0.1:8081, config_dir: " + dir + "}\n"
	code, out, errs := runValidate(t, cfg, nil)
	if want := "\n  rls: 1 rule in domain edge from 1 file of " + dir + "\n"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d, got\n%s%s\nwant the line %q", code, out, errs, want)
	}
	if err := os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(fmt.Sprintf(rule, "api")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runValidate(t, cfg, nil)
	if want := "\n  rls: 2 rules in domains api, edge from 2 files of " + dir + "\n"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("exit %d, got\n%s%s\nwant the line %q", code, out, errs, want)
	}
}
