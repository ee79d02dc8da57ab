package console

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const testToken = "write-token-0123456789"

// newTestConsole compiles yaml (with an rls rules file in its config_dir) and serves a console
// on a memory store.
func newTestConsole(t testing.TB, yaml, rules string) (*Console, *memstore.Store, *policy.Set, http.Handler) {
	t.Helper()
	dir := t.TempDir()
	if rules != "" {
		if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o600); err != nil {
			t.Fatal(err)
		}
		yaml += "rls:\n  listen: 127.0.0.1:0\n  config_dir: " + dir + "\n"
	}
	noEnv := func(string) string { return "" }
	cfg, err := policy.Parse([]byte(yaml), policy.LoadOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	m := memstore.New(memstore.Options{})
	c, err := New(Options{Policies: func() *policy.Set { return set }, Keys: m, Pseudonyms: policy.NewPseudonyms(nil),
		WriteToken: testToken, WriteTokenName: "ADMIN_TOKEN"})
	if err != nil {
		t.Fatal(err)
	}
	return c, m, set, c.Handler()
}

func call(t *testing.T, h http.Handler, method, url, token string, body any) (int, string) {
	t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	req := httptest.NewRequest(method, url, bytes.NewReader(b))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestRLSDescriptorInspectReset lists an rls rule, inspects a descriptor's key without charging
// it, resets it, and never shows the descriptor's raw value.
func TestRLSDescriptorInspectReset(t *testing.T) {
	const rules = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
	_, m, set, h := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", rules)
	code, body := call(t, h, http.MethodGet, "/v1/policies", "", nil)
	if code != http.StatusOK || !strings.Contains(body, `"scope": "rls:edge"`) {
		t.Fatalf("policies: %d %s, want the rls rule with scope rls:edge", code, body)
	}
	rt, err := set.RLS().Charge("edge", []envoyrules.Entry{{Key: "api_key", Value: "secret-value"}})
	if err != nil {
		t.Fatal(err)
	}
	ch := rt.Charge
	res := make([]bucket.Result, 1)
	for range 3 {
		if _, err := m.Take(context.Background(), time.Now(), []bucket.Charge{ch}, res); err != nil {
			t.Fatal(err)
		}
	}
	get := "/v1/keys/rls?domain=edge&entry=api_key=secret-value"
	code, body = call(t, h, http.MethodGet, get, testToken, nil) // a raw descriptor: the token
	if code != http.StatusOK || !strings.Contains(body, `"remaining": 0`) || !strings.Contains(body, `"limited": true`) {
		t.Fatalf("inspect: %d %s, want limited with 0 remaining", code, body)
	}
	code, body = call(t, h, http.MethodPost, "/v1/keys/rls/reset", testToken, map[string]any{"domain": "edge", "entries": []string{"api_key=secret-value"}})
	if code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	code, body2 := call(t, h, http.MethodGet, get, testToken, nil)
	if code != http.StatusOK || !strings.Contains(body2, `"remaining": 3`) {
		t.Fatalf("after reset: %d %s, want 3 remaining", code, body2)
	}
	if strings.Contains(body+body2, "secret-value") {
		t.Fatal("an answer shows the descriptor's raw value")
	}
	if code, body := call(t, h, http.MethodGet, "/v1/keys/rls?domain=edge&entry=nope=x", testToken, nil); code != http.StatusNotFound {
		t.Fatalf("unmatched descriptor: %d %s, want 404", code, body)
	}
}

// TestWritesNeedToken checks 401 without or with a wrong token, and problem+json.
func TestWritesNeedToken(t *testing.T) {
	_, _, _, h := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "")
	for _, tok := range []string{"", "wrong-token-0123456789", testToken + "x"} {
		req := httptest.NewRequest(http.MethodPost, "/v1/keys/p/reset", strings.NewReader(`{"key":"192.0.2.1"}`))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("token %q: %d %s, want a 401 problem", tok, rec.Code, rec.Header().Get("Content-Type"))
		}
	}
	if code, body := call(t, h, http.MethodPost, "/v1/keys/p/reset", testToken, map[string]string{"key": "192.0.2.1"}); code != http.StatusOK {
		t.Fatalf("with the token: %d %s", code, body)
	}
	if code, body := call(t, h, http.MethodPost, "/v1/exemptions", testToken, map[string]any{"policy": "p", "key": "192.0.2.1", "unlimited": true}); code != http.StatusBadRequest || !strings.Contains(body, "expires_in") {
		t.Fatalf("exemption without an end: %d %s, want 400 naming expires_in", code, body)
	}
}

// TestReadToken checks that reads need the read token (or the write token) once one is set.
func TestReadToken(t *testing.T) {
	c, _, _, _ := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "")
	c.o.ReadToken = "read-token-0123456789"
	h := c.Handler()
	for tok, want := range map[string]int{"": 401, "nope-0123456789abcdef": 401, "read-token-0123456789": 200, testToken: 200} {
		for _, path := range []string{"/v1/policies", "/"} {
			if code, _ := call(t, h, http.MethodGet, path, tok, nil); code != want {
				t.Errorf("GET %s with token %q: %d, want %d", path, tok, code, want)
			}
		}
	}
	// The read token does not write.
	if code, _ := call(t, h, http.MethodPost, "/v1/keys/p/reset", "read-token-0123456789", map[string]string{"key": "192.0.2.1"}); code != http.StatusUnauthorized {
		t.Errorf("reset with the read token: %d, want 401", code)
	}
}

// memShared is a Shared in memory: the table that replicas share, in a test.
type memShared struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *memShared) PutExemption(_ context.Context, id string, data []byte, _ time.Time, most int) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string][]byte{}
	}
	if len(s.m) >= most {
		return false, nil
	}
	s.m[id] = data
	return true, nil
}

func (s *memShared) DeleteExemption(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	delete(s.m, id)
	return ok, nil
}

func (s *memShared) Exemptions(context.Context) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for _, d := range s.m {
		out = append(out, d)
	}
	return out, nil
}

// TestRLSRuleInTheConsole: an rls rule, named by its label, has its heavy keys (as the
// pseudonym resolveRLS shows, never the raw value) and its series; an exemption by domain and
// entries, or by the pseudonym from top, reaches ExemptRLS on this replica and, through the
// shared exemptions, on another.
func TestRLSRuleInTheConsole(t *testing.T) {
	const rules = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
	yaml := "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"
	c, _, set, h := newTestConsole(t, yaml, rules)
	shared := &memShared{}
	c.o.Shared = shared
	es := []envoyrules.Entry{{Key: "api_key", Value: "secret-value"}}
	var m envoyrules.Match
	r := set.RLS().Domain("edge").Match(es, &m)
	if r == nil || r.Label != "edge.api_key" {
		t.Fatalf("rule %+v, want edge.api_key", r)
	}
	ch := bucket.Charge{Key: m.Key(es), Limit: r.Limit}
	now := time.Now()
	for i := range 5 {
		c.ObserveRLS(now, "edge", &m, es, &ch, i >= 3)
	}
	code, body := call(t, h, http.MethodGet, "/v1/top/edge.api_key", "", nil)
	label := rlsLabel(c.o.Pseudonyms, "edge", es)
	if code != http.StatusOK || !strings.Contains(body, `"key": "`+label+`"`) || !strings.Contains(body, `"requests": 5`) ||
		!strings.Contains(body, `"limited": 2`) || strings.Contains(body, "secret-value") {
		t.Fatalf("top: %d %s, want the key as %s with 5 requests, 2 limited", code, body, label)
	}
	if _, body := call(t, h, http.MethodGet, "/v1/keys/edge.api_key?domain=edge&entry=api_key=secret-value", testToken, nil); !strings.Contains(body, label) {
		t.Fatalf("keys shows the descriptor otherwise than top: %s", body)
	}
	if _, _, ok := c.ExemptRLS(now, r, ch.Key); ok {
		t.Fatal("exempt before any exemption")
	}
	code, body = call(t, h, http.MethodPost, "/v1/exemptions", testToken, map[string]any{"policy": "edge.api_key", "domain": "edge",
		"entries": []string{"api_key=secret-value"}, "limit": map[string]any{"limit": 50}, "expires_in": "1h"})
	if code != http.StatusCreated || strings.Contains(body, "secret-value") {
		t.Fatalf("exempt by entries: %d %s", code, body)
	}
	if l, unlimited, ok := c.ExemptRLS(now, r, ch.Key); !ok || unlimited || l.Count != 50 || l.Window != r.Limit.Window {
		t.Fatalf("ExemptRLS: %+v %v %v, want 50 per the rule's window", l, unlimited, ok)
	}
	// Another replica reads it from the shared store.
	c2, _, _, _ := newTestConsole(t, yaml, rules)
	c2.o.Policies = func() *policy.Set { return set }
	c2.o.Shared = shared
	if err := c2.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l, _, ok := c2.ExemptRLS(now, r, ch.Key); !ok || l.Count != 50 {
		t.Fatalf("the other replica: ExemptRLS %+v %v, want the shared exemption", l, ok)
	}
	// By the pseudonym from top: unlimited, and the key states say so.
	code, body = call(t, h, http.MethodPost, "/v1/exemptions", testToken, map[string]any{"policy": "edge.api_key", "pseudonym": label,
		"unlimited": true, "expires_in": "2h"})
	if code != http.StatusCreated {
		t.Fatalf("exempt by pseudonym: %d %s", code, body)
	}
	if _, unlimited, ok := c.ExemptRLS(now, r, ch.Key); !ok || !unlimited {
		t.Fatal("the later-ending unlimited exemption does not apply")
	}
	if code, body := call(t, h, http.MethodPost, "/v1/exemptions", testToken, map[string]any{"policy": "edge.api_key", "key": "secret-value",
		"unlimited": true, "expires_in": "2h"}); code != http.StatusBadRequest || strings.Contains(body, "secret-value") {
		t.Fatalf("a raw key for an rls rule: %d %s, want 400 asking for the descriptor", code, body)
	}
}
