package main

// End-to-end tests of issue 26's second round of sidesteps (items 2 to 6): request targets that
// some upstreams read as a host, other spellings of access_token and of an Authorization
// credential, the dashed spelling of an underscore key header, and keys on headers the
// gateway sets. Each sends what an attacker would, through the real binary, to an upstream
// double that reads requests as the named frameworks do, and counts what the upstream ran.

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// nodeURL routes as Node's documented `new URL(req.url, base)` (and Python's urlsplit) do: a
// target that starts with "//" is a network-path reference, whose first segment is a host.
func nodeURL(r *http.Request) string {
	u, err := url.Parse(strings.ReplaceAll(r.RequestURI, `\`, "/")) // WHATWG: '\' is '/'
	if err != nil {
		return "400"
	}
	return r.Method + " " + u.Path
}

// TestSidestep2AuthorityTarget (issue 26 item 2): `POST //x/login` must not escape a /login
// policy that an upstream reading x as a host routes it to: it is refused 400, over HTTP/1.1
// (also as `/\x/login`) and over HTTP/2 (:path), while a doubled slash later in the path
// still merges.
func TestSidestep2AuthorityTarget(t *testing.T) {
	rs, upURL := foldingUpstream(t, nodeURL)
	g := startGateway(t, upURL, `policies:
  - name: login
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 1
    match: {methods: [POST], path_prefix: /login}
`)
	for _, target := range []string{"//x/login", `/\x/login`, "//login/login", "/%2Fx/login"} {
		for i := 0; i < 3; i++ {
			if code, body := sendRaw(t, g.proxy, "POST", target); code != http.StatusBadRequest {
				t.Errorf("HTTP/1.1 POST %s: got %d %s, want 400", target, code, body)
			}
		}
	}
	h2 := h2cClient()
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", g.proxy+"/", strings.NewReader(""))
		req.URL.Path = "//x/login"
		resp, err := h2.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("HTTP/2 POST //x/login: got %s %d, want HTTP/2 400", resp.Proto, resp.StatusCode)
		}
	}
	if n := rs.get("POST /login"); n != 0 {
		t.Errorf("the upstream ran POST /login %d times for // targets, want 0", n)
	}
	// The policy still holds for the plain path, and a doubled slash inside is merged.
	var codes []int
	for _, target := range []string{"/login", "/login//", "/x/../login"} {
		code, _ := sendRaw(t, g.proxy, "POST", target)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 429 400]" {
		t.Errorf("POST /login, /login//, /x/../login: got %v, want [200 429 400]", codes)
	}
}

// TestSidestep2AccessTokenSpellings (issue 26 item 3): every query name that a mainstream
// framework reads as access_token carries a token that is verified like the header's: a
// garbage one is refused 401 and never reaches the upstream, one beside the header's is
// refused, and a good one charges its user. A `;`-separated pair is dropped from the query
// the upstream gets.
func TestSidestep2AccessTokenSpellings(t *testing.T) {
	var mu sync.Mutex
	var queries []string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.RawQuery)
		mu.Unlock()
	})
	g := startGateway(t, up.URL, jwtIdentity+`  - name: per-user
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 1
`, "E2E_JWT_SECRET="+jwtSecret)
	good, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "bob", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	spellings := []string{"Access_Token", "ACCESS_TOKEN", "access.token", "access+token", "access%20token",
		"access[token", "access%5Btoken", "access%5Ftoken", "access_token[]", "%41ccess_token",
		"acce%C5%BFs_token", "%20access_token", "access%2Etoken"}
	for _, name := range spellings {
		if code, _ := sendRaw(t, g.proxy, "GET", "/q?"+name+"=not.a.jwt"); code != http.StatusUnauthorized {
			t.Errorf("?%s=<garbage>: got %d, want 401", name, code)
		}
		if code, _ := sendRaw(t, g.proxy, "GET", "/q?"+name+"="+good, "Authorization", "Bearer "+good); code != http.StatusUnauthorized {
			t.Errorf("?%s=<token> beside the header's: got %d, want 401", name, code)
		}
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("the upstream got %d requests carrying unverified tokens, want 0", n)
	}
	// A good token in another spelling is the user's: burst 1, so the second is limited.
	var codes []int
	for _, name := range []string{"Access_Token", "access.token"} {
		code, _ := sendRaw(t, g.proxy, "GET", "/q?"+name+"="+good)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 429]" {
		t.Errorf("a good token as Access_Token then access.token: got %v, want [200 429]", codes)
	}
	// A pair after ';' is no pair to Go (nor verified): the reverse proxy drops it.
	if code, _ := sendRaw(t, g.proxy, "GET", "/q?x=1;access_token=not.a.jwt"); code != http.StatusOK {
		t.Errorf("?x=1;access_token=<garbage>: got %d, want 200 (the pair is dropped)", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if last := queries[len(queries)-1]; strings.Contains(strings.ToLower(last), "token") {
		t.Errorf("the upstream got the query %q, want the ;-pair dropped", last)
	}
}

// TestSidestep2AuthorizationSchemeSpellings (issue 26 item 4): with the api key in
// Authorization, the scheme's case and the whitespace around the credential are not part of
// the key: `bearer K`, `BEARER K`, `Bearer  K` and "Bearer\tK" all draw on K's bucket.
func TestSidestep2AuthorizationSchemeSpellings(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, `identity:
  api_key_header: Authorization
policies:
  - name: per-key
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 2
`)
	var codes []int
	for _, v := range []string{"Bearer K", "bearer K", "BEARER K", "Bearer  K", "Bearer\tK", "bEaReR \t K"} {
		code, _ := sendRaw(t, g.proxy, "GET", "/", "Authorization", v)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 200 429 429 429 429]" {
		t.Errorf("six spellings of Bearer K: got %v, want [200 200 429 429 429 429] (burst 2, one key)", codes)
	}
	// Another credential is another key.
	if code, _ := sendRaw(t, g.proxy, "GET", "/", "Authorization", "Bearer L"); code != http.StatusOK {
		t.Errorf("Bearer L: got %d, want 200", code)
	}
}

// TestSidestep2DashSpellingOfUnderscoreKey (issue 26 item 5): with `key: header:X_Tenant`,
// X-Tenant is the same variable to CGI-style servers: it must not reach the upstream
// unjudged. The configured spelling is judged; the other is removed.
func TestSidestep2DashSpellingOfUnderscoreKey(t *testing.T) {
	rs, upURL := foldingUpstream(t, goMux, "X-Tenant", "X_Tenant")
	g := startGateway(t, upURL, `policies:
  - name: per-tenant
    key: header:X_Tenant
    algorithm: token_bucket
    rate: 1/h
    burst: 1
`)
	for i := 0; i < 3; i++ {
		if code, _ := sendRaw(t, g.proxy, "GET", "/", "X-Tenant", fmt.Sprintf("t%d", i)); code != http.StatusOK {
			t.Fatalf("X-Tenant t%d: got %d, want 200 (no key: not charged)", i, code)
		}
		if h := rs.last(); len(h) != 0 {
			t.Errorf("the upstream got %v, want X-Tenant removed (it is X_Tenant to CGI servers, and was not judged)", h)
		}
	}
	var codes []int
	for i := 0; i < 3; i++ {
		code, _ := sendRaw(t, g.proxy, "GET", "/", "X_Tenant", "acme")
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 429 429]" {
		t.Errorf("X_Tenant acme 3 times: got %v, want [200 429 429]", codes)
	}
	if h := rs.last(); len(h["X_tenant"]) != 1 || h["X_tenant"][0] != "acme" {
		t.Errorf("the upstream got %v, want X_Tenant: acme as judged", h)
	}
}

// TestSidestep2GatewayHeaderKeysRefused (issue 26 item 6): validate refuses a key on a header
// that the gateway sets, rewrites or removes, naming the field and pointing to ip.
func TestSidestep2GatewayHeaderKeysRefused(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct{ yaml, field string }{
		{"policies:\n  - {name: a, key: \"header:X-Forwarded-Host\", algorithm: token_bucket, rate: 1/s, burst: 1}\n", "policies[0].key"},
		{"policies:\n  - {name: a, key: \"header:X-Forwarded-For\", algorithm: token_bucket, rate: 1/s, burst: 1}\n", "policies[0].key"},
		{"policies:\n  - {name: a, key: \"header:x_forwarded_for\", algorithm: token_bucket, rate: 1/s, burst: 1}\n", "policies[0].key"},
		{"policies:\n  - {name: a, key: \"header:Forwarded\", algorithm: token_bucket, rate: 1/s, burst: 1}\n", "policies[0].key"},
		{"policies:\n  - {name: a, key: \"header:X-Real-IP\", algorithm: token_bucket, rate: 1/s, burst: 1}\n", "policies[0].key"},
		{"policies:\n  - {name: a, key: \"header:Proxy-Authorization\", algorithm: token_bucket, rate: 1/s, burst: 1}\n", "policies[0].key"},
		{"identity: {api_key_header: X-Forwarded-For}\npolicies:\n  - {name: a, key: api_key, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "identity.api_key_header"},
		{"identity: {user_header: X-Real-IP}\npolicies:\n  - {name: a, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "identity.user_header"},
	} {
		path := filepath.Join(dir, fmt.Sprintf("c%d.yaml", i))
		if err := os.WriteFile(path, []byte("upstream: http://127.0.0.1:1\n"+tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, errs := runCLI(t, "validate", "--config", path)
		if code == 0 || !strings.Contains(errs, tc.field) || !strings.Contains(errs, "key by ip") {
			t.Errorf("validate %s: exit %d, stderr %q; want a refusal naming %s and pointing to ip", strings.TrimSpace(tc.yaml), code, errs, tc.field)
		}
	}
}
