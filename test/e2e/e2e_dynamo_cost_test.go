package e2e

// Weighted cost on DynamoDB Local through the real binary: a cost-5 route drains a budget 5 at a
// time on every algorithm whose state lives in the table, across two gateway processes.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// costPolicies: per user, one budget of 22 per algorithm (told apart by path), in which
// POST .../search costs 5 and every other request 1, under a layer `all` that every request
// also pays, with the same costs. Nothing refills within a test run: the token bucket gains one
// token an hour, the windows and the quota are a week, an hour and a day long.
const costPolicies = `identity:
  user_header: X-User-Id
policies:
  - name: all
    key: user
    algorithm: sliding_window
    limit: 100
    window: 1h
    costs: [{methods: [POST], path_prefix: /, cost: 5}]
  - name: tb
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 22
    costs: [{methods: [POST], path_prefix: /tb/search, cost: 5}]
    match: {path_prefix: /tb/}
  - name: fw
    key: user
    algorithm: fixed_window
    limit: 22
    window: 168h
    costs: [{methods: [POST], path_prefix: /fw/search, cost: 5}]
    match: {path_prefix: /fw/}
  - name: sw
    key: user
    algorithm: sliding_window
    limit: 22
    window: 1h
    costs: [{methods: [POST], path_prefix: /sw/search, cost: 5}]
    match: {path_prefix: /sw/}
  - name: qd
    key: user
    algorithm: quota
    limit: 22
    period: day
    costs: [{methods: [POST], path_prefix: /qd/search, cost: 5}]
    match: {path_prefix: /qd/}
`

// rejection is the part of a 429's problem body that says what did not fit.
type rejection struct {
	Policy    string `json:"policy"`
	Cost      int64  `json:"cost"`
	Remaining int64  `json:"remaining"`
}

// TestDynamoCostRouteDrainsBudgetFiveAtATime: two gateways share a table (in refund and in
// transaction mode); requests alternate between them. On each algorithm a search of cost 5
// leaves 17, 12, 7, 2 of a budget of 22; the fifth is refused on DynamoDB's word with 2 left,
// its body naming the policy, the cost 5 that did not fit and the 2 that remain, and a sixth by
// the replica's deny cache; the 2 then go to two requests of cost 1 (1, 0 left), and a third is
// refused. Exactly six requests per algorithm reach the upstream. The layer `all` is paid only
// by admitted requests: 4 x 22 of its 100, so a last request of cost 1 leaves exactly 11.
func TestDynamoCostRouteDrainsBudgetFiveAtATime(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	// The fixed window is a week aligned to the epoch and the quota a UTC day: a run that
	// straddles a boundary would split its requests across two budgets.
	skipNearWeekBoundary(t)
	now := time.Now().UTC()
	if d := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now); d < time.Minute {
		t.Skipf("%s is in the last minute of a UTC day (the quota's period); rerun after it", now.Format(time.TimeOnly))
	}
	for _, mode := range []string{"refund", "transaction"} {
		t.Run(mode, func(t *testing.T) {
			up := newUpstream(t, nil)
			cfg := dynamoStore("e2e-cost-"+randomSuffix(), endpoint, true, "5s", "  on_error: deny\n") +
				"    mode: " + mode + "\n" + costPolicies
			gws := []*gateway{startGateway(t, up.URL, cfg, awsEnv()...), startGateway(t, up.URL, cfg, awsEnv()...)}
			user := "cost-e2e-" + randomSuffix()
			n := 0
			send := func(method, path string) (*http.Response, string) {
				t.Helper()
				n++
				return doMethod(t, method, gws[n%2].proxy+path, "X-User-Id", user)
			}
			for _, alg := range []string{"tb", "fw", "sw", "qd"} {
				before := up.hits.Load()
				for _, want := range []string{"17", "12", "7", "2"} {
					resp, body := send(http.MethodPost, "/"+alg+"/search")
					if got := resp.Header.Get("X-RateLimit-Remaining"); resp.StatusCode != http.StatusOK || got != want {
						t.Fatalf("%s: search: got %d with X-RateLimit-Remaining %q, want 200 with %s (%s)", alg, resp.StatusCode, got, want, body)
					}
				}
				// The fifth search is refused on DynamoDB's word, exactly.
				gw := gws[(n+1)%2]
				resp, body := doMethod(t, http.MethodPost, gw.proxy+"/"+alg+"/search", "X-User-Id", user)
				checkRejection(t, alg+": fifth search", resp, body, rejection{Policy: alg, Cost: 5, Remaining: 2})
				// The sixth, sent to the same replica, is answered by its deny cache without a
				// write: still the cost that did not fit, and what remained (nothing was taken
				// since).
				hits := metric(t, gw.admin, "ratelimit_deny_cache_hits_total")
				resp, body = doMethod(t, http.MethodPost, gw.proxy+"/"+alg+"/search", "X-User-Id", user)
				if got := metric(t, gw.admin, "ratelimit_deny_cache_hits_total") - hits; got != 1 {
					t.Errorf("%s: sixth search: deny cache hits got +%v, want +1", alg, got)
				}
				var got rejection
				if resp.StatusCode != http.StatusTooManyRequests || json.Unmarshal([]byte(body), &got) != nil ||
					got.Policy != alg || got.Cost != 5 || got.Remaining != 2 || resp.Header.Get("X-RateLimit-Remaining") != "2" {
					t.Errorf("%s: sixth search: got %d %s with X-RateLimit-Remaining %q, want 429 of policy %s, cost 5, 2 remaining in both",
						alg, resp.StatusCode, strings.TrimSpace(body), resp.Header.Get("X-RateLimit-Remaining"), alg)
				}
				// A cheaper request still fits what the searches could not use, on either
				// replica, even after a cost-5 refusal of the same key.
				for _, want := range []string{"1", "0"} {
					resp, body := send(http.MethodGet, "/"+alg+"/items")
					if got := resp.Header.Get("X-RateLimit-Remaining"); resp.StatusCode != http.StatusOK || got != want {
						t.Fatalf("%s: request of cost 1: got %d with X-RateLimit-Remaining %q, want 200 with %s (%s)", alg, resp.StatusCode, got, want, body)
					}
				}
				resp, body = send(http.MethodGet, "/"+alg+"/items")
				// A refusal of cost 1 leaves cost and remaining out of the body (they are
				// written only for a cost above 1); the header still says 0.
				checkRejection(t, alg+": third request of cost 1", resp, body, rejection{Policy: alg})
				if got := up.hits.Load() - before; got != 6 {
					t.Errorf("%s: upstream got %d requests, want 6 (4 searches, 2 of cost 1)", alg, got)
				}
			}
			// `all` was paid 22 per algorithm by the admitted requests and nothing by the
			// refused ones (all or nothing across layers): 12 left, 11 after this one.
			resp, body := send(http.MethodGet, "/elsewhere")
			if got := resp.Header.Get("X-RateLimit-Remaining"); resp.StatusCode != http.StatusOK || got != "11" {
				t.Errorf("layer all: got %d with X-RateLimit-Remaining %q, want 200 with 11 (%s)", resp.StatusCode, got, body)
			}
			// Another user has budgets of its own.
			if resp, body := doMethod(t, http.MethodPost, gws[0].proxy+"/tb/search", "X-User-Id", user+"-other"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "17" {
				t.Errorf("another user: got %d with X-RateLimit-Remaining %q, want 200 with 17 (%s)", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), body)
			}
		})
	}
}

// checkRejection asserts a 429 whose problem body and X-RateLimit-Remaining say want.
func checkRejection(t *testing.T, what string, resp *http.Response, body string, want rejection) {
	t.Helper()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%s: got %d, want 429 (%s)", what, resp.StatusCode, body)
	}
	var got rejection
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("%s: body %q: %v", what, body, err)
	}
	if got != want || resp.Header.Get("X-RateLimit-Remaining") != fmt.Sprint(want.Remaining) {
		t.Errorf("%s: got body %s with X-RateLimit-Remaining %q, want policy %s, cost %d, remaining %d in both",
			what, strings.TrimSpace(body), resp.Header.Get("X-RateLimit-Remaining"), want.Policy, want.Cost, want.Remaining)
	}
}
