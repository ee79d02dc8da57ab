package e2e

// End-to-end tests of limits that cannot be sidestepped (issue 18, items 1 and 2): the upstream
// receives exactly the identity that was judged, and a request that an upstream folds into a
// limited route is charged by that route's policies. Each test sends what an attacker would,
// through the real binary over real sockets, to upstream doubles that fold requests as the
// named frameworks do (and to the real Flask when python3-flask is installed), and counts what
// the upstream actually ran.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// runs counts, per route, the handler runs of an upstream double, by the route the framework it
// imitates would run.
type runs struct {
	mu sync.Mutex
	n  map[string]int
	// seen records, per request, the values of the headers named in watch as the upstream got
	// them (all lines).
	watch []string
	seen  []http.Header
}

func (r *runs) add(route string, h http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[route]++
	got := http.Header{}
	for _, name := range r.watch {
		for k, vs := range h {
			if strings.EqualFold(k, name) {
				got[k] = append(got[k], vs...)
			}
		}
	}
	r.seen = append(r.seen, got)
}

func (r *runs) get(route string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[route]
}

func (r *runs) last() http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return nil
	}
	return r.seen[len(r.seen)-1]
}

// A folder is how a framework turns a request into the route (method and path) it runs.
type folder func(r *http.Request) string

// goMux routes as net/http handlers that compare r.Method and r.URL.Path do: exactly.
func goMux(r *http.Request) string { return r.Method + " " + r.URL.Path }

// flaskLike upper-cases the method (Werkzeug's Request.method) and routes on the decoded path,
// case-sensitively.
func flaskLike(r *http.Request) string { return strings.ToUpper(r.Method) + " " + r.URL.Path }

// expressLike routes as Express 4 with its defaults: the raw (still percent-encoded) path,
// case-insensitively, with an optional trailing slash (non-strict routing), and honours
// X-HTTP-Method-Override on POST as the method-override middleware does (the first of
// comma-joined values, upper-cased).
func expressLike(r *http.Request) string {
	m := r.Method
	if m == http.MethodPost {
		if v := strings.Join(r.Header.Values("X-Http-Method-Override"), ","); v != "" {
			v, _, _ = strings.Cut(v, ",")
			m = strings.ToUpper(strings.TrimSpace(v))
		}
	}
	p := strings.ToLower(r.URL.EscapedPath())
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return m + " " + p
}

// tomcatLike routes as Tomcat and Spring: `;` parameters are cut from every segment of the raw
// path before it is decoded, repeated slashes merged and dot segments resolved; case-sensitive.
func tomcatLike(r *http.Request) string {
	var segs []string
	for _, s := range strings.Split(r.URL.EscapedPath(), "/") {
		s, _, _ = strings.Cut(s, ";")
		d, err := url.PathUnescape(s)
		if err != nil {
			return "400"
		}
		switch d {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, d)
		}
	}
	return r.Method + " /" + strings.Join(segs, "/")
}

// nginxLike merges slashes as nginx (merge_slashes on) does; case-sensitive.
func nginxLike(r *http.Request) string {
	p := r.URL.Path
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	return r.Method + " " + p
}

// aspnetLike routes as ASP.NET Core on IIS: backslashes are slashes, case-insensitive, an
// optional trailing slash.
func aspnetLike(r *http.Request) string {
	p := strings.ToLower(strings.ReplaceAll(r.URL.Path, `\`, "/"))
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return r.Method + " " + p
}

// foldingUpstream counts handler runs by the route fold gives and answers with it.
func foldingUpstream(t *testing.T, fold folder, watch ...string) (*runs, string) {
	t.Helper()
	rs := &runs{watch: watch}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		route := fold(r)
		rs.add(route, r.Header)
		fmt.Fprint(w, route)
	})
	return rs, up.URL
}

// sendRaw sends one HTTP/1.1 request written as is (method and target unchanged, header
// lines in order) and returns its status and body.
func sendRaw(t *testing.T, addr, method, target string, hdr ...string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n", method, target)
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	if method == "POST" || strings.EqualFold(method, "post") {
		b.WriteString("Content-Length: 0\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestSidestepRouteFolding: for each way an upstream folds requests into a route, a policy of
// burst 2 on that route holds: of six requests spelled as the upstream folds them, at most two
// run the limited handler. Spellings that no upstream agrees on (dot segments) are refused.
func TestSidestepRouteFolding(t *testing.T) {
	const policy = `policies:
  - name: login
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 2
    match: {methods: [POST], path_prefix: /api/login}
  - name: reports
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 2
    match: {methods: [GET], path_prefix: /api/reports/}
`
	tests := []struct {
		name   string
		fold   folder
		route  string      // the limited route as the upstream names it
		reqs   [][2]string // method, request-target
		header []string    // header pairs sent with each request
	}{
		{"method case (Flask, Django upper-case it)", flaskLike, "POST /api/login",
			[][2]string{{"post", "/api/login"}, {"Post", "/api/login"}, {"pOST", "/api/login"}, {"post", "/api/login"}, {"POST", "/api/login"}, {"posT", "/api/login"}}, nil},
		{"path case (Express routes case-insensitively)", expressLike, "POST /api/login",
			[][2]string{{"POST", "/API/LOGIN"}, {"POST", "/Api/Login"}, {"POST", "/api/LOGIN"}, {"POST", "/aPi/login"}, {"POST", "/API/login/"}, {"POST", "/api/Login"}}, nil},
		{"path parameters (Tomcat, Spring strip ;params)", tomcatLike, "POST /api/login",
			[][2]string{{"POST", "/api;x/login"}, {"POST", "/api/login;jsessionid=1"}, {"POST", "/api;/login"}, {"POST", "/api;a=b;c/login;d"}, {"POST", "/;x/api/login"}, {"POST", "/api%3Bx/login"}}, nil},
		{"percent-encoded letters (decoding upstreams)", flaskLike, "POST /api/login",
			[][2]string{{"POST", "/api/%6Cogin"}, {"POST", "/%61pi/login"}, {"POST", "/api/log%69n"}, {"POST", "/api%2Flogin"}, {"POST", "/%61%70%69/login"}, {"POST", "/api/%6c%6f%67%69%6e"}}, nil},
		{"merged slashes (nginx)", nginxLike, "POST /api/login",
			[][2]string{{"POST", "//api/login"}, {"POST", "/api//login"}, {"POST", "///api///login"}, {"POST", "/api/login"}, {"POST", "//api//login"}, {"POST", "/api/login"}}, nil},
		{"backslashes and case (ASP.NET on IIS)", aspnetLike, "POST /api/login",
			[][2]string{{"POST", `/api\login`}, {"POST", `\api\LOGIN`}, {"POST", `/API\login`}, {"POST", "/api/login"}, {"POST", `/api%5Clogin`}, {"POST", `/api/login\`}}, nil},
		{"dot segments (Tomcat resolves ..;)", tomcatLike, "POST /api/login",
			[][2]string{{"POST", "/public/..;/api/login"}, {"POST", "/public/../api/login"}, {"POST", "/api/./login"}, {"POST", "/x/%2e%2e/api/login"}, {"POST", "/x/.%2E/api/login"}, {"POST", "/api/x/..;/login"}}, nil},
		{"trailing slash (Express serves /x for /x/)", expressLike, "GET /api/reports",
			[][2]string{{"GET", "/api/reports"}, {"GET", "/api/reports"}, {"GET", "/API/Reports"}, {"GET", "/api/reports;x"}, {"GET", "/api/reports"}, {"GET", "/api/reports/"}}, nil},
		{"method override (Express method-override)", expressLike, "GET /api/reports",
			[][2]string{{"POST", "/api/reports/"}, {"POST", "/api/reports/"}, {"POST", "/api/reports/"}, {"POST", "/api/reports/"}, {"POST", "/api/reports/"}, {"POST", "/api/reports/"}},
			[]string{"X-HTTP-Method-Override", "get"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, upURL := foldingUpstream(t, tt.fold)
			g := startGateway(t, upURL, policy)
			var codes []int
			for _, rq := range tt.reqs {
				code, _ := sendRaw(t, g.proxy, rq[0], rq[1], tt.header...)
				codes = append(codes, code)
			}
			if got := rs.get(tt.route); got > 2 {
				t.Errorf("the upstream ran %s %d times (answers %v), want at most 2: the policy of burst 2 was sidestepped", tt.route, got, codes)
			}
			for i, c := range codes {
				if c != http.StatusOK && c != http.StatusTooManyRequests && c != http.StatusBadRequest {
					t.Errorf("request %d (%s %s): got %d, want 200, 429 or 400", i, tt.reqs[i][0], tt.reqs[i][1], c)
				}
			}
		})
	}
}

// TestSidestepDotSegmentsRefused: a path with a dot segment, which upstreams disagree on
// (Express keeps it, nginx and Tomcat resolve it), is refused with a problem naming it.
func TestSidestepDotSegmentsRefused(t *testing.T) {
	rs, upURL := foldingUpstream(t, goMux)
	g := startGateway(t, upURL, strings.Replace(ipPolicy, "burst: 3", "burst: 10", 1))
	for _, target := range []string{"/public/../api/login", "/a/./b", "/x/%2e%2E/y", "/a/..;/b", "/a/.."} {
		code, body := sendRaw(t, g.proxy, "GET", target)
		if code != http.StatusBadRequest || !strings.Contains(body, `"status":400`) {
			t.Errorf("GET %s: got %d %s, want a 400 problem", target, code, body)
		}
	}
	if got := rs.get("GET /public/../api/login"); got != 0 {
		t.Errorf("the upstream ran a dot-segment path %d times, want 0", got)
	}
	// A dot that is part of a segment is an ordinary path.
	if code, _ := sendRaw(t, g.proxy, "GET", "/.well-known/x..y/..."); code != http.StatusOK {
		t.Errorf("GET /.well-known/x..y/...: got %d, want 200", code)
	}
}

// TestSidestepCaseSensitiveOptOut: match.path_case_sensitive keeps a policy to the path's case
// for upstreams that route case-sensitively (and serve /Files and /files differently).
func TestSidestepCaseSensitiveOptOut(t *testing.T) {
	rs, upURL := foldingUpstream(t, goMux)
	g := startGateway(t, upURL, `policies:
  - name: lower
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 1
    match: {path_prefix: /files/, path_case_sensitive: true}
`)
	for i := 0; i < 3; i++ {
		if code, _ := sendRaw(t, g.proxy, "GET", "/FILES/a"); code != http.StatusOK {
			t.Fatalf("GET /FILES/a #%d: got %d, want 200 (the policy is case-sensitive)", i, code)
		}
	}
	codes := []int{}
	for i := 0; i < 2; i++ {
		code, _ := sendRaw(t, g.proxy, "GET", "/files;x/a")
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 429]" {
		t.Errorf("GET /files;x/a twice: got %v, want [200 429] (parameters are still ignored)", codes)
	}
	if got := rs.get("GET /FILES/a"); got != 3 {
		t.Errorf("upstream ran GET /FILES/a %d times, want 3", got)
	}
}

// TestSidestepMethodOverrideStrip: with method_override: strip the override headers never reach
// the upstream (nor their underscore spellings), and only the request's own method is judged.
func TestSidestepMethodOverrideStrip(t *testing.T) {
	rs, upURL := foldingUpstream(t, expressLike, "X-Http-Method-Override", "X-Http-Method", "X-Method-Override", "X_HTTP_Method_Override")
	g := startGateway(t, upURL, `method_override: strip
policies:
  - name: reads
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 1
    match: {methods: [GET]}
`)
	for i := 0; i < 3; i++ {
		code, _ := sendRaw(t, g.proxy, "POST", "/x", "X-HTTP-Method-Override", "GET", "X-HTTP-Method", "GET",
			"X-Method-Override", "GET", "X_HTTP_Method_Override", "GET")
		if code != http.StatusOK {
			t.Fatalf("POST #%d: got %d, want 200 (the GET policy does not judge a POST)", i, code)
		}
		if h := rs.last(); len(h) != 0 {
			t.Fatalf("the upstream got override headers %v, want none", h)
		}
	}
	if got := rs.get("POST /x"); got != 3 {
		t.Errorf("upstream ran POST /x %d times, want 3", got)
	}
}

// identityConfig limits per API key, per tenant header and per user (from a trusted sidecar).
const identityConfig = `trusted_proxies: [10.0.0.0/8]
identity:
  user_header: X-User-Id
policies:
  - name: per-key
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 2
  - name: per-tenant
    key: header:X-Tenant
    algorithm: token_bucket
    rate: 1/h
    burst: 2
  - name: per-user
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 2
`

// TestSidestepAmbiguousIdentity: an identity header sent twice with different values (the
// upstream's Header.Get reads the first, the gateway must not key a fresh bucket on anything
// else) is refused 400 with a problem naming the header, over HTTP/1.1 and HTTP/2; the same
// value sent twice reaches the upstream once and is charged.
func TestSidestepAmbiguousIdentity(t *testing.T) {
	var mu sync.Mutex
	byKey := map[string]int{}
	lines := map[string]int{}
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		byKey["key="+r.Header.Get("X-Api-Key")]++
		byKey["tenant="+r.Header.Get("X-Tenant")]++
		lines["X-Api-Key"] = max(lines["X-Api-Key"], len(r.Header["X-Api-Key"]))
		lines["X-Tenant"] = max(lines["X-Tenant"], len(r.Header["X-Tenant"]))
		mu.Unlock()
	})
	for _, proto := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(proto, func(t *testing.T) {
			mu.Lock()
			clear(byKey)
			clear(lines)
			mu.Unlock()
			g := startGateway(t, up.URL, identityConfig)
			client := http.DefaultClient
			if proto == "HTTP/2" {
				client = h2cClient()
			}
			send := func(hdr http.Header) (*http.Response, string) {
				t.Helper()
				req, _ := http.NewRequest("GET", g.proxy+"/", nil)
				req.Header = hdr
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if want := map[string]int{"HTTP/1.1": 1, "HTTP/2": 2}[proto]; resp.ProtoMajor != want {
					t.Fatalf("got %s, want %s", resp.Proto, proto)
				}
				return resp, string(body)
			}
			for _, name := range []string{"X-Api-Key", "X-Tenant"} {
				for i := 0; i < 5; i++ {
					resp, body := send(http.Header{name: {"k1", fmt.Sprintf("junk%d", i)}})
					var p struct {
						Status int    `json:"status"`
						Detail string `json:"detail"`
					}
					_ = json.Unmarshal([]byte(body), &p)
					if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Detail, name) {
						t.Errorf("%s sent as k1 and junk%d: got %d %s, want a 400 problem naming %s", name, i, resp.StatusCode, body, name)
					}
				}
			}
			mu.Lock()
			if n := byKey["key=k1"] + byKey["tenant=k1"]; n != 0 {
				t.Errorf("the upstream acted on k1 %d times for requests with conflicting values, want 0", n)
			}
			mu.Unlock()
			// The same value twice is one value: charged once per request, forwarded once.
			var codes []int
			for i := 0; i < 3; i++ {
				resp, _ := send(http.Header{"X-Api-Key": {"k2", "k2"}})
				codes = append(codes, resp.StatusCode)
			}
			if fmt.Sprint(codes) != "[200 200 429]" {
				t.Errorf("X-Api-Key k2 sent twice, 3 times: got %v, want [200 200 429]", codes)
			}
			mu.Lock()
			if lines["X-Api-Key"] != 1 {
				t.Errorf("the upstream got X-Api-Key on %d lines, want 1", lines["X-Api-Key"])
			}
			mu.Unlock()
		})
	}
}

// TestSidestepUntrustedUserHeader: X-User-Id from a peer outside trusted_proxies is not judged,
// so it must not reach the upstream either (nor its underscore spelling, which CGI-style
// servers read as the same header).
func TestSidestepUntrustedUserHeader(t *testing.T) {
	rs, upURL := foldingUpstream(t, goMux, "X-User-Id", "X_User_Id")
	g := startGateway(t, upURL, identityConfig)
	for i := 0; i < 4; i++ {
		code, _ := sendRaw(t, g.proxy, "GET", "/", "X-User-Id", "alice", "X_User_Id", "bob")
		if code != http.StatusOK {
			t.Fatalf("request %d: got %d, want 200 (the test client is no trusted proxy: no user)", i, code)
		}
		if h := rs.last(); len(h) != 0 {
			t.Fatalf("the upstream got %v from an untrusted peer, want no user header", h)
		}
	}
}

// flaskApp is a Flask application with a limited route; it prints its port when ready.
const flaskApp = `import sys, threading
from flask import Flask, request
from werkzeug.serving import make_server
app = Flask(__name__)
runs = {}
lock = threading.Lock()
@app.route("/api/login", methods=["POST"])
def login():
    with lock:
        runs["login"] = runs.get("login", 0) + 1
    return "login"
@app.route("/runs")
def count():
    with lock:
        return str(runs.get("login", 0))
srv = make_server("127.0.0.1", 0, app, threaded=True)
print(srv.server_port, flush=True)
srv.serve_forever()
`

// flaskPython returns a Python that imports flask: the one on PATH (a virtualenv or pyenv may
// shadow Debian's) or Debian's own /usr/bin/python3, where python3-flask installs it.
func flaskPython() (string, error) {
	var errs []error
	for _, name := range []string{"python3", "/usr/bin/python3"} {
		py, err := exec.LookPath(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out, err := exec.Command(py, "-c", "import flask").CombinedOutput()
		if err == nil {
			return py, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w: %s", py, err, bytes.TrimSpace(out)))
	}
	return "", errors.Join(errs...)
}

// TestSidestepRealFlask: the real Flask (Debian's python3-flask) upper-cases the method and
// decodes the path; a POST /api/login policy of burst 2 holds against both.
func TestSidestepRealFlask(t *testing.T) {
	py, err := flaskPython()
	if err != nil {
		t.Skipf("flask is not installed (scripts/test.sh installs Debian's python3-flask): %v", err)
	}
	script := filepath.Join(t.TempDir(), "app.py")
	if err := os.WriteFile(script, []byte(flaskApp), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var port int
	if _, err := fmt.Fscan(stdout, &port); err != nil {
		t.Fatalf("flask did not print its port: %v", err)
	}
	upURL := fmt.Sprintf("http://127.0.0.1:%d", port)
	g := startGateway(t, upURL, `policies:
  - name: login
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 2
    match: {methods: [POST], path_prefix: /api/login}
`)
	for _, rq := range [][2]string{{"post", "/api/login"}, {"Post", "/api/%6Cogin"}, {"POST", "/API/login"}, {"pOsT", "/api/log%69n"}, {"post", "/%61pi/login"}, {"POST", "/api/login"}} {
		sendRaw(t, g.proxy, rq[0], rq[1])
	}
	_, body := get(t, upURL+"/runs")
	if body != "0" && body != "1" && body != "2" {
		t.Errorf("Flask ran POST /api/login %s times, want at most 2", body)
	}
}

// TestSidestepJWTQueryToken: a bearer token in the access_token query parameter (RFC 6750),
// which an upstream may accept, is verified and charged like the header's: a bad one is never
// forwarded, a good one is limited per user, and one beside the header's is refused.
func TestSidestepJWTQueryToken(t *testing.T) {
	rs, upURL := foldingUpstream(t, goMux)
	g := startGateway(t, upURL, jwtIdentity+`  - name: per-user
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 1
`, "E2E_JWT_SECRET="+jwtSecret)
	good, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := sendRaw(t, g.proxy, "GET", "/q?access_token=not.a.jwt"); code != http.StatusUnauthorized {
		t.Errorf("bad query token: got %d, want 401", code)
	}
	if code, _ := sendRaw(t, g.proxy, "GET", "/q?access_token="+good, "Authorization", "Bearer "+good); code != http.StatusUnauthorized {
		t.Errorf("query and header token: got %d, want 401", code)
	}
	var codes []int
	for i := 0; i < 3; i++ {
		code, _ := sendRaw(t, g.proxy, "GET", "/q?access_token="+good)
		codes = append(codes, code)
	}
	if fmt.Sprint(codes) != "[200 429 429]" {
		t.Errorf("good query token 3 times: got %v, want [200 429 429] (per-user burst 1)", codes)
	}
	if got := rs.get("GET /q"); got != 1 {
		t.Errorf("the upstream ran GET /q %d times, want 1", got)
	}
}
