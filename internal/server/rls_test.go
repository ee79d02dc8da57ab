package server

import (
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/rls"
)

// TestRLSAndProxyShareMetricFamilies: the rate limit service counts in the proxy's
// ratelimit_requests_total, ratelimit_store_* and ratelimit_release_errors_total families, which
// only works while both declare them alike (name, help, labels); whichever registers first.
func TestRLSAndProxyShareMetricFamilies(t *testing.T) {
	reg := proxy.NewRegistry()
	proxy.NewMetrics(reg) // panics on a mismatch
	if _, err := rls.NewMetrics(reg); err != nil {
		t.Fatalf("rls after proxy: %v", err)
	}
	reg = proxy.NewRegistry()
	if _, err := rls.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("proxy after rls: %v", r)
		}
	}()
	proxy.NewMetrics(reg)
}
