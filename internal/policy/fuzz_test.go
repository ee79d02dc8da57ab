package policy

import (
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"50/s", "0.5/m", "3600/h", "10/x", "", "/", "1/", "/s", "1e9/s", "Inf/s", "-1/s", "99999999999999999999999/h", "0.0000001/h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRate(s)
		if err != nil {
			if r != 0 {
				t.Errorf("ParseRate(%q): got %v with error %v, want 0", s, r, err)
			}
			return
		}
		if !(r > 0) || r > maxRate || math.IsInf(r, 0) {
			t.Errorf("ParseRate(%q) = %v: want a finite rate in (0, %d]", s, r, maxRate)
		}
		num, unit, _ := strings.Cut(s, "/")
		if !isDecimal(num) || (unit != "s" && unit != "m" && unit != "h") {
			t.Errorf("ParseRate(%q) accepted a rate that is not N/s, N/m or N/h", s)
		}
	})
}

// refClientIP is the straightforward right-to-left walk of X-Forwarded-For that ClientIP's
// one-pass walk must agree with.
func refClientIP(peer netip.Addr, lines []string, trusted func(netip.Addr) bool) netip.Addr {
	peer = peer.Unmap()
	if !peer.IsValid() || !trusted(peer) || len(lines) == 0 {
		return peer
	}
	var elems []string
	for _, l := range lines {
		for _, e := range strings.Split(l, ",") {
			if e = strings.Trim(e, " \t"); e != "" {
				elems = append(elems, e)
			}
		}
	}
	last := peer
	for i := len(elems) - 1; i >= 0; i-- {
		a, ok := parseForwardedAddr(elems[i])
		if !ok {
			return last
		}
		if !trusted(a) {
			return a
		}
		last = a
	}
	return last
}

func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1", "203.0.113.7, 10.0.0.2", "")
	f.Add("10.0.0.1", "garbage, 10.0.0.2", "")
	f.Add("10.0.0.1", "[2001:db8::1]:80,,", "")
	f.Add("fd00::1", "", `for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.2`)
	f.Add("10.0.0.1", "", `for=_hidden, for="203.0.113.7:_p";by=x`)
	f.Add("10.0.0.1", "", `for="unterminated`)
	f.Add("203.0.113.9", "198.51.100.1", "for=198.51.100.1")
	f.Add("::ffff:10.0.0.1", "::ffff:10.0.0.3,fe80::1%eth0", "")
	f.Fuzz(func(t *testing.T, peerText, xff, fwd string) {
		peer, _ := netip.ParseAddr(peerText)
		h := http.Header{}
		if xff != "" {
			h["X-Forwarded-For"] = strings.Split(xff, "\n")
		}
		if fwd != "" {
			h["Forwarded"] = strings.Split(fwd, "\n")
		}
		got := ClientIP(peer, h, trustedTest)
		if !trustedTest(peer.Unmap()) {
			if want := peer.Unmap(); got != want {
				t.Fatalf("untrusted peer %s: got %s, want the peer", peer, got)
			}
			return
		}
		if !got.IsValid() || got.Is4In6() || got.Zone() != "" {
			t.Fatalf("got %#v, want a valid unmapped address without zone", got)
		}
		if xff != "" {
			if want := refClientIP(peer, h["X-Forwarded-For"], trustedTest); got != want {
				t.Fatalf("XFF %q from %s: got %s, reference walk gives %s", xff, peer, got, want)
			}
		}
	})
}

func FuzzBearerToken(f *testing.F) {
	for _, s := range []string{"Bearer abc", "bearer  x.y.z ", "Basic abc", "Bearer", "Bearerx", "", " BEARER\tt"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		tok, ok := BearerToken(http.Header{"Authorization": {v}})
		if !ok {
			if tok != "" {
				t.Fatalf("got %q with ok false", tok)
			}
			return
		}
		trimmed := strings.Trim(v, " \t")
		if len(trimmed) < 6 || !strings.EqualFold(trimmed[:6], "bearer") {
			t.Fatalf("%q: ok without the Bearer scheme", v)
		}
		if tok != strings.Trim(tok, " \t") || !strings.Contains(v, tok) {
			t.Fatalf("%q: got token %q, want a trimmed substring", v, tok)
		}
		if tok != "" && !strings.HasSuffix(trimmed, tok) {
			t.Fatalf("%q: got token %q, want the rest of the value", v, tok)
		}
	})
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte(planConfig))
	f.Add([]byte("policies: [{name: a, overrides: [{key: 10.0.0.0/8}]}]\nstore: {timeout: x}\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("identity: {jwt: {hs256_secret_env: S}}\n"))
	if files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml")); err == nil {
		for _, file := range files {
			if data, err := os.ReadFile(file); err == nil {
				f.Add(data)
			}
		}
	}
	getenv := env("S", secret32)
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, LoadOptions{Getenv: noEnv})
		if err != nil {
			return
		}
		if j := cfg.Identity.JWT; j != nil && j.RS256PublicKeyFile != "" {
			// Keep the target hermetic: a generated path could name /dev/stdin.
			j.RS256PublicKeyFile = filepath.Join("testdata", "keys", "rsa.pub.pem")
		}
		verr := cfg.Validate(getenv)
		set, cerr := Compile(cfg, CompileOptions{Getenv: getenv, Now: func() time.Time { return t0 }})
		if (verr == nil) != (cerr == nil) {
			t.Fatalf("Validate %v but Compile %v", verr, cerr)
		}
		if set == nil {
			return
		}
		var p Plan
		r := newRequest("POST", "/api/x", "10.0.0.1:1", "X-Forwarded-For", "203.0.113.7", "X-Api-Key", "k", "X-User-Id", "u")
		if err := set.Plan(r, &p); err != nil {
			t.Fatalf("Plan: %v", err)
		}
		for i, c := range p.Charges {
			if c.Limit.Algorithm == 0 || p.Policies[i] == nil {
				t.Fatalf("charge %d: %+v for %v, want a valid limit and policy", i, c, p.Policies[i])
			}
		}
	})
}
