package e2e

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// getHost sends GET url over a real connection naming host in its Host header (""; the URL's),
// with the header pairs, and returns the status and body.
func getHost(t *testing.T, url, host string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminListenerRefusesForeignHost: the binary's admin listener, asked over a real socket
// with the Host a browser sends after DNS rebinding (rebind.example re-pointed at 127.0.0.1),
// answers 421 on every path and shows nothing; asked by its own address it answers. A key is
// looked up by its raw value only with the token, and an IP key is shown as the access log's
// pseudonym, never in clear. A browser's cross-origin write is refused even with the token. The
// CLI, given a config whose admin_listen binds every address, sends a Host the listener accepts.
func TestAdminListenerRefusesForeignHost(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, adminPolicies, "ADMIN_TOKEN="+adminToken, "PSEUDO_SECRET="+adminPseudoKey)
	ps := policy.NewPseudonyms([]byte(adminPseudoKey))
	ipShown := ps.Of("ip", "127.0.0.1")
	for range 3 {
		get(t, g.proxy+"/x", "X-Api-Key", adminKeyPrefix+"host")
	}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(g.admin, "http://"))

	for _, path := range []string{"/", "/v1/policies", "/v1/top/per-ip", "/v1/exemptions", "/metrics", "/healthz", "/readyz"} {
		code, body := getHost(t, g.admin+path, "rebind.example:"+port)
		if code != http.StatusMisdirectedRequest || !strings.Contains(body, "admin.hosts") ||
			strings.Contains(body, "per-ip") || strings.Contains(body, ipShown) || strings.Contains(body, "ratelimit_") {
			t.Errorf("GET %s with Host rebind.example: %d %s, want a bare 421 problem naming admin.hosts", path, code, body)
		}
		for _, host := range []string{"", "localhost:" + port, "LOCALHOST.:" + port} {
			if code, body := getHost(t, g.admin+path, host); code != http.StatusOK {
				t.Errorf("GET %s with Host %q: %d %s, want 200", path, host, code, body)
			}
		}
	}

	// The IP key: its pseudonym in top, never the address; a raw lookup needs the token.
	code, body := getHost(t, g.admin+"/v1/top/per-ip", "")
	if code != http.StatusOK || !strings.Contains(body, ipShown) || strings.Contains(body, "127.0.0.1") {
		t.Errorf("top of per-ip: %d %s, want the key as its pseudonym %s, not 127.0.0.1", code, body, ipShown)
	}
	for _, u := range []string{"/v1/keys/per-ip?key=127.0.0.1", "/v1/keys/per-key?key=" + adminKeyPrefix + "host"} {
		code, body := adminCall(t, http.MethodGet, g.admin+u, "", nil)
		if code != http.StatusUnauthorized || strings.Contains(body, ipShown) || strings.Contains(body, ps.Of("api_key", adminKeyPrefix+"host")) {
			t.Errorf("GET %s without the token: %d %s, want 401 naming no pseudonym", u, code, body)
		}
	}
	if ks := peekKey(t, g.admin, "per-ip", "127.0.0.1"); ks.Key != ipShown {
		t.Errorf("GET key 127.0.0.1 with the token shows %q, want its pseudonym %s", ks.Key, ipShown)
	}
	code, body = adminCall(t, http.MethodGet, g.admin+"/v1/keys/per-ip?pseudonym="+ipShown, "", nil)
	if code != http.StatusOK || !strings.Contains(body, ipShown) {
		t.Errorf("GET by pseudonym without a token: %d %s, want 200", code, body)
	}

	// A browser's cross-origin write, with the token: 403.
	req, _ := http.NewRequest(http.MethodPost, g.admin+"/v1/keys/per-ip/reset", strings.NewReader(`{"key":"127.0.0.1"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Origin", "http://rebind.example:"+port)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a cross-origin write with the token: %d, want 403", resp.StatusCode)
	}

	// The CLI: admin_listen on every address (as in deploy/kubernetes) is reached by loopback.
	for _, listen := range []string{":" + port, "0.0.0.0:" + port} {
		cfg := filepath.Join(t.TempDir(), "cli.yaml")
		if err := os.WriteFile(cfg, []byte(config("127.0.0.1:1", listen, up.URL, adminPolicies)), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errs := runBinary(t, func(c *exec.Cmd) {
			c.Env = append(c.Environ(), "ADMIN_TOKEN="+adminToken, "PSEUDO_SECRET="+adminPseudoKey)
		}, "admin", "get", "per-ip", "127.0.0.1", "--config", cfg)
		if code != 0 || !strings.Contains(out, ipShown) {
			t.Errorf("admin get with admin_listen %s: exit %d\n%s\n%s", listen, code, out, errs)
		}
	}
}

// TestAdminProbeByPodAddress: with admin_listen ":PORT" (deploy/kubernetes' configmap), a
// kubelet probe or a Prometheus scrape reaches the pod by its IP and names it in Host: that is
// the address the connection arrived on, so /readyz, /healthz and /metrics answer; a Host
// naming another address is refused.
func TestAdminProbeByPodAddress(t *testing.T) {
	ip := hostNonLoopbackIP(t)
	up := newUpstream(t, nil)
	ports := gatewayPorts(t, 2)
	_, port, _ := net.SplitHostPort(ports[1])
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(config(ports[0], ":"+port, up.URL, ipPolicy)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, []string{"serve", "--config", cfg}, nil, nil)
	podAddr := "http://" + net.JoinHostPort(ip, port)
	eventually(t, "the gateway ready on "+podAddr, func() bool {
		select {
		case <-p.exited:
			t.Fatalf("the gateway exited: %v\n%s", p.exitErr, p.logs.String())
		default:
		}
		resp, err := http.Get(podAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	for _, path := range []string{"/readyz", "/healthz", "/metrics"} {
		if code, body := getHost(t, podAddr+path, ""); code != http.StatusOK {
			t.Errorf("GET %s by the pod's address %s: %d %s, want 200", path, ip, code, body)
		}
		if code, _ := getHost(t, podAddr+path, "192.0.2.254:"+port); code != http.StatusMisdirectedRequest {
			t.Errorf("GET %s naming another address: %d, want 421", path, code)
		}
	}
}

// hostNonLoopbackIP returns an IPv4 address of this machine that is not loopback (the pod's
// address in a cluster), or skips: without one the case cannot arise here.
func hostNonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() && n.IP.String() != "192.0.2.254" {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this machine's interfaces")
	return ""
}
