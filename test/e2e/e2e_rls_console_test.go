package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// consoleRules is the rate limit service's domain of the console tests: an API key (a secret
// the console must never show) limited per hour, so that no window turns during a test.
const consoleRules = `domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 3}
`

// consoleRule is the rule's name in the console: its label.
const consoleRule = "edge.api_key"

// TestRLSConsole drives the operators' console through the binary serving Envoy's rate limit
// service alone, called with Envoy's published gRPC stubs: RLS calls feed the rule's heavy
// hitters (the heavy descriptor first, shown as a pseudonym) and its per-second series; an
// exemption granted through the API by the descriptor's entries lets the limited descriptor
// through on the next call and ends by itself; one granted by the pseudonym from the top list
// ends when deleted; no raw descriptor value shows in an answer or a log line.
func TestRLSConsole(t *testing.T) {
	waitOutHourEdge(t, time.Minute)
	g := startRLSGateway(t, map[string]string{"edge.yaml": consoleRules},
		"admin:\n  token_env: ADMIN_TOKEN\nlog:\n  pseudonym_secret_env: PSEUDO_SECRET\n", "",
		"ADMIN_TOKEN="+adminToken, "PSEUDO_SECRET="+adminPseudoKey)
	ps := policy.NewPseudonyms([]byte(adminPseudoKey))
	var answers strings.Builder
	call := func(key string) *pb.RateLimitResponse {
		t.Helper()
		return g.call(t, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlext.RateLimitDescriptor{desc("api_key", key)}})
	}
	heavy := adminKeyPrefix + "rls-heavy"
	heavyLabel := ps.Of("rls:edge", "api_key="+heavy+"\x00")

	// The rule is listed under its label.
	code, body := adminCall(t, http.MethodGet, g.admin+"/v1/policies", "", nil)
	if code != http.StatusOK || !strings.Contains(body, `"name": "`+consoleRule+`"`) || !strings.Contains(body, `"scope": "rls:edge"`) {
		t.Fatalf("policies: %d %s, want %s with scope rls:edge", code, body, consoleRule)
	}

	// 40 calls of one descriptor (3 admitted, 37 over the limit) among 30 of one call each.
	for i := range 40 {
		call(heavy)
		if i < 30 {
			call(fmt.Sprintf("%slight-%d", adminKeyPrefix, i))
		}
	}
	code, body = adminCall(t, http.MethodGet, g.admin+"/v1/top/"+consoleRule+"?n=3", "", nil)
	answers.WriteString(body)
	var top struct {
		Keys []struct {
			Key               string
			Requests, Limited uint64
		}
	}
	if err := json.Unmarshal([]byte(body), &top); code != http.StatusOK || err != nil || len(top.Keys) == 0 {
		t.Fatalf("top: %d %s", code, body)
	}
	if k := top.Keys[0]; k.Key != heavyLabel || k.Requests != 40 || k.Limited != 37 {
		t.Fatalf("top %+v, want the heavy descriptor first as %s with 40 calls, 37 limited", top.Keys, heavyLabel)
	}

	// Its series counted every call.
	code, body = adminCall(t, http.MethodGet, g.admin+"/v1/series/"+consoleRule, "", nil)
	var series struct {
		Points []struct{ Allowed, Limited uint32 }
	}
	if err := json.Unmarshal([]byte(body), &series); code != http.StatusOK || err != nil {
		t.Fatalf("series: %d %s", code, body)
	}
	var allowed, limited uint32
	for _, p := range series.Points {
		allowed, limited = allowed+p.Allowed, limited+p.Limited
	}
	if allowed != 3+30 || limited != 37 {
		t.Fatalf("series: %d allowed, %d limited, want 33 and 37", allowed, limited)
	}
	if _, page := get(t, g.admin+"/"); !strings.Contains(page, consoleRule) || !strings.Contains(page, heavyLabel) {
		t.Fatalf("the page lacks the rule %s or its heavy key", consoleRule)
	}

	// An exemption by the descriptor's entries: the limited descriptor passes on the next call.
	if resp := call(heavy); resp.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("before the exemption: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	code, body = adminCall(t, http.MethodPost, g.admin+"/v1/exemptions", adminToken, map[string]any{
		"policy": consoleRule, "domain": "edge", "entries": []string{"api_key=" + heavy},
		"limit": map[string]any{"limit": 100}, "expires_in": "2s", "reason": "launch"})
	answers.WriteString(body)
	if code != http.StatusCreated || !strings.Contains(body, heavyLabel) {
		t.Fatalf("exempt: %d %s, want 201 naming the key %s", code, body, heavyLabel)
	}
	ends := time.Now().Add(2 * time.Second)
	resp := call(heavy)
	if resp.GetOverallCode() != pb.RateLimitResponse_OK || resp.Statuses[0].GetLimitRemaining() != 100-4 {
		t.Fatalf("under the exemption: %v remaining %d, want OK with 96 of 100 left", resp.GetOverallCode(), resp.Statuses[0].GetLimitRemaining())
	}
	if resp := call(adminKeyPrefix + "light-0"); resp.GetOverallCode() != pb.RateLimitResponse_OK {
		t.Fatalf("another descriptor: %v", resp.GetOverallCode())
	}
	code, body = adminCall(t, http.MethodGet, g.admin+"/v1/exemptions", "", nil)
	answers.WriteString(body)
	if code != http.StatusOK || !strings.Contains(body, heavyLabel) || !strings.Contains(body, consoleRule) {
		t.Fatalf("exemptions: %d %s", code, body)
	}
	eventually(t, "the exemption ends", func() bool { return call(heavy).GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT })
	if late := time.Since(ends); late > time.Second {
		t.Fatalf("the exemption ended %v after its expiry, want within 1s", late)
	}

	// An unlimited exemption by the pseudonym that top showed, ended by DELETE.
	code, body = adminCall(t, http.MethodPost, g.admin+"/v1/exemptions", adminToken, map[string]any{
		"policy": consoleRule, "pseudonym": heavyLabel, "unlimited": true, "expires_in": "1h", "reason": "incident"})
	answers.WriteString(body)
	var ex struct{ ID string }
	if err := json.Unmarshal([]byte(body), &ex); code != http.StatusCreated || err != nil || ex.ID == "" {
		t.Fatalf("exempt by pseudonym: %d %s", code, body)
	}
	if resp := call(heavy); resp.GetOverallCode() != pb.RateLimitResponse_OK || resp.Statuses[0].GetLimitRemaining() != math.MaxUint32 {
		t.Fatalf("unlimited: %v remaining %d, want OK and no limit", resp.GetOverallCode(), resp.Statuses[0].GetLimitRemaining())
	}
	if code, body := adminCall(t, http.MethodDelete, g.admin+"/v1/exemptions/"+ex.ID, adminToken, nil); code != http.StatusOK {
		t.Fatalf("unexempt: %d %s", code, body)
	}
	if resp := call(heavy); resp.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after DELETE: %v, want OVER_LIMIT", resp.GetOverallCode())
	}

	// The CLI names a descriptor by --domain and --entry: an exemption for a light key, shown
	// by get.
	light := adminKeyPrefix + "light-1"
	for range 3 {
		call(light)
	}
	code, out, errs := runBinary(t, func(c *exec.Cmd) { c.Env = append(c.Environ(), "RATELIMIT_ADMIN_TOKEN="+adminToken) },
		"admin", "exempt", consoleRule, "--domain", "edge", "--entry", "api_key="+light, "--limit", "10", "--for", "1h",
		"--reason", "cli", "--admin", g.admin)
	if code != 0 {
		t.Fatalf("admin exempt --domain: exit %d\n%s\n%s", code, out, errs)
	}
	answers.WriteString(out)
	// A lookup by the descriptor's values needs the token (docs/operations.md, "Access").
	code, out, errs = runBinary(t, func(c *exec.Cmd) {}, "admin", "get", consoleRule, "--domain", "edge", "--entry", "api_key="+light,
		"--json", "--admin", g.admin)
	if code == 0 || !strings.Contains(errs, "401") {
		t.Fatalf("admin get --domain without the token: exit %d\n%s\n%s, want a 401", code, out, errs)
	}
	code, out, errs = runBinary(t, func(c *exec.Cmd) { c.Env = append(c.Environ(), "RATELIMIT_ADMIN_TOKEN="+adminToken) },
		"admin", "get", consoleRule, "--domain", "edge", "--entry", "api_key="+light, "--json", "--admin", g.admin)
	answers.WriteString(out)
	if code != 0 || !strings.Contains(out, `"exempt": true`) || !strings.Contains(out, `"remaining": 7`) {
		t.Fatalf("admin get --domain: exit %d\n%s\n%s, want exempt with 7 of 10 left (3 counted)", code, out, errs)
	}

	// No raw descriptor value or token anywhere.
	_, metrics := get(t, g.admin+"/metrics")
	for where, s := range map[string]string{"logs": g.logs.String(), "answers": answers.String(), "metrics": metrics} {
		if strings.Contains(s, adminKeyPrefix) || strings.Contains(s, adminToken) {
			t.Errorf("a raw descriptor value or the token is in the %s", where)
		}
	}
}

// TestRLSConsoleWithProxy: with the proxy and the rate limit service in one gateway, both feed
// the one console: a proxy policy's top list and an rls rule's, side by side.
func TestRLSConsoleWithProxy(t *testing.T) {
	waitOutHourEdge(t, time.Minute)
	g, client := startProxyRLS(t, map[string]string{"edge.yaml": consoleRules}, ipPolicy)
	for range 5 {
		shouldRateLimit(t, client, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlext.RateLimitDescriptor{desc("api_key", adminKeyPrefix+"both")}})
		get(t, g.proxy+"/x")
	}
	for _, name := range []string{consoleRule, "per-ip"} {
		code, body := adminCall(t, http.MethodGet, g.admin+"/v1/top/"+name, "", nil)
		if code != http.StatusOK || !strings.Contains(body, `"requests": 5`) || !strings.Contains(body, `"limited": 2`) {
			t.Fatalf("top of %s: %d %s, want one key of 5 requests, 2 limited", name, code, body)
		}
	}
}
