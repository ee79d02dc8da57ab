package console

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const oracleYAML = "upstream: http://127.0.0.1:1\npolicies:\n" +
	"  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 5}\n" +
	"  - {name: per-user, key: header:x-user, algorithm: token_bucket, rate: 1/s, burst: 5}\n" +
	"  - {name: all, key: global, algorithm: token_bucket, rate: 1/s, burst: 5}\n"

const oracleRules = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"

// observeRequest plans one request from ip with header X-User user and feeds it to the
// console's hook, as the proxy does.
func observeRequest(t *testing.T, c *Console, set *policy.Set, ip, user string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	r.RemoteAddr = ip + ":40000"
	r.Header.Set("X-User", user)
	var p policy.Plan
	if err := set.Plan(r, &p); err != nil {
		t.Fatal(err)
	}
	res := make([]bucket.Result, len(p.Charges))
	for i := range res {
		res[i].Allowed = true
	}
	c.Observe(c.o.Now(), &p, res)
}

// TestRawKeyLookupNeedsToken: GET /v1/keys by raw value (key=, or an rls descriptor's
// entries) answers a key's pseudonym, so it needs a token: the read token where one is set,
// else the write token; with no token at all only lookups by pseudonym (and of a global
// policy, which has no key) answer. The pseudonym of a guessed value never leaks from a refusal.
func TestRawKeyLookupNeedsToken(t *testing.T) {
	const readToken = "read-token-0123456789"
	guesses := []string{"/v1/keys/per-ip?key=192.0.2.7", "/v1/keys/per-user?key=42",
		"/v1/keys/rls?domain=edge&entry=user=42", "/v1/keys/edge.user?domain=edge&entry=user=42"}
	for _, tc := range []struct {
		name        string
		write, read string
		denied      int            // the status of a raw lookup without a token
		tokens      map[string]int // token -> status of a raw lookup with it
	}{
		{"no token configured", "", "", http.StatusForbidden, map[string]int{testToken: http.StatusForbidden}},
		{"write token only", testToken, "", http.StatusUnauthorized, map[string]int{testToken: 200, "wrong-token-0123456789": 401}},
		{"read and write tokens", testToken, readToken, http.StatusUnauthorized, map[string]int{testToken: 200, readToken: 200, "wrong-token-0123456789": 401}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, set, _ := newTestConsole(t, oracleYAML, oracleRules)
			c.o.WriteToken, c.o.ReadToken = tc.write, tc.read
			h := c.Handler()
			ps := c.o.Pseudonyms
			leaks := []string{ps.Of("ip", "192.0.2.7"), ps.Of("header:x-user", "42")}
			for _, u := range guesses {
				code, body := call(t, h, http.MethodGet, u, "", nil)
				if code != tc.denied {
					t.Errorf("GET %s without a token: %d %s, want %d", u, code, body, tc.denied)
				}
				for _, l := range leaks {
					if strings.Contains(body, l) {
						t.Errorf("GET %s without a token leaks pseudonym %s: %s", u, l, body)
					}
				}
				for tok, want := range tc.tokens {
					if code, body := call(t, h, http.MethodGet, u, tok, nil); code != want {
						t.Errorf("GET %s with token %q: %d %s, want %d", u, tok, code, body, want)
					}
				}
			}
			// What needs no raw value still answers without a token when reads are open.
			if tc.read == "" {
				observeRequest(t, c, set, "192.0.2.7", "42")
				for _, u := range []string{"/v1/keys/per-ip?pseudonym=" + leaks[0], "/v1/keys/per-user?pseudonym=" + leaks[1], "/v1/keys/all"} {
					if code, body := call(t, h, http.MethodGet, u, "", nil); code != http.StatusOK {
						t.Errorf("GET %s without a token: %d %s, want 200", u, code, body)
					}
				}
			}
		})
	}
}

// TestConsoleShowsIPsAsPseudonyms: the console shows an IP key as the access log does, by its
// pseudonym of kind ip, in the top list, a key's state, a reset's answer and audit line, an
// exemption, and the page; the IP itself appears nowhere.
func TestConsoleShowsIPsAsPseudonyms(t *testing.T) {
	const ip = "192.0.2.77"
	c, _, set, _ := newTestConsole(t, oracleYAML, "")
	core, logs := observer.New(zapcore.InfoLevel)
	c.o.Logger = zap.New(core)
	h := c.Handler()
	want := c.o.Pseudonyms.Of("ip", ip)
	observeRequest(t, c, set, ip, "u1")
	var all bytes.Buffer
	for _, req := range []struct {
		method, url string
		body        any
		status      int
	}{
		{http.MethodGet, "/v1/top/per-ip", nil, 200},
		{http.MethodGet, "/v1/keys/per-ip?key=" + ip, nil, 200},
		{http.MethodGet, "/v1/keys/per-ip?pseudonym=" + want, nil, 200},
		{http.MethodPost, "/v1/keys/per-ip/reset", map[string]string{"key": ip, "reason": "r"}, 200},
		{http.MethodPost, "/v1/exemptions", map[string]any{"policy": "per-ip", "key": ip, "unlimited": true, "expires_in": "1h"}, 201},
		{http.MethodGet, "/v1/exemptions", nil, 200},
	} {
		code, body := call(t, h, req.method, req.url, testToken, req.body)
		if code != req.status || !strings.Contains(body, want) {
			t.Errorf("%s %s: %d %s, want %d showing the key as %s", req.method, req.url, code, body, req.status, want)
		}
		all.WriteString(body)
	}
	code, page := call(t, h, http.MethodGet, "/", "", nil)
	if code != http.StatusOK || !strings.Contains(page, want) {
		t.Errorf("the page: %d, want it to show %s", code, want)
	}
	all.WriteString(page)
	for _, e := range logs.All() {
		for k, v := range e.ContextMap() {
			all.WriteString(k + "=" + strings.TrimSpace(strings.ReplaceAll(toString(v), "\n", " ")) + "\n")
		}
	}
	if logs.Len() < 2 {
		t.Fatalf("%d audit lines, want 2 (reset, exempt)", logs.Len())
	}
	if strings.Contains(all.String(), ip) {
		t.Fatalf("the IP %s appears in an answer, the page or an audit line:\n%s", ip, all.String())
	}
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}
