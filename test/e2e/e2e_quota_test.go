package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestCostRouteDrainsQuotaFiveAtATime: the real binary with a monthly quota of 22 in which a
// search costs 5. Searches drain it 5 at a time (17, 12, 7, 2 left); the fifth is rejected with 2
// left, its body naming the cost that did not fit; X-RateLimit-Reset and RateLimit's t point at
// the first instant of next month in Tokyo. Another key has its own quota, paths outside the
// policy are not charged, and a quota whose costs give searches 5 and the rest 1 lets cheaper
// requests take what a search could not.
func TestCostRouteDrainsQuotaFiveAtATime(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, `headers: {ietf_draft: true}
policies:
  - name: search-monthly
    key: api_key
    algorithm: quota
    limit: 22
    period: month
    time_zone: Asia/Tokyo
    cost: 5
    match: {path_prefix: /search}
  - name: shared-daily
    key: api_key
    algorithm: quota
    limit: 12
    period: day
    costs: [{methods: [POST], path_prefix: /v2/search, cost: 5}]
    match: {path_prefix: /v2/}
`)
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	nextMonth := func() time.Time {
		y, m, _ := time.Now().In(tokyo).Date()
		return time.Date(y, m+1, 1, 0, 0, 0, 0, tokyo)
	}
	before := nextMonth()
	for _, want := range []string{"17", "12", "7", "2"} {
		resp, body := get(t, g.proxy+"/search?q=x", "X-Api-Key", "k1")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Fatalf("got %d with X-RateLimit-Remaining %q, want 200 with %s (%s)", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want, body)
		}
	}
	resp, body := get(t, g.proxy+"/search?q=y", "X-Api-Key", "k1")
	after := nextMonth()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("fifth search: got %d, want 429 (%s)", resp.StatusCode, body)
	}
	var p struct {
		Policy    string `json:"policy"`
		Cost      int64  `json:"cost"`
		Remaining int64  `json:"remaining"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if p.Policy != "search-monthly" || p.Cost != 5 || p.Remaining != 2 || resp.Header.Get("X-RateLimit-Remaining") != "2" {
		t.Errorf("got body %s, X-RateLimit-Remaining %q; want policy search-monthly, cost 5, remaining 2 in both",
			body, resp.Header.Get("X-RateLimit-Remaining"))
	}
	reset, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
	if err != nil || reset != before.Unix() && reset != after.Unix() {
		t.Errorf("got X-RateLimit-Reset %q, want %d, the start of next month in Tokyo", resp.Header.Get("X-RateLimit-Reset"), after.Unix())
	}
	// t is seconds from the decision, rounded up; the decision lies between now-1s and now.
	var tt int64
	if _, err := fmt.Sscanf(resp.Header.Get("RateLimit"), `"search-monthly";r=2;t=%d`, &tt); err != nil {
		t.Fatalf("RateLimit %q: %v", resp.Header.Get("RateLimit"), err)
	}
	if left := int64(time.Until(after).Seconds()); tt < left-2 || tt > left+2 {
		t.Errorf("got RateLimit t=%d, want about %d (seconds until next month in Tokyo)", tt, left)
	}
	if got := resp.Header.Get("Retry-After"); got != strconv.FormatInt(tt, 10) {
		t.Errorf("got Retry-After %q, want %d (the next period start, like t)", got, tt)
	}
	if resp, _ := get(t, g.proxy+"/search", "X-Api-Key", "k2"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "17" {
		t.Errorf("another key: got %d with remaining %q, want 200 with 17", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	if resp, _ := get(t, g.proxy+"/home", "X-Api-Key", "k1"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "" {
		t.Errorf("unmatched path: got %d with remaining %q, want 200 without rate-limit headers", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	// One budget of 12 a day: two searches (5 each), then a third is refused with 2 left, and
	// the 2 go to requests of cost 1.
	for i, want := range []int{200, 200, 429, 200, 200, 429} {
		method, path := http.MethodPost, "/v2/search"
		if i >= 3 {
			method, path = http.MethodGet, "/v2/items"
		}
		req, err := http.NewRequest(method, g.proxy+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", "k3")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("shared budget, request %d (%s %s): got %d, want %d", i, method, path, resp.StatusCode, want)
		}
	}
	if got := up.hits.Load(); got != 10 {
		t.Errorf("upstream got %d requests, want 10", got)
	}
}
