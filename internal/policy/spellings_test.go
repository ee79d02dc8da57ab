package policy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestAuthorityPath(t *testing.T) {
	for p, want := range map[string]bool{
		"//x/login": true, `/\x/login`: true, "/\t/x": true, "/\r\n\\x": true, "//": true,
		"/x//login": false, "/": false, "": false, "/x": false, "/\tx": false, "x//": false,
	} {
		if got := authorityPath(p); got != want {
			t.Errorf("authorityPath(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestAccessTokenNames(t *testing.T) {
	for k, want := range map[string]bool{
		"access_token": true, "Access_Token": true, "ACCESS_TOKEN": true, "access.token": true,
		"access token": true, "access[token": true, "  access_token": true, "access_token[]": true,
		"access_token[0]": true, "acceſs_token": true, "access_to\u212Aen": true, "access_token\x00x": true,
		"access[token]": false, "access_token_": false, "access-token": false, "xaccess_token": false,
		"access_tokens": false, "token": false, "": false,
	} {
		if got := isAccessTokenName(k); got != want {
			t.Errorf("isAccessTokenName(%q) = %v, want %v", k, got, want)
		}
	}
	for q, want := range map[string]bool{
		"a=1&b=2": false, "x=TOKEN": true, "Access_ToKen=1": true, "a%5Fb=1": true, "k\xe2\x84\xaa=1": true, "": false, "tok=1": false,
	} {
		if got := mayNameToken(q); got != want {
			t.Errorf("mayNameToken(%q) = %v, want %v", q, got, want)
		}
	}
}

func TestQueryTokenSpellings(t *testing.T) {
	for _, q := range []string{"Access_Token=T", "access.token=T", "access+token=T", "access%5Btoken=T",
		"access%2Etoken=T", "ACCESS%5FTOKEN=T", "access_token[]=T", "%20access_token=T"} {
		tok, ok, err := queryToken(q, "", false)
		if err != nil || !ok || tok != "T" {
			t.Errorf("queryToken(%q) = %q %v %v, want T to be verified", q, tok, ok, err)
		}
		if _, _, err := queryToken(q, "H", true); err == nil {
			t.Errorf("queryToken(%q) beside a header token: accepted, want ambiguous", q)
		}
		if _, _, err := queryToken(q+"&access_token=U", "", false); err == nil {
			t.Errorf("queryToken(%q&access_token=U): accepted, want ambiguous", q)
		}
	}
	// A pair with ';' is not parsed (url.ParseQuery refuses it), and the reverse proxy drops
	// it from the query it forwards: it is neither verified nor seen upstream.
	if tok, ok, err := queryToken("x=1;access_token=T", "", false); err != nil || ok {
		t.Errorf("queryToken with a ;-pair = %q %v %v, want no token", tok, ok, err)
	}
}

func TestNormalCredential(t *testing.T) {
	for v, want := range map[string]string{
		"Bearer K": "Bearer K", "bearer K": "Bearer K", "BEARER K": "Bearer K", "Bearer  K": "Bearer K",
		"Bearer\tK": "Bearer K", " Bearer K ": "Bearer K", "K": "K", "basic a2V5": "Basic a2V5", "": "",
	} {
		if got := normalCredential(v); got != want {
			t.Errorf("normalCredential(%q) = %q, want %q", v, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = normalCredential("Bearer K") }); n != 0 {
		t.Errorf("normalCredential of a normal value: %v allocations, want 0", n)
	}
}

func TestGatewayHeaderKeysRefused(t *testing.T) {
	for _, h := range []string{"X-Forwarded-For", "x-forwarded-host", "X_Forwarded_For", "Forwarded", "X-Real-IP", "Connection", "HTTP2-Settings", "Proxy-Authorization", "Upgrade", "TE"} {
		if gatewayHeader(h) == "" {
			t.Errorf("gatewayHeader(%q): accepted, want refused", h)
		}
	}
	for _, h := range []string{"X-Api-Key", "X-Tenant", "Authorization", "X-Forwarded-Client-Cert-Id"} {
		if why := gatewayHeader(h); why != "" {
			t.Errorf("gatewayHeader(%q) = %q, want accepted", h, why)
		}
	}
}

// FuzzNormalCredential: normalising is idempotent, and the scheme's case and the whitespace
// around and between scheme and credential never make another key.
func FuzzNormalCredential(f *testing.F) {
	for _, s := range []string{"Bearer K", "bearer\t K ", "Basic a2V5", "K", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n := normalCredential(v)
		if normalCredential(n) != n {
			t.Fatalf("normalCredential(%q) = %q, whose normal form is %q", v, n, normalCredential(n))
		}
		scheme, cred, ok := strings.Cut(n, " ")
		if !ok || scheme == "" {
			return
		}
		upper := []byte(scheme) // ASCII only: the scheme is a token
		for i, c := range upper {
			if 'a' <= c && c <= 'z' {
				upper[i] = c - 'a' + 'A'
			}
		}
		if got := normalCredential(" " + string(upper) + " \t " + cred + "\t"); got != n {
			t.Fatalf("%q respelled normalises to %q, want %q", n, got, n)
		}
	})
}

// FuzzScrubAddrs: no client address survives in a connection error line.
func FuzzScrubAddrs(f *testing.F) {
	f.Add([]byte{127, 0, 0, 23}, uint16(5555), "i/o timeout")
	ps := NewPseudonyms(nil)
	f.Fuzz(func(t *testing.T, ip []byte, port uint16, tail string) {
		var a netip.Addr
		switch len(ip) {
		case 4:
			a = netip.AddrFrom4([4]byte(ip))
		case 16:
			a = netip.AddrFrom16([16]byte(ip)).Unmap()
		default:
			return
		}
		ap := netip.AddrPortFrom(a, port).String()
		out := ps.ScrubAddrs("read tcp 10.1.2.3:8080->" + ap + ": " + tail)
		if strings.Contains(out, ap) || strings.Contains(out, "->"+a.String()) {
			t.Fatalf("ScrubAddrs kept %s: %q", ap, out)
		}
	})
}
