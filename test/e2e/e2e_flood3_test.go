package e2e

// Issue 32 item 6 through the binary: a flood of keys at their limit must leave the flooded
// policy's (or RLS domain's) fresh clients their own limits, not one shared overflow bucket.

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestFloodLeavesFreshAPIKeysTheirLimits: 1,500 requests from 10 addresses, each with a new API
// key that one request brings to its limit (1 an hour), into max_keys 1,000. On main every
// fresh API key, which had never sent a request, then got 429 until the bucket refilled: they
// all shared the policy's overflow bucket, which the flood had spent (failed first on main: 0 of
// 10). Now at least 9 of 10 are admitted while the flood lasts, each then at its own limit,
// and every flood key is still at its limit.
func TestFloodLeavesFreshAPIKeysTheirLimits(t *testing.T) {
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
`)
	c := newClient(t, 30*time.Second)
	from := func(i int) []string {
		return []string{"X-Api-Key", fmt.Sprintf("k%d", i), "X-Forwarded-For", fmt.Sprintf("10.7.0.%d", i%10+1)}
	}
	flood := burst(c, g.proxy+"/x", 1500, 16, from)
	for i, a := range flood {
		if a.err != nil || a.status != http.StatusOK && a.status != http.StatusTooManyRequests {
			t.Fatalf("flood request %d: got %d %v, want 200 or 429", i, a.status, a.err)
		}
	}
	admitted := 0
	for i := range 10 {
		k := fmt.Sprintf("fresh%d", i)
		a := fetch(c, g.proxy+"/x", "X-Api-Key", k, "X-Forwarded-For", "10.7.0.1")
		if a.err != nil || a.status != http.StatusOK {
			t.Logf("fresh key %d: got %d %v (Retry-After %q)", i, a.status, a.err, a.header.Get("Retry-After"))
			continue
		}
		admitted++
		if a := fetch(c, g.proxy+"/x", "X-Api-Key", k, "X-Forwarded-For", "10.7.0.1"); a.err != nil || a.status != http.StatusTooManyRequests {
			t.Errorf("fresh key %d's second request: got %d %v, want 429 (its own limit is 1 an hour)", i, a.status, a.err)
		}
	}
	t.Logf("%d of 10 fresh API keys admitted after the flood; ratelimit_memory_overflow_total %v; %v keys tracked",
		admitted, metric(t, g.admin, "ratelimit_memory_overflow_total"), metric(t, g.admin, "ratelimit_memory_keys"))
	if admitted < 9 {
		t.Errorf("fresh API keys of the flooded policy: %d of 10 admitted, want at least 9", admitted)
	}
	if got := metric(t, g.admin, "ratelimit_memory_overflow_total"); got < 400 {
		t.Errorf("ratelimit_memory_overflow_total: got %v, want the flood's keys past the store judged in the sketch (about 500)", got)
	}
	for i, a := range burst(c, g.proxy+"/x", 1500, 16, from) {
		if a.err != nil || a.status != http.StatusTooManyRequests {
			t.Fatalf("flood key k%d again: got %d %v, want 429 (a key at its limit escaped it)", i, a.status, a.err)
		}
	}
}

// TestFloodRLSLeavesFreshValuesTheirLimits is the same through the RLS into one domain: 1,500
// calls, each a new descriptor value with hits_addend equal to the limit, into max_keys 1,000
// (failed first on main: 0 of 10 fresh values OK). At least 9 of 10 fresh values are OK while
// the flood lasts, each then limited at its own limit, and every flood value is still over it.
func TestFloodRLSLeavesFreshValuesTheirLimits(t *testing.T) {
	waitOutHourEdge(t, time.Minute)
	g := startRLSGateway(t, map[string]string{"flood.yaml": floodRules}, "store:\n  max_keys: 1000\n", "")
	call := func(v string, hits uint32) pb.RateLimitResponse_Code {
		t.Helper()
		return g.call(t, &pb.RateLimitRequest{Domain: "flood", HitsAddend: hits,
			Descriptors: []*rlext.RateLimitDescriptor{desc("user", v)}}).GetOverallCode()
	}
	for i := range 1500 {
		call(fmt.Sprintf("f%d", i), 5)
	}
	ok := 0
	for i := range 10 {
		v := fmt.Sprintf("fresh%d", i)
		if call(v, 1) != pb.RateLimitResponse_OK {
			continue
		}
		ok++
		if call(v, 4) != pb.RateLimitResponse_OK || call(v, 1) != pb.RateLimitResponse_OVER_LIMIT {
			t.Errorf("fresh value %s: want OK up to its limit of 5 an hour, then OVER_LIMIT", v)
		}
	}
	t.Logf("%d of 10 fresh values OK after the flood; ratelimit_memory_overflow_total %v; %v keys tracked",
		ok, metric(t, g.admin, "ratelimit_memory_overflow_total"), metric(t, g.admin, "ratelimit_memory_keys"))
	if ok < 9 {
		t.Errorf("fresh values of the flooded domain: %d of 10 OK, want at least 9", ok)
	}
	for i := range 1500 {
		if code := call(fmt.Sprintf("f%d", i), 1); code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("flood value f%d: got %v, want OVER_LIMIT (a key at its limit escaped it)", i, code)
		}
	}
}
