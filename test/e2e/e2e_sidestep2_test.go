package e2e

// End-to-end tests of issue 26's second round of sidesteps (items 2 to 6): request targets that
// some upstreams read as a host, other spellings of access_token and of an Authorization
// credential, the dashed spelling of an underscore key header, and keys on headers the
// gateway sets. Each sends what an attacker would, through the real binary, to an upstream
// double that reads requests as the named frameworks do, and counts what the upstream ran.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c" //nolint:staticcheck // see lenientH2C
	"golang.org/x/net/http2/hpack"
	"golang.org/x/net/websocket"
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

// lenientH2C serves h on HTTP/1.1 and upgrades `Upgrade: h2c` requests to HTTP/2 with
// golang.org/x/net/http2/h2c, also when Connection does not name HTTP2-Settings (as servers
// that only look for the Upgrade and HTTP2-Settings headers do): ReverseProxy rewrites
// Connection to `Upgrade`, and an attacker cares about upstreams that upgrade anyway. It
// records every request's Upgrade and HTTP2-Settings headers.
func lenientH2C(t *testing.T, hits *atomic.Int64, seen *syncBuffer) string {
	t.Helper()
	//nolint:staticcheck // x/net's h2c is the point: it honours "Upgrade: h2c", which net/http's unencrypted HTTP/2 (prior knowledge only) does not
	inner := h2c.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "ran %s %s", r.Proto, r.URL.Path)
	}), &http2.Server{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(seen, "Upgrade=%q HTTP2-Settings=%q\n", r.Header.Values("Upgrade"), r.Header.Values("Http2-Settings"))
		if len(r.Header["Http2-Settings"]) > 0 {
			r.Header.Add("Connection", "HTTP2-Settings")
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// h2cTunnel sends an `Upgrade: h2c` request on a fresh connection to addr; when the answer is
// 101 it speaks HTTP/2 on the tunnel, opens n streams and returns how many were answered.
func h2cTunnel(t *testing.T, addr string, n int) (status, answered int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	// Connection does not name HTTP2-Settings, or ReverseProxy would remove it as hop-by-hop.
	_, err = io.WriteString(c, "GET /tunnel HTTP/1.1\r\nHost: gateway\r\nConnection: Upgrade\r\n"+
		"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, 0
	}
	fr := http2.NewFramer(c, br)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := 0; i < n; i++ {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "gateway"}, {":path", "/in-tunnel"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(3 + 2*i), BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	for answered < n {
		f, err := fr.ReadFrame()
		if err != nil {
			break // the deadline, or the tunnel closed
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			if f.StreamID >= 3 {
				answered++
			}
		}
	}
	return http.StatusSwitchingProtocols, answered
}

// TestSidestep2UpgradeTunnels (issue 26 item 1): an `Upgrade: h2c` must not open a tunnel of
// HTTP/2 streams past the limiter. The gateway removes protocols that upgrade_protocols does
// not list (and HTTP2-Settings) before forwarding, so the upstream sees a plain request; an
// upstream that switches protocols unasked gets no tunnel (502); WebSocket still passes by
// default, judged like any request, and not when upgrade_protocols is empty.
func TestSidestep2UpgradeTunnels(t *testing.T) {
	var hits atomic.Int64
	seen := &syncBuffer{}
	g := startGateway(t, lenientH2C(t, &hits, seen), `policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 1/h
    burst: 2
`)
	status, answered := h2cTunnel(t, g.proxy, 20)
	if status == http.StatusSwitchingProtocols || answered > 0 {
		t.Errorf("Upgrade: h2c: got %d and %d tunnelled streams answered, want no 101 and no stream", status, answered)
	}
	if n := hits.Load(); n > 2 {
		t.Errorf("the upstream ran %d requests for a per-ip burst of 2, want at most 2", n)
	}
	if s := seen.String(); strings.Contains(s, "h2c") || strings.Contains(s, "AAMAAABkAAQAAP__") {
		t.Errorf("the upstream saw %s; want neither Upgrade: h2c nor HTTP2-Settings", s)
	}
	// Mixed with an allowed protocol, h2c is still removed.
	seenBefore := len(seen.String())
	if code, _ := sendRaw(t, g.proxy, "GET", "/", "Connection", "Upgrade", "Upgrade", "h2c, TLS/1.2"); code == http.StatusSwitchingProtocols {
		t.Errorf("Upgrade: h2c, TLS/1.2: got 101, want a plain answer")
	}
	if s := seen.String()[seenBefore:]; strings.Contains(s, "h2c") || strings.Contains(s, "TLS") {
		t.Errorf("the upstream saw %s; want the Upgrade header removed", s)
	}

	// An upstream that answers 101 to a request that asked for no switch (ReverseProxy
	// already refuses a switch to another protocol than the one asked for; checkSwitch
	// keeps it so whatever the upstream writes).
	rogue := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nfree tunnel")
		brw.Flush()
		io.Copy(io.Discard, brw)
	}))
	t.Cleanup(rogue.Close)
	g2 := startGateway(t, rogue.URL, ipPolicy)
	if code, body := sendRaw(t, g2.proxy, "GET", "/"); code != http.StatusBadGateway {
		t.Errorf("an upstream switching protocols unasked: got %d %q, want 502", code, body)
	}

	// WebSocket passes by default and is judged: per-ip burst 2.
	wsUp := httptest.NewServer(websocket.Handler(func(c *websocket.Conn) { io.Copy(c, c) }))
	t.Cleanup(wsUp.Close)
	g3 := startGateway(t, wsUp.URL, strings.Replace(ipPolicy, "burst: 3", "burst: 2", 1))
	var results []string
	for i := 0; i < 3; i++ {
		results = append(results, wsEcho(g3.proxy))
	}
	if fmt.Sprint(results) != "[echo echo refused]" {
		t.Errorf("three WebSocket sessions, per-ip burst 2: got %v, want [echo echo refused]", results)
	}
	g4 := startGateway(t, wsUp.URL, "upgrade_protocols: []\n"+ipPolicy)
	if got := wsEcho(g4.proxy); got != "refused" {
		t.Errorf("WebSocket with upgrade_protocols []: got %s, want refused", got)
	}
}

// wsEcho opens a WebSocket session through the gateway at addr and returns "echo" when a
// message came back, else "refused".
func wsEcho(addr string) string {
	cfg, err := websocket.NewConfig("ws"+strings.TrimPrefix(addr, "http")+"/ws", addr)
	if err != nil {
		return "refused"
	}
	cfg.Dialer = &net.Dialer{Timeout: 5 * time.Second}
	conn, err := websocket.DialConfig(cfg)
	if err != nil {
		return "refused"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var got string
	if websocket.Message.Send(conn, "hi") != nil || websocket.Message.Receive(conn, &got) != nil || got != "hi" {
		return "refused"
	}
	return "echo"
}

// TestSidestep2HopByHopHeaders (issue 26 item 1, the review of every hop-by-hop header): what
// describes the client's connection never reaches the upstream, HTTP2-Settings included when
// Connection does not name it; TE survives only as "trailers".
func TestSidestep2HopByHopHeaders(t *testing.T) {
	hop := []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Http2-Settings", "Upgrade", "Trailer"}
	rs, upURL := foldingUpstream(t, goMux, append(hop, "Te")...)
	g := startGateway(t, upURL, ipPolicy)
	code, _ := sendRaw(t, g.proxy, "GET", "/", "Connection", "keep-alive, X-Hop", "X-Hop", "1", "Keep-Alive", "timeout=5",
		"TE", "gzip", "Proxy-Authorization", "Basic eDp5", "Proxy-Connection", "keep-alive", "HTTP2-Settings", "AAMAAABkAAQAAP__",
		"Upgrade", "h2c", "Trailer", "X-Sum")
	if code != http.StatusOK {
		t.Fatalf("got %d, want 200", code)
	}
	if h := rs.last(); len(h) != 0 {
		t.Errorf("the upstream got hop-by-hop headers %v, want none", h)
	}
	sendRaw(t, g.proxy, "GET", "/", "TE", "trailers")
	if h := rs.last(); len(h["Te"]) != 1 || h["Te"][0] != "trailers" {
		t.Errorf("TE: trailers: the upstream got %v, want TE: trailers", h)
	}
}
