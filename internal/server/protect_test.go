package server

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// The protect block is read at start: a reload that changes it is reported as needing a
// restart (an adaptive limit that has learnt the upstream must not start over).
func TestReloadReportsProtectNeedsRestart(t *testing.T) {
	r, path, _, logs := newTestReloader(t, baseConfig+"protect: {concurrency: {limit: 20}}\n"+policyYAML("first", 5))
	os.WriteFile(path, []byte(baseConfig+"protect: {concurrency: {limit: 30}}\n"+policyYAML("first", 5)), 0o600)
	if err := r.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	var warned []string
	for _, e := range logs.FilterMessageSnippet("needs a restart").All() {
		warned = append(warned, e.ContextMap()["field"].(string))
	}
	if got := strings.Join(warned, ","); got != "protect" {
		t.Errorf("restart warnings got %q, want protect", got)
	}
}

func TestNewProtection(t *testing.T) {
	if p, err := newProtection(nil, prometheus.NewRegistry()); p != nil || err != nil {
		t.Fatalf("without a block: got %v, %v; want nil, nil", p, err)
	}
	reg := prometheus.NewRegistry()
	p, err := newProtection(&policy.ProtectConfig{Concurrency: policy.ProtectConcurrencyConfig{Limit: 7}, Status: 429}, reg)
	if err != nil || p == nil || p.Status != 429 {
		t.Fatalf("got %+v, %v; want a protection with status 429", p, err)
	}
	if n, err := testutil.GatherAndCount(reg, "ratelimit_upstream_concurrency_limit"); err != nil || n != 1 {
		t.Fatalf("limit gauge: %d series (%v), want 1", n, err)
	}
	if got := testutil.ToFloat64(gaugeOf(t, reg)); got != 7 {
		t.Errorf("ratelimit_upstream_concurrency_limit = %v, want 7", got)
	}
}

func gaugeOf(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ratelimit_upstream_concurrency_limit" {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "copy"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatal("no ratelimit_upstream_concurrency_limit")
	return nil
}
