package policy

import (
	"net/netip"
	"regexp"
	"strings"
)

// addrLike finds what may be an IP address in a log text: bracketed IPv6, dotted IPv4, or bare
// IPv6 (two colons or more); each candidate is parsed before it is replaced, so that times
// (17:44:38) and version numbers of other shapes stay.
var addrLike = regexp.MustCompile(`\[[0-9A-Fa-f:.]+(%[^\]]*)?\]|\b\d{1,3}(\.\d{1,3}){3}\b|[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}(\.\d{1,3}){0,3}`)

// ScrubAddrs returns s with every IP address replaced by `ip:` and its pseudonym (the ip kind's,
// as Of gives it: lines about one client share it), ports kept. Server error logs (net/http's
// own, TLS handshakes, body read errors such as `read tcp A->B: i/o timeout`) name the client's
// address; logs never carry a raw one. A text without a digit is returned as is.
func (ps *Pseudonyms) ScrubAddrs(s string) string {
	if !strings.ContainsAny(s, "0123456789") {
		return s
	}
	return addrLike.ReplaceAllStringFunc(s, func(m string) string {
		inner := strings.TrimSuffix(strings.TrimPrefix(m, "["), "]")
		a, err := netip.ParseAddr(inner)
		if err != nil {
			return m
		}
		return "ip:" + ps.Of("ip", a.WithZone("").Unmap().String())
	})
}
