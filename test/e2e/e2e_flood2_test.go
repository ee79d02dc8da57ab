package e2e

// Issue 26's floods that lock others out, through the binary: keys of one policy (or RLS domain)
// that fill the memory store must not refuse a new key of another (item 7), and limit overrides
// must not grow the metric series with the caller's entry keys (item 8).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// floodRules are two RLS domains: the attacker's descriptors go to flood, a bystander's to calm.
const floodRules = `domain: flood
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
`

const calmRules = `domain: calm
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// startProxyRLS starts a gateway serving both the proxy (rest: its policies) and RLS from a
// folder holding files, and returns it with an RLS client.
func startProxyRLS(t *testing.T, files map[string]string, rest string) (*gateway, pb.RateLimitServiceClient) {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rlsAddr := freePort(t)
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, fmt.Sprintf("rls:\n  listen: %s\n  config_dir: %s\n%s", rlsAddr, dir, rest))
	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return g, pb.NewRateLimitServiceClient(conn)
}

func shouldRateLimit(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// TestFloodRLSDomainLeavesOtherPolicies is issue 26 item 7's first flood: with max_keys 1,000,
// 1,100 RLS calls, each a new descriptor value with hits_addend equal to the limit, filled every
// shard with keys at their limit, and then new client IPs of the proxy's per-IP policy (which
// had never sent a request) got 429. The domain may now hold only its share of max_keys: new
// IPs and new values of another domain are admitted, every flood value stays at its limit, and
// new values of the flooded domain are judged in the memory store's sketch (counted), each at
// its own limit (issue 32 item 6: they shared one overflow bucket, which the flood had spent).
func TestFloodRLSDomainLeavesOtherPolicies(t *testing.T) {
	waitOutHourEdge(t, time.Minute)
	g, rls := startProxyRLS(t, map[string]string{"flood.yaml": floodRules, "calm.yaml": calmRules}, `trusted_proxies: [127.0.0.0/8]
store:
  max_keys: 1000
policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 5/s
    burst: 5
`)
	flood := func(v string, hits uint32) pb.RateLimitResponse_Code {
		return shouldRateLimit(t, rls, &pb.RateLimitRequest{Domain: "flood", HitsAddend: hits,
			Descriptors: []*rlext.RateLimitDescriptor{desc("user", v)}}).GetOverallCode()
	}
	for i := range 1100 {
		flood(fmt.Sprintf("f%d", i), 5)
	}
	c := newClient(t, 10*time.Second)
	for i := range 10 {
		ip := fmt.Sprintf("10.9.0.%d", i+1)
		if a := fetch(c, g.proxy+"/x", "X-Forwarded-For", ip); a.err != nil || a.status != http.StatusOK {
			t.Errorf("a new client IP (%s) after the RLS flood: got %d %v (Retry-After %q), want 200",
				ip, a.status, a.err, a.header.Get("Retry-After"))
		}
	}
	for i := range 10 {
		resp := shouldRateLimit(t, rls, &pb.RateLimitRequest{Domain: "calm", Descriptors: []*rlext.RateLimitDescriptor{desc("user", fmt.Sprintf("c%d", i))}})
		if resp.GetOverallCode() != pb.RateLimitResponse_OK {
			t.Errorf("a new value of another domain after the flood: got %v, want OK", resp.GetOverallCode())
		}
	}
	// No flood value was reset: each is over its limit, stored or in the overflow bucket.
	for i := range 1100 {
		if code := flood(fmt.Sprintf("f%d", i), 1); code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("flood value f%d after the flood: got %v, want OVER_LIMIT (a key at its limit was reset)", i, code)
		}
	}
	fresh := 0
	for i := range 10 {
		if flood(fmt.Sprintf("new-after-flood-%d", i), 5) == pb.RateLimitResponse_OK {
			fresh++
		}
	}
	if fresh < 9 {
		t.Errorf("new values of the flooded domain, each at its own limit: %d of 10 OK, want at least 9", fresh)
	}
	if got := metric(t, g.admin, "ratelimit_memory_overflow_total"); got <= 0 {
		t.Errorf("ratelimit_memory_overflow_total: got %v, want the flood's new keys counted", got)
	}
	if got := metric(t, g.admin, "ratelimit_memory_keys"); got > 1000 {
		t.Errorf("ratelimit_memory_keys: got %v, want at most max_keys (1000)", got)
	}
}

// TestFloodAPIKeysLeavesOtherPolicies is item 7's second flood, the proxy alone: 1,100 distinct
// API keys, each at its limit after one request, locked out new keys of every policy and new
// IPs. Now only the flooded policy's pool fills: new IPs and new keys of another API-key policy
// are admitted, no flooded key is reset, and since issue 32 item 6 the flooded policy's new keys
// are judged in the sketch, each at its own limit (they shared one overflow bucket, spent).
func TestFloodAPIKeysLeavesOtherPolicies(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, `trusted_proxies: [127.0.0.0/8]
store:
  max_keys: 1000
policies:
  - name: api
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 1
    match: {path_prefix: /api/}
  - name: partner
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 1
    match: {path_prefix: /partner/}
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 5/s
    burst: 5
    match: {path_prefix: /ip/}
`)
	c := newClient(t, 30*time.Second)
	as := burst(c, g.proxy+"/api/x", 1100, 16, func(i int) []string { return []string{"X-Api-Key", fmt.Sprintf("k%d", i)} })
	admitted := 0
	for i, a := range as {
		if a.err != nil || a.status != http.StatusOK && a.status != http.StatusTooManyRequests {
			t.Fatalf("flood request %d: got %d %v, want 200 or 429", i, a.status, a.err)
		}
		if a.status == http.StatusOK {
			admitted++
		}
	}
	for i := range 10 {
		ip := fmt.Sprintf("10.8.0.%d", i+1)
		if a := fetch(c, g.proxy+"/ip/x", "X-Forwarded-For", ip); a.err != nil || a.status != http.StatusOK {
			t.Errorf("a new client IP (%s) after the API-key flood: got %d %v (Retry-After %q), want 200",
				ip, a.status, a.err, a.header.Get("Retry-After"))
		}
		if a := fetch(c, g.proxy+"/partner/x", "X-Api-Key", fmt.Sprintf("p%d", i)); a.err != nil || a.status != http.StatusOK {
			t.Errorf("a new key of another policy after the flood: got %d %v (Retry-After %q), want 200",
				a.status, a.err, a.header.Get("Retry-After"))
		}
	}
	// Every flooded key is at its limit (1 an hour): none was reset.
	again := burst(c, g.proxy+"/api/x", 1100, 16, func(i int) []string { return []string{"X-Api-Key", fmt.Sprintf("k%d", i)} })
	for i, a := range again {
		if a.err != nil || a.status != http.StatusTooManyRequests {
			t.Fatalf("flooded key k%d again: got %d %v, want 429 (a key at its limit was reset)", i, a.status, a.err)
		}
	}
	fresh := 0
	for i := range 10 {
		k := fmt.Sprintf("new-after-flood-%d", i)
		if a := fetch(c, g.proxy+"/api/x", "X-Api-Key", k); a.err != nil || a.status != http.StatusOK {
			continue
		}
		fresh++
		a := fetch(c, g.proxy+"/api/x", "X-Api-Key", k)
		if a.err != nil || a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" || !strings.Contains(a.body, "api") {
			t.Errorf("a new key of the flooded policy, again: got %d %v (Retry-After %q), want 429 at its own limit naming the policy",
				a.status, a.err, a.header.Get("Retry-After"))
		}
	}
	if fresh < 9 {
		t.Errorf("new keys of the flooded policy: %d of 10 admitted, want at least 9 (each judged in the sketch at its own limit)", fresh)
	}
	overflow := metric(t, g.admin, "ratelimit_memory_overflow_total")
	t.Logf("flood: %d of 1100 new keys admitted; ratelimit_memory_overflow_total %v; %v keys tracked",
		admitted, overflow, metric(t, g.admin, "ratelimit_memory_keys"))
	if overflow <= 0 {
		t.Errorf("ratelimit_memory_overflow_total: got %v, want the flood's new keys counted", overflow)
	}
}

// TestOverrideFloodKeepsMetricsBounded is item 8 through the binary: calls of one descriptor of
// 64 entries with distinct 16 kB keys and a limit override took the process from 27 MB to 297
// MB and /metrics to 154 MB in 50 calls. Over 200 such calls, the series of
// ratelimit_requests_total, the size of /metrics and the resident memory must stay flat.
func TestOverrideFloodKeepsMetricsBounded(t *testing.T) {
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, "", "")
	scrape := func() (body string, series int) {
		t.Helper()
		resp, err := http.Get(g.admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "ratelimit_requests_total{") {
				series++
			}
		}
		return string(b), series
	}
	override := func(call int) *rlext.RateLimitDescriptor {
		x := &rlext.RateLimitDescriptor{Limit: &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: 2}}
		for e := range 64 {
			key := fmt.Sprintf("k%d.%d.", call, e) + strings.Repeat("x", 16<<10)
			x.Entries = append(x.Entries, &rlext.RateLimitDescriptor_Entry{Key: key, Value: "v"})
		}
		return x
	}
	calls := func(from, to int) {
		for call := from; call < to; call++ {
			g.call(t, &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{override(call)}})
		}
	}
	// Ten calls first: a gateway that labels overrides with their keys has 30 series of a
	// megabyte by then (and would take minutes to serve 200 such calls).
	calls(0, 10)
	if _, n := scrape(); n > 3 {
		t.Fatalf("ratelimit_requests_total: %d series after 10 override calls of distinct keys, want 3 (allowed, limited, shadow_limited of e2e.override)", n)
	}
	// Then up to 100 calls grow the heap to what the collector lets a megabyte of garbage per
	// call reach (the gateway runs with GOGC 400); the next 100 must not grow anything.
	calls(10, 100)
	body0, series0 := scrape()
	rss0 := metric(t, g.admin, "process_resident_memory_bytes")
	calls(100, 200)
	body1, series1 := scrape()
	rss1 := metric(t, g.admin, "process_resident_memory_bytes")
	t.Logf("override calls 100 -> 200: ratelimit_requests_total series %d -> %d, /metrics %d -> %d bytes, RSS %.1f -> %.1f MiB",
		series0, series1, len(body0), len(body1), rss0/(1<<20), rss1/(1<<20))
	if series1 != series0 || series1 > 3 {
		t.Errorf("ratelimit_requests_total series: %d after 100 override calls, %d after 200; want the same 3 (allowed, limited, shadow_limited of e2e.override)", series0, series1)
	}
	if len(body1) > len(body0)+4<<10 || len(body1) > 1<<20 {
		t.Errorf("/metrics: %d bytes after 100 override calls, %d after 200; want flat and under 1 MiB", len(body0), len(body1))
	}
	if strings.Contains(body1, "xxxx") {
		t.Error("/metrics carries a caller's entry key")
	}
	if growth := rss1 - rss0; growth > 32<<20 {
		t.Errorf("resident memory grew by %.1f MiB over the second 100 override calls; want flat (at most 32 MiB)", growth/(1<<20))
	}
}
