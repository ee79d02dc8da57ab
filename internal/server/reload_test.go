package server

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const baseConfig = "upstream: http://127.0.0.1:3000\n"

func policyYAML(name string, burst int) string {
	return "policies:\n  - name: " + name + "\n    key: ip\n    algorithm: token_bucket\n    rate: 1/s\n    burst: " +
		strconv.Itoa(burst) + "\n"
}

func newTestReloader(t *testing.T, content string) (*Reloader, string, *prometheus.Registry, *observer.ObservedLogs) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	noEnv := func(string) string { return "" }
	r, _, err := NewReloader(path, policy.LoadOptions{Getenv: noEnv}, policy.CompileOptions{Getenv: noEnv}, zap.New(core), reg)
	if err != nil {
		t.Fatalf("NewReloader: %v", err)
	}
	return r, path, reg, logs
}

func reloads(t *testing.T, r *Reloader, result string) float64 {
	t.Helper()
	return testutil.ToFloat64(r.reloads.WithLabelValues(result))
}

func TestReloaderSwapsOnlyValidChanges(t *testing.T) {
	r, path, _, logs := newTestReloader(t, baseConfig+policyYAML("first", 5))
	first := r.Set()

	// Unchanged content: nothing happens (no swap, nothing counted).
	if err := r.Reload(); err != nil {
		t.Fatalf("reload of an unchanged file: %v", err)
	}
	if r.Set() != first || reloads(t, r, "success") != 0 {
		t.Fatalf("an unchanged file was reloaded (success count %v)", reloads(t, r, "success"))
	}

	// Invalid content: an error naming the field, counted, and the running set stays.
	os.WriteFile(path, []byte(baseConfig+"policies:\n  - name: bad\n    key: ip\n    algorithm: token_bucket\n    rate: 10/x\n    burst: 5\n"), 0o600)
	err := r.Reload()
	if err == nil || !strings.Contains(err.Error(), `policies[0].rate: "10/x"`) {
		t.Fatalf("invalid reload error got %v, want one naming policies[0].rate", err)
	}
	if r.Set() != first {
		t.Fatal("an invalid file replaced the running policies")
	}
	if got := reloads(t, r, "error"); got != 1 {
		t.Errorf("error reloads got %v, want 1", got)
	}

	// Valid new content: swapped in.
	os.WriteFile(path, []byte(baseConfig+policyYAML("second", 7)), 0o600)
	if err := r.Reload(); err != nil {
		t.Fatalf("valid reload: %v", err)
	}
	if got := r.Set().Policies()[0].Name; got != "second" {
		t.Errorf("policy after reload got %q, want second", got)
	}
	if got := reloads(t, r, "success"); got != 1 {
		t.Errorf("success reloads got %v, want 1", got)
	}

	// A change to a restart-only field is applied to policies but reported, not silently taken.
	os.WriteFile(path, []byte("upstream: http://127.0.0.1:4000\nlisten: 127.0.0.1:8081\n"+policyYAML("third", 7)), 0o600)
	if err := r.Reload(); err != nil {
		t.Fatalf("reload with a changed upstream: %v", err)
	}
	var warned []string
	for _, e := range logs.FilterMessageSnippet("needs a restart").All() {
		warned = append(warned, e.ContextMap()["field"].(string))
	}
	if got := strings.Join(warned, ","); got != "listen,upstream" {
		t.Errorf("restart warnings got %q, want listen,upstream", got)
	}
}

func TestNewReloaderRefusesAnInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	os.WriteFile(path, []byte("policies: []\n"), 0o600)
	noEnv := func(string) string { return "" }
	_, _, err := NewReloader(path, policy.LoadOptions{Getenv: noEnv}, policy.CompileOptions{Getenv: noEnv}, zap.NewNop(), nil)
	if err == nil || !strings.Contains(err.Error(), "upstream") {
		t.Fatalf("got %v, want an error naming upstream", err)
	}
}
