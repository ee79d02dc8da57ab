package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// TestWeightedRejectionSaysWhatDidNotFit: a cost-5 policy over a budget of 12 on the real memory
// store admits two requests (7, then 2 left) and rejects the third, whose 429 says in the headers
// and the problem body that it costs 5 and 2 remain; the cached rendering of a repeated
// rejection says the same.
func TestWeightedRejectionSaysWhatDidNotFit(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 12, Window: time.Hour}
	pol := &fakePolicies{
		policies: []*policy.Policy{{Name: "search", Limit: l, Cost: 5}},
		charges:  []bucket.Charge{{Key: testKey(1), Limit: l, Cost: 5}},
	}
	mem := memstore.New(memstore.Options{})
	hs := newHarness(t, pol, newFakeLimiter(true), nil, func(o *Options) { o.Limiter = mem })
	for _, want := range []string{"7", "2"} {
		resp, _ := hs.get("/search")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Fatalf("got %d with X-RateLimit-Remaining %q, want 200 with %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want)
		}
	}
	for i := range 2 {
		resp, body := hs.get("/search")
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("rejection %d: got status %d, want 429", i, resp.StatusCode)
		}
		if got := resp.Header.Get("X-RateLimit-Remaining"); got != "2" {
			t.Errorf("rejection %d: got X-RateLimit-Remaining %q, want 2 (left, but less than the cost)", i, got)
		}
		var p struct {
			Detail    string `json:"detail"`
			Cost      int64  `json:"cost"`
			Remaining int64  `json:"remaining"`
		}
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatalf("rejection %d: body %q: %v", i, body, err)
		}
		if p.Cost != 5 || p.Remaining != 2 || !strings.Contains(p.Detail, "the request costs 5 and 2 remain") {
			t.Errorf("rejection %d: got body %s, want cost 5, remaining 2 and a detail saying so", i, body)
		}
	}
	// A gRPC call of the same policy is refused as RESOURCE_EXHAUSTED with the same numbers in
	// its metadata (rendered fresh, then from the policy's cache).
	for i := range 2 {
		res, body := grpcGet(hs)
		wantGRPCStatus(t, res, body, "8")
		if got := res.Header.Get("X-RateLimit-Remaining"); got != "2" {
			t.Errorf("gRPC rejection %d: got X-RateLimit-Remaining %q, want 2", i, got)
		}
	}
	if got := hs.up.hits.Load(); got != 2 {
		t.Errorf("upstream got %d requests, want 2", got)
	}
}

// TestUnweightedRejectionBodyUnchanged: a rejection of cost 1 carries neither cost nor remaining.
func TestUnweightedRejectionBodyUnchanged(t *testing.T) {
	got := string(answer.AppendProblem(nil, answer.Problem{Type: answer.ProblemRateLimited, Status: http.StatusTooManyRequests, Policy: "p", RetryAfter: 3, Cost: 1}))
	if strings.Contains(got, "cost") || strings.Contains(got, "remaining") {
		t.Errorf("got %s, want no cost or remaining member", got)
	}
}
