package policy

import (
	"fmt"
	"net/http"
	"strings"
)

// gatewayHeaders are the request headers the gateway sets, rewrites or removes before the
// upstream sees the request, and why a key on one would be judged on a value the upstream
// never acts on: a client could send a new value with every request (a fresh bucket each
// time) while the upstream sees one.
var gatewayHeaders = map[string]string{
	// Set from the connection (or a trusted proxy's value): what the client sent is replaced.
	"X-Forwarded-For":   "is rewritten by the gateway (the client's address is appended or put in its place)",
	"X-Forwarded-Host":  "is rewritten by the gateway (set to the request's Host unless a trusted proxy sent it)",
	"X-Forwarded-Proto": "is rewritten by the gateway (set to the connection's scheme unless a trusted proxy sent it)",
	"Forwarded":         "is removed by the gateway before forwarding",
	// Not touched by the gateway, but it is the client's address as a proxy claims it: any
	// client can write one.
	"X-Real-Ip": "is the client's address as written by whoever sent the request (any client can forge it)",
	// Hop-by-hop (RFC 9110 §7.6.1): removed before forwarding.
	"Connection":          "is a hop-by-hop header, removed by the gateway before forwarding",
	"Proxy-Connection":    "is a hop-by-hop header, removed by the gateway before forwarding",
	"Keep-Alive":          "is a hop-by-hop header, removed by the gateway before forwarding",
	"Te":                  "is a hop-by-hop header, removed by the gateway before forwarding",
	"Trailer":             "is a hop-by-hop header, removed by the gateway before forwarding",
	"Upgrade":             "is a hop-by-hop header, removed by the gateway unless the upgrade is allowed",
	"Proxy-Authorization": "is a hop-by-hop header, removed by the gateway before forwarding",
	"Proxy-Authenticate":  "is a hop-by-hop header, removed by the gateway before forwarding",
	"Http2-Settings":      "is a hop-by-hop header, removed by the gateway before forwarding",
}

// gatewayHeader says why a key cannot be read from the header name (any spelling that a
// CGI-style server reads as the same variable: X_Forwarded_For is X-Forwarded-For), naming
// what to key by instead, or returns "".
func gatewayHeader(name string) string {
	for h, why := range gatewayHeaders {
		if sameCGIName(http.CanonicalHeaderKey(name), h) {
			if h == "X-Forwarded-For" || h == "Forwarded" || h == "X-Real-Ip" {
				return h + " " + why + ", so a client could rotate it freely while the upstream sees one value; key by ip instead (with trusted_proxies, ip reads the address your proxies forward)"
			}
			return h + " " + why + ", so a client could rotate it freely while the upstream sees one value; key by ip, api_key or a header the upstream reads"
		}
	}
	return ""
}

// checkUpgrades validates upgrade_protocols: protocol tokens, never one that tunnels HTTP/2.
func checkUpgrades(es *Errors, list []string) {
	for i, p := range list {
		path := fmt.Sprintf("upgrade_protocols[%d]", i)
		name, _, _ := strings.Cut(p, "/")
		switch {
		case p == "" || !validToken(p):
			es.add(path, p, "must be a protocol token such as websocket")
		case strings.EqualFold(name, "h2c"), strings.EqualFold(name, "h2"), strings.EqualFold(p, "HTTP/2"), strings.EqualFold(p, "HTTP/2.0"):
			es.add(path, p, "would tunnel HTTP/2 streams that no policy sees; clients reach the gateway over h2c or h2 directly")
		}
	}
}

// validToken reports whether s is an Upgrade element: a token, optionally "/" and a token.
func validToken(s string) bool {
	name, version, slash := strings.Cut(s, "/")
	ok := func(t string) bool {
		if t == "" {
			return false
		}
		for i := 0; i < len(t); i++ {
			if !isTchar(t[i]) {
				return false
			}
		}
		return true
	}
	return ok(name) && (!slash || ok(version))
}

// checkGRPCRoutes validates grpc_routes: path prefixes from the root.
func checkGRPCRoutes(es *Errors, list []string) {
	for i, p := range list {
		if p == "" || p[0] != '/' {
			es.add(fmt.Sprintf("grpc_routes[%d]", i), p, "must be a path prefix starting with /")
		}
	}
}
