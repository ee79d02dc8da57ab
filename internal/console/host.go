package console

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// The admin listener's guard against DNS rebinding and cross-site writes.
//
// A web page whose name (evil.example) an attacker re-points at 127.0.0.1, or at a pod's
// address, is same-origin with the admin listener in the browser's eyes: without a check of
// Host, it could read /v1/top, the page and the exemptions from an operator's browser. A
// rebinding browser always sends the attacker's name as Host, so answering only the
// listener's own names closes it. The own names are:
//   - loopback: localhost and any loopback address (127.0.0.0/8, ::1);
//   - the address the connection arrived on (http.LocalAddrContextKey): with admin_listen
//     :9090, a probe or scrape by the pod's IP names the address it connected to, which is
//     ours; an address the attacker chose is not;
//   - admin_listen's host, when it is a name;
//   - the names and addresses in admin.hosts (a Service name, a port-forwarded address).
//
// The port is not compared (kubectl port-forward and Docker's -p change it, and a rebinding
// attack is about the name), case and one trailing dot are ignored (both name the same host),
// an IPv6 literal may be bracketed and carry a zone. A request without Host (HTTP/1.0) is
// answered: browsers always send one, so it cannot be a rebinding browser. Anything else is
// answered 421 Misdirected Request (RFC 9110 15.5.20: this server does not answer for that
// authority), before any handler runs.

// HostGuard answers only requests whose Host names the admin listener. It is immutable and
// safe for concurrent use; build it with NewHostGuard.
type HostGuard struct {
	names map[string]bool     // lower-case, no trailing dot
	addrs map[netip.Addr]bool // unmapped, no zone
}

// NewHostGuard returns the guard of a listener on listen (admin_listen) that also accepts
// hosts (admin.hosts: names or IP literals, no port; validated by the config).
func NewHostGuard(listen string, hosts []string) *HostGuard {
	g := &HostGuard{names: map[string]bool{"localhost": true}, addrs: map[netip.Addr]bool{}}
	add := func(h string) {
		if h == "" {
			return
		}
		if a, ok := parseAddr(h); ok {
			if !a.IsUnspecified() {
				g.addrs[a] = true
			}
			return
		}
		g.names[canonicalName(h)] = true
	}
	if h, _, err := net.SplitHostPort(listen); err == nil {
		add(h)
	}
	for _, h := range hosts {
		add(h)
	}
	return g
}

// Allows reports whether r's Host names this listener (the rules at the top of this file).
func (g *HostGuard) Allows(r *http.Request) bool {
	if r.Host == "" {
		return true
	}
	h := hostOf(r.Host)
	if a, ok := parseAddr(h); ok {
		if a.IsLoopback() || g.addrs[a] {
			return true
		}
		la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if !ok {
			return false
		}
		if ap, err := netip.ParseAddrPort(la.String()); err == nil {
			return ap.Addr().WithZone("").Unmap() == a
		}
		return false
	}
	return g.names[canonicalName(h)]
}

// Handler answers 421 to requests that Allows refuses and passes the others to next.
func (g *HostGuard) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Allows(r) {
			shown := r.Host
			if len(shown) > 100 {
				shown = shown[:100] + "..."
			}
			writeProblem(w, http.StatusMisdirectedRequest, "misdirected",
				// The names of admin.hosts are not listed: whoever sent a foreign Host (a
				// rebinding page reads this answer) learns no internal name.
				fmt.Sprintf("Host %q does not name this admin listener (it answers localhost, loopback addresses, the address connected to, admin_listen's host and the names of admin.hosts): add the name to admin.hosts if operators reach it by that name.", shown))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hostOf is the host of a Host header value: without its port and an IPv6 literal's brackets.
func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		return hostport[1 : len(hostport)-1]
	}
	return hostport // no port, or an unbracketed IPv6 literal
}

// parseAddr parses an IP literal (a zone written as in a URL, %25, or plainly), unmapped and
// without its zone: a link-local address names one host whatever the interface's name.
func parseAddr(h string) (netip.Addr, bool) {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	h = strings.Replace(h, "%25", "%", 1)
	a, err := netip.ParseAddr(h)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// canonicalName is a host name as compared: lower case, without the root's trailing dot.
func canonicalName(h string) string {
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// CrossOrigin refuses (403) writes that a browser sends from another origin (Sec-Fetch-Site,
// or an Origin that is not the Host), with the standard library's CSRF check. Writes already
// need a bearer token, which no browser attaches by itself; this keeps a forged write from
// reaching the token check at all. The CLI and scripts send neither header and pass.
func CrossOrigin(next http.Handler) http.Handler {
	p := http.NewCrossOriginProtection()
	p.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, http.StatusForbidden, "cross-origin",
			"A browser sent this write from another origin: admin writes come from the CLI or scripts, never from a web page.")
	}))
	return p.Handler(next)
}
