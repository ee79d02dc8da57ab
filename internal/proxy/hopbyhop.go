package proxy

// Hop-by-hop headers: what the gateway lets through to the upstream about the connection
// itself. httputil.ReverseProxy removes the standard ones (Connection and every header it
// names, Proxy-Connection, Keep-Alive, Proxy-Authenticate, Proxy-Authorization, TE but
// "trailers", Trailer, Transfer-Encoding) and then puts Upgrade back for a request that asked
// for a protocol switch, whatever the protocol. A switch the upstream accepts turns the
// connection into a tunnel that the limiter never sees again: an `Upgrade: h2c` answered 101
// carries any number of HTTP/2 streams past every policy. So only the protocols that
// upgrade_protocols lists (WebSocket by default: one tunnel per request, and the request that
// opens it is judged like any other) reach the upstream; any other is removed from Upgrade
// (the request goes on as a plain one, which RFC 9110 §7.8 allows a server to make of it),
// HTTP2-Settings (h2c's upgrade companion) is always removed, and an upstream that switches
// protocols when no switch was forwarded gets no tunnel (502).

import (
	"errors"
	"net/http"
	"strings"
)

// DefaultUpgradeProtocols are the protocols a request may switch to when Options leave
// UpgradeProtocols nil: WebSocket.
var DefaultUpgradeProtocols = []string{"websocket"}

// upgrades is the set of protocols that may pass, by lower-case name (the part before any
// "/version").
type upgrades []string

func newUpgrades(names []string) upgrades {
	u := make(upgrades, 0, len(names))
	for _, n := range names {
		u = append(u, strings.ToLower(protocolName(n)))
	}
	return u
}

// protocolName is an Upgrade element's protocol name: `websocket` of `websocket`, `h2c` of
// `h2c`, `HTTP` of `HTTP/2.0`.
func protocolName(elem string) string {
	name, _, _ := strings.Cut(strings.TrimSpace(elem), "/")
	return name
}

func (u upgrades) allows(elem string) bool {
	name := protocolName(elem)
	for _, a := range u {
		if strings.EqualFold(name, a) {
			return true
		}
	}
	return false
}

// reviewHopByHop edits the headers of a request about to be forwarded (see the top of this
// file): it removes HTTP2-Settings, and from Upgrade every protocol not allowed (the header
// itself when none is left). A request without either costs two map lookups.
func (u upgrades) reviewHopByHop(h http.Header) {
	delete(h, "Http2-Settings")
	lines, ok := h["Upgrade"]
	if !ok {
		return
	}
	var keep []string
	for _, line := range lines {
		for _, elem := range strings.Split(line, ",") {
			if elem = strings.TrimSpace(elem); elem != "" && u.allows(elem) {
				keep = append(keep, elem)
			}
		}
	}
	if len(keep) == 0 {
		delete(h, "Upgrade")
		return
	}
	h["Upgrade"] = []string{strings.Join(keep, ", ")}
}

// errUnaskedSwitch fails a 101 answer to a request that asked for no protocol switch.
var errUnaskedSwitch = errors.New("proxy: the upstream switched protocols, but no switch was forwarded")

// checkSwitch is the reverse proxy's ModifyResponse: a 101 Switching Protocols is passed on
// (ReverseProxy then checks that it switched to the protocol asked for) only when the request
// forwarded an Upgrade; otherwise ReverseProxy would tunnel the connection to whatever the
// upstream chose.
func checkSwitch(res *http.Response) error {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return nil
	}
	if res.Request == nil || len(res.Request.Header["Upgrade"]) == 0 {
		return errUnaskedSwitch
	}
	return nil
}
