package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Secrets of the console tests: none may appear in a log line, a metric or an API answer.
const (
	adminToken     = "admin-token-0123456789abcdef"
	adminPseudoKey = "pseudonym-secret-0123456789abcdef0123"
	adminKeyPrefix = "sk-live-secret-"
)

const adminPolicies = `identity:
  api_key_header: X-Api-Key
log:
  pseudonym_secret_env: PSEUDO_SECRET
admin:
  token_env: ADMIN_TOKEN
  top_k: 100
policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 100/s
    burst: 100000
  - name: per-key
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 5
`

// adminCall sends one admin API request (body: JSON or nil) with the token (or none) and
// returns the status and body.
func adminCall(t *testing.T, method, url, token string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type keyState struct {
	Limit      int64    `json:"limit"`
	Remaining  int64    `json:"remaining"`
	RetryAfter *float64 `json:"retry_after_seconds"`
	Limited    bool     `json:"limited"`
	Exempt     bool     `json:"exempt"`
	Key        string   `json:"key"`
}

func peekKey(t *testing.T, admin, pol, key string) keyState {
	t.Helper()
	// A raw key's lookup needs the token (without a read token, the write token).
	code, body := adminCall(t, http.MethodGet, admin+"/v1/keys/"+pol+"?key="+key, adminToken, nil)
	if code != http.StatusOK {
		t.Fatalf("GET key: %d %s", code, body)
	}
	var ks keyState
	if err := json.Unmarshal([]byte(body), &ks); err != nil {
		t.Fatal(err)
	}
	return ks
}

// TestAdminConsoleMemory drives the console through the binary on the memory store: a key's
// state matches X-RateLimit-Remaining, writes need the token, a reset admits the next request,
// the sketch finds 3 heavy hitters among 10,000 keys, an exemption raises a limit and ends on
// time, the CLI shows the same, the limited counter carries a pseudonym exemplar, and no raw key
// or token shows anywhere.
func TestAdminConsoleMemory(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, adminPolicies, "ADMIN_TOKEN="+adminToken, "PSEUDO_SECRET="+adminPseudoKey)
	ps := policy.NewPseudonyms([]byte(adminPseudoKey))
	var answers strings.Builder // every API answer, searched for secrets at the end

	// Inspect matches the header, without charging.
	keyA := adminKeyPrefix + "A"
	var remaining string
	for range 3 {
		resp, _ := get(t, g.proxy+"/x", "X-Api-Key", keyA)
		remaining = resp.Header.Get("X-RateLimit-Remaining")
	}
	for range 2 { // twice: the first peek must not have charged
		ks := peekKey(t, g.admin, "per-key", keyA)
		if strconv.FormatInt(ks.Remaining, 10) != remaining || ks.Limit != 5 || ks.Limited {
			t.Fatalf("peek %+v, want remaining %s (the header) of 5, not limited", ks, remaining)
		}
		if ks.Key != ps.Of("api_key", keyA) {
			t.Fatalf("key shown as %q, want its pseudonym", ks.Key)
		}
	}
	for range 3 {
		get(t, g.proxy+"/x", "X-Api-Key", keyA)
	}
	if ks := peekKey(t, g.admin, "per-key", keyA); !ks.Limited || ks.Remaining != 0 || ks.RetryAfter == nil || *ks.RetryAfter < 1 {
		t.Fatalf("after 6 requests: %+v, want limited with a retry-after", ks)
	}

	// Writes: 401 without or with a wrong token; the reset with it admits the next request.
	reset := g.admin + "/v1/keys/per-key/reset"
	for _, tok := range []string{"", "wrong-token-0123456789"} {
		if code, body := adminCall(t, http.MethodPost, reset, tok, map[string]string{"key": keyA}); code != http.StatusUnauthorized ||
			!strings.Contains(body, `"status": 401`) && !strings.Contains(body, `"status":401`) {
			t.Fatalf("reset with token %q: %d %s, want a 401 problem", tok, code, body)
		}
	}
	if resp, _ := get(t, g.proxy+"/x", "X-Api-Key", keyA); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("before the reset: %d, want 429", resp.StatusCode)
	}
	code, body := adminCall(t, http.MethodPost, reset, adminToken, map[string]string{"key": keyA, "reason": "ticket 42"})
	answers.WriteString(body)
	if code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	if resp, _ := get(t, g.proxy+"/x", "X-Api-Key", keyA); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "4" {
		t.Fatalf("after the reset: %d remaining %q, want 200 and 4", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	if v := metric(t, g.admin, `ratelimit_admin_writes_total{action="reset"}`); v != 1 {
		t.Fatalf("ratelimit_admin_writes_total{action=reset} = %v, want 1", v)
	}

	// Heavy hitters: 3 keys of 400 requests among 10,000 keys of one.
	heavy := []string{adminKeyPrefix + "heavy-1", adminKeyPrefix + "heavy-2", adminKeyPrefix + "heavy-3"}
	var keys []string
	for i := range 10000 {
		keys = append(keys, fmt.Sprintf("%slight-%d", adminKeyPrefix, i))
	}
	for i := range 400 {
		keys = append(keys, heavy[i%3], heavy[(i+1)%3], heavy[(i+2)%3])
	}
	sendAll(t, g.proxy+"/x", keys)
	code, body = adminCall(t, http.MethodGet, g.admin+"/v1/top/per-key?n=3", "", nil)
	answers.WriteString(body)
	var top struct {
		Keys []struct {
			Key               string
			Requests, Limited uint64
		}
	}
	if err := json.Unmarshal([]byte(body), &top); code != http.StatusOK || err != nil || len(top.Keys) != 3 {
		t.Fatalf("top: %d %s", code, body)
	}
	var want []string
	for _, h := range heavy {
		want = append(want, ps.Of("api_key", h))
	}
	// Past 1,000 charges a second the sketch samples one charge in 8 (docs/operations.md, "Heavy
	// hitters and their error bound"): a count of 400 is then within 4 sqrt(8 x 400) of it.
	lo := uint64(400 - 4*math.Sqrt(8*400))
	for _, k := range top.Keys {
		if !slices.Contains(want, k.Key) || k.Requests < lo || k.Limited < lo-5 {
			t.Fatalf("top %+v, want the 3 heavy keys %v with >= %d requests, >= %d limited", top.Keys, want, lo, lo-5)
		}
	}
	// The CLI merges replicas' views: the same replica twice doubles every count.
	code, out, errs := runBinary(t, func(c *exec.Cmd) {}, "admin", "top", "per-key", "-n", "3", "--json",
		"--replica", g.admin, "--replica", g.admin)
	if code != 0 || !strings.Contains(out, want[0]) {
		t.Fatalf("admin top: exit %d\n%s\n%s", code, out, errs)
	}

	// An exemption raises the limit (pseudonym of a heavy key, which the sketch tracks) and ends
	// by itself.
	code, body = adminCall(t, http.MethodPost, g.admin+"/v1/exemptions", "", map[string]any{"policy": "per-key", "key": heavy[0]})
	if code != http.StatusUnauthorized {
		t.Fatalf("exempt without a token: %d %s", code, body)
	}
	code, body = adminCall(t, http.MethodPost, g.admin+"/v1/exemptions", adminToken, map[string]any{
		"policy": "per-key", "pseudonym": want[0], "limit": map[string]any{"rate": "1/h", "burst": 1000},
		"expires_in": "3s", "reason": "launch"})
	answers.WriteString(body)
	if code != http.StatusCreated {
		t.Fatalf("exempt: %d %s", code, body)
	}
	ends := time.Now().Add(3 * time.Second)
	if resp, _ := get(t, g.proxy+"/x", "X-Api-Key", heavy[0]); resp.StatusCode != http.StatusOK {
		t.Fatalf("exempt key: %d, want 200 under its exemption", resp.StatusCode)
	}
	if resp, _ := get(t, g.proxy+"/x", "X-Api-Key", heavy[1]); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("another key: %d, want 429", resp.StatusCode)
	}
	code, out, errs = runBinary(t, func(c *exec.Cmd) {}, "admin", "exemptions", "--admin", g.admin)
	if code != 0 || !strings.Contains(out, want[0]) || !strings.Contains(out, "launch") {
		t.Fatalf("admin exemptions: exit %d\n%s\n%s", code, out, errs)
	}
	for time.Now().Before(ends.Add(-300 * time.Millisecond)) {
		if resp, _ := get(t, g.proxy+"/x", "X-Api-Key", heavy[0]); resp.StatusCode != http.StatusOK {
			t.Fatalf("exempt key before the exemption ends: %d", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond) // pacing requests while the exemption lasts, not waiting for a state
	}
	eventually(t, "the exemption ends", func() bool {
		resp, _ := get(t, g.proxy+"/x", "X-Api-Key", heavy[0])
		return resp.StatusCode == http.StatusTooManyRequests
	})
	if late := time.Since(ends); late > time.Second {
		t.Fatalf("the exemption ended %v after its expiry, want within 1s", late)
	}

	// The CLI with the token from the environment: reset by pseudonym.
	code, out, errs = runBinary(t, func(c *exec.Cmd) { c.Env = append(c.Environ(), "RATELIMIT_ADMIN_TOKEN="+adminToken) },
		"admin", "reset", "per-key", "--pseudonym", want[1], "--admin", g.admin, "--reason", "cli")
	if code != 0 || !strings.Contains(out, "true") {
		t.Fatalf("admin reset: exit %d\n%s\n%s", code, out, errs)
	}
	if resp, _ := get(t, g.proxy+"/x", "X-Api-Key", heavy[1]); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the CLI reset: %d, want 200", resp.StatusCode)
	}

	// The page shows every policy and the resets.
	_, page := get(t, g.admin+"/")
	for _, s := range []string{"per-ip", "per-key", "<svg", "ticket 42"} {
		if !strings.Contains(page, s) {
			t.Fatalf("the page lacks %q", s)
		}
	}
	answers.WriteString(page)

	// The limited counter's exemplar is a pseudonym (OpenMetrics only).
	_, om := get(t, g.admin+"/metrics", "Accept", "application/openmetrics-text; version=1.0.0")
	line := ""
	for _, l := range strings.Split(om, "\n") {
		if strings.HasPrefix(l, `ratelimit_requests_total{policy="per-key",result="limited"}`) {
			line = l
		}
	}
	if !strings.Contains(line, "# {key=\"") || !slices.ContainsFunc(append(want, ps.Of("api_key", keyA)), func(p string) bool { return strings.Contains(line, p) }) {
		t.Fatalf("limited counter line %q: want an exemplar with a pseudonym", line)
	}
	_, text := get(t, g.admin+"/metrics")
	if strings.Contains(text, "# {") {
		t.Fatal("an exemplar in the Prometheus text format")
	}

	// No raw key or token anywhere.
	for where, s := range map[string]string{"logs": g.logs.String(), "metrics": om + text, "answers": answers.String()} {
		if strings.Contains(s, adminKeyPrefix) || strings.Contains(s, adminToken) {
			t.Errorf("a raw API key or the token is in the %s", where)
		}
	}
	if !strings.Contains(g.logs.String(), `"audit":true`) || !strings.Contains(g.logs.String(), `"who":"ADMIN_TOKEN"`) {
		t.Errorf("no audit line naming the token in the logs")
	}
}

// sendAll sends one request per key (X-Api-Key) from 16 clients.
func sendAll(t *testing.T, url string, keys []string) {
	t.Helper()
	var wg sync.WaitGroup
	ch := make(chan string)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range ch {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Header.Set("X-Api-Key", k)
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	wg.Wait()
}

// TestAdminWritesOffWithoutToken checks the 403 that says how to enable writes.
func TestAdminWritesOffWithoutToken(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, ipPolicy)
	code, body := adminCall(t, http.MethodPost, g.admin+"/v1/keys/per-ip/reset", "anything-at-all-0123", map[string]string{"key": "127.0.0.1"})
	if code != http.StatusForbidden || !strings.Contains(body, "admin.token_env") {
		t.Fatalf("reset without a configured token: %d %s, want 403 naming admin.token_env", code, body)
	}
	if code, body := adminCall(t, http.MethodGet, g.admin+"/v1/policies", "", nil); code != http.StatusOK || !strings.Contains(body, `"per-ip"`) {
		t.Fatalf("policies: %d %s", code, body)
	}
}
