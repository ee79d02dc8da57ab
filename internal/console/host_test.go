package console

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHostGuardAllows: the names a rebinding page could send are refused, the listener's own
// are answered, whatever their port, case, trailing dot, brackets or zone.
func TestHostGuardAllows(t *testing.T) {
	v4 := &net.TCPAddr{IP: net.ParseIP("192.0.2.2"), Port: 9090}
	v4in6 := &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.2"), Port: 9090}
	ll := &net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0", Port: 9090}
	lo := &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 9090}
	cases := []struct {
		listen string
		hosts  []string
		local  net.Addr // the address the connection arrived on; nil: none known
		host   string
		want   bool
	}{
		{":9090", nil, lo, "127.0.0.1:9090", true},
		{":9090", nil, lo, "127.0.0.1", true},
		{":9090", nil, lo, "127.3.4.5:1234", true}, // all of 127/8 is loopback
		{":9090", nil, lo, "[::1]:9090", true},
		{":9090", nil, lo, "[::1]", true},
		{":9090", nil, lo, "localhost:9090", true},
		{":9090", nil, lo, "LocalHost.:8000", true}, // case, trailing dot, another port (port-forward)
		{":9090", nil, lo, "", true},                // HTTP/1.0 without Host: not a browser
		{":9090", nil, lo, "evil.example:9090", false},
		{":9090", nil, lo, "evil.example", false},
		{":9090", nil, lo, "EVIL.example.:9090", false},
		{":9090", nil, lo, "localhost.evil.example:9090", false},
		{":9090", nil, lo, "127.0.0.1.nip.io:9090", false},
		{":9090", nil, lo, "foo.localhost:9090", false},
		{":9090", nil, lo, "0.0.0.0:9090", false},
		{":9090", nil, lo, "[::]:9090", false},
		{":9090", nil, lo, "localhost:9090:9090", false},
		// A pod probed or scraped by its IP, the listener on :9090: the address connected to.
		{":9090", nil, v4, "192.0.2.2:9090", true},
		{":9090", nil, v4in6, "192.0.2.2:9090", true},
		{":9090", nil, v4, "[::ffff:192.0.2.2]:9090", true},
		{":9090", nil, v4, "192.0.2.3:9090", false},
		{":9090", nil, lo, "192.0.2.2:9090", false}, // another address than the one connected to
		{":9090", nil, nil, "192.0.2.2:9090", false},
		{":9090", nil, ll, "[fe80::1%25eth0]:9090", true},
		{":9090", nil, ll, "[fe80::2%25eth0]:9090", false},
		// admin_listen's own host, and admin.hosts.
		{"192.0.2.9:9090", nil, lo, "192.0.2.9:9090", true},
		{"console.internal:9090", nil, lo, "Console.Internal:9090", true},
		{":9090", []string{"admin.ns.svc", "10.0.0.7", "[fd00::7]"}, lo, "admin.ns.svc.:9090", true},
		{":9090", []string{"admin.ns.svc", "10.0.0.7", "[fd00::7]"}, lo, "10.0.0.7", true},
		{":9090", []string{"admin.ns.svc", "10.0.0.7", "[fd00::7]"}, lo, "[fd00::7]:9090", true},
		{":9090", []string{"admin.ns.svc"}, lo, "evil.ns.svc:9090", false},
		{":9090", []string{"admin.ns.svc"}, lo, "admin.ns.svc.evil.example:9090", false},
	}
	for _, tc := range cases {
		g := NewHostGuard(tc.listen, tc.hosts)
		r := httptest.NewRequest(http.MethodGet, "/v1/policies", nil)
		r.Host = tc.host
		if tc.local != nil {
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, tc.local))
		}
		if got := g.Allows(r); got != tc.want {
			t.Errorf("listen %s, hosts %v, local %v, Host %q: allowed %v, want %v", tc.listen, tc.hosts, tc.local, tc.host, got, tc.want)
		}
	}
}

// serveGuarded serves the console behind the guard (as the admin listener does) on a real
// socket bound to addr, and returns its port.
func serveGuarded(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: NewHostGuard(addr, nil).Handler(h), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// fetchWithHost sends GET url over a real connection with Host set to host ("": the URL's).
func fetchWithHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRebindingRefusedOnSocket: over a real socket, a client naming a foreign Host (what a
// browser sends after DNS rebinding) gets 421 and nothing of the console, on every path;
// the listener's own names get the answer.
func TestRebindingRefusedOnSocket(t *testing.T) {
	_, _, _, h := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "")
	port := serveGuarded(t, "127.0.0.1:0", h)
	base := "http://127.0.0.1:" + port
	for _, path := range []string{"/", "/v1/policies", "/v1/top/p", "/v1/exemptions"} {
		code, body := fetchWithHost(t, base+path, "evil.example:"+port)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "admin.hosts") || strings.Contains(body, `"policies"`) {
			t.Errorf("GET %s with Host evil.example: %d %s, want a 421 problem naming admin.hosts", path, code, body)
		}
		for _, host := range []string{"", "localhost:" + port, "[::1]:" + port} {
			if code, body := fetchWithHost(t, base+path, host); code != http.StatusOK {
				t.Errorf("GET %s with Host %q: %d %s, want 200", path, host, code, body)
			}
		}
	}
}

// TestRefusalNamesNoConfiguredHost: the 421 (which a rebinding page can read) does not list the
// names of admin.hosts, which may be internal.
func TestRefusalNamesNoConfiguredHost(t *testing.T) {
	h := NewHostGuard(":9090", []string{"admin.internal.example"}).Handler(http.NotFoundHandler())
	req := httptest.NewRequest(http.MethodGet, "/v1/top/p", nil)
	req.Host = "rebind.example:9090"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusMisdirectedRequest || strings.Contains(rec.Body.String(), "admin.internal.example") {
		t.Fatalf("%d %s, want a 421 that does not name admin.internal.example", rec.Code, rec.Body.String())
	}
}

// TestGuardUsesTheAddressConnectedTo: a listener on every address (as admin_listen :9090 in a
// pod) answers a client naming the non-loopback address it connected to (a kubelet probe or a
// scrape by the pod's IP), and refuses one naming another address.
func TestGuardUsesTheAddressConnectedTo(t *testing.T) {
	ip := nonLoopbackIP(t)
	_, _, _, h := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "")
	port := serveGuarded(t, ":0", h)
	hp := net.JoinHostPort(ip.String(), port)
	if code, body := fetchWithHost(t, "http://"+hp+"/v1/policies", ""); code != http.StatusOK {
		t.Fatalf("GET by %s, the address connected to: %d %s, want 200", hp, code, body)
	}
	if code, body := fetchWithHost(t, "http://"+hp+"/v1/policies", "192.0.2.254:"+port); code != http.StatusMisdirectedRequest {
		t.Fatalf("GET by %s naming 192.0.2.254: %d %s, want 421", hp, code, body)
	}
}

// nonLoopbackIP returns an address of this machine's interfaces that is not loopback, or
// skips: without one the case cannot arise.
func nonLoopbackIP(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			if ip := n.IP.To4(); ip.String() != "192.0.2.254" {
				return ip
			}
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine's interfaces")
	return nil
}

// TestCrossOriginWritesRefused: a write sent by a browser from another origin is refused with
// 403 even with the token; the same write from the CLI (no Origin, no Sec-Fetch-Site) passes.
func TestCrossOriginWritesRefused(t *testing.T) {
	_, _, _, h := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "")
	g := CrossOrigin(h)
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "http://evil.example"},
	} {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:9090/v1/keys/p/reset", strings.NewReader(`{"key":"192.0.2.1"}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		g.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "cross-origin") {
			t.Errorf("write with %v: %d %s, want a 403 cross-origin problem", hdr, rec.Code, rec.Body.String())
		}
	}
	req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:9090/v1/keys/p/reset", strings.NewReader(`{"key":"192.0.2.1"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	rec := httptest.NewRecorder()
	g.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("write without Origin: %d %s, want 200", rec.Code, rec.Body.String())
	}
}
