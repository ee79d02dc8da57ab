package policy

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// trustedTest trusts 10.0.0.0/8 and fd00::/8.
func trustedTest(a netip.Addr) bool {
	return netip.MustParsePrefix("10.0.0.0/8").Contains(a) || netip.MustParsePrefix("fd00::/8").Contains(a)
}

func TestClientIP(t *testing.T) {
	tests := []struct {
		name string
		peer string
		xff  []string // X-Forwarded-For lines
		fwd  []string // Forwarded lines
		want string
	}{
		// Untrusted peers: headers ignored entirely.
		{"untrusted peer, no headers", "203.0.113.9", nil, nil, "203.0.113.9"},
		{"untrusted peer spoofs XFF", "203.0.113.9", []string{"198.51.100.1"}, nil, "203.0.113.9"},
		{"untrusted peer spoofs Forwarded", "203.0.113.9", nil, []string{"for=198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer in a trusted XFF chain", "203.0.113.9", []string{"10.0.0.1"}, nil, "203.0.113.9"},
		// Trusted peer, X-Forwarded-For.
		{"trusted peer, no headers", "10.0.0.1", nil, nil, "10.0.0.1"},
		{"one hop", "10.0.0.1", []string{"203.0.113.7"}, nil, "203.0.113.7"},
		{"client spoofs the left of the list", "10.0.0.1", []string{"198.51.100.1, 203.0.113.7"}, nil, "203.0.113.7"},
		{"trusted chain", "10.0.0.1", []string{"198.51.100.1, 203.0.113.7, 10.0.0.3, 10.0.0.2"}, nil, "203.0.113.7"},
		{"all trusted: left-most", "10.0.0.1", []string{"10.0.0.4, 10.0.0.3"}, nil, "10.0.0.4"},
		{"several lines", "10.0.0.1", []string{"198.51.100.1", "203.0.113.7, 10.0.0.2"}, nil, "203.0.113.7"},
		{"empty elements skipped", "10.0.0.1", []string{" 203.0.113.7 ,, 10.0.0.2,"}, nil, "203.0.113.7"},
		{"port dropped", "10.0.0.1", []string{"203.0.113.7:5555"}, nil, "203.0.113.7"},
		{"IPv6", "10.0.0.1", []string{"2001:db8::7"}, nil, "2001:db8::7"},
		{"IPv6 bracketed with port", "10.0.0.1", []string{"[2001:db8::7]:443"}, nil, "2001:db8::7"},
		{"IPv6 zone dropped", "10.0.0.1", []string{"fe80::1%eth0"}, nil, "fe80::1"},
		{"IPv4-mapped unmapped", "10.0.0.1", []string{"::ffff:203.0.113.7"}, nil, "203.0.113.7"},
		{"trusted IPv6 peer", "fd00::1", []string{"203.0.113.7, fd00::2"}, nil, "203.0.113.7"},
		{"mapped trusted peer", "::ffff:10.0.0.1", []string{"203.0.113.7"}, nil, "203.0.113.7"},
		{"malformed right-most: peer", "10.0.0.1", []string{"203.0.113.7, garbage"}, nil, "10.0.0.1"},
		{"malformed in the middle: last good", "10.0.0.1", []string{"203.0.113.7, garbage, 10.0.0.2"}, nil, "10.0.0.2"},
		{"malformed left of the client: client", "10.0.0.1", []string{"garbage, 203.0.113.7, 10.0.0.2"}, nil, "203.0.113.7"},
		{"bad port is malformed", "10.0.0.1", []string{"203.0.113.7:http"}, nil, "10.0.0.1"},
		{"brackets around IPv4 are malformed", "10.0.0.1", []string{"[203.0.113.7]"}, nil, "10.0.0.1"},
		{"XFF wins over Forwarded", "10.0.0.1", []string{"203.0.113.7"}, []string{"for=198.51.100.1"}, "203.0.113.7"},
		// Trusted peer, Forwarded (RFC 7239).
		{"forwarded one hop", "10.0.0.1", nil, []string{"for=203.0.113.7;proto=https;by=10.0.0.1"}, "203.0.113.7"},
		{"forwarded case-insensitive name", "10.0.0.1", nil, []string{"For=203.0.113.7"}, "203.0.113.7"},
		{"forwarded quoted IPv6 with port", "10.0.0.1", nil, []string{`for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"forwarded quoted IPv4 with port", "10.0.0.1", nil, []string{`for="203.0.113.7:80"`}, "203.0.113.7"},
		{"forwarded chain", "10.0.0.1", nil, []string{"for=198.51.100.1, for=203.0.113.7", "for=10.0.0.2"}, "203.0.113.7"},
		{"forwarded all trusted", "10.0.0.1", nil, []string{"for=10.0.0.9;proto=http, for=10.0.0.2"}, "10.0.0.9"},
		{"forwarded obfuscated right-most: peer", "10.0.0.1", nil, []string{"for=198.51.100.1, for=_hidden"}, "10.0.0.1"},
		{"forwarded unknown right-most: peer", "10.0.0.1", nil, []string{"for=198.51.100.1, for=unknown"}, "10.0.0.1"},
		{"forwarded obfuscated in the middle: last good", "10.0.0.1", nil, []string{"for=198.51.100.1, for=_x, for=10.0.0.5"}, "10.0.0.5"},
		{"forwarded obfuscated port is fine", "10.0.0.1", nil, []string{`for="203.0.113.7:_p"`}, "203.0.113.7"},
		{"forwarded element without for", "10.0.0.1", nil, []string{"for=198.51.100.1, proto=https"}, "10.0.0.1"},
		{"forwarded quoted comma", "10.0.0.1", nil, []string{`for=198.51.100.1;ext="a,b", for=203.0.113.7`}, "203.0.113.7"},
		{"forwarded unterminated quote", "10.0.0.1", nil, []string{`for="203.0.113.7`}, "10.0.0.1"},
		{"forwarded escape is malformed", "10.0.0.1", nil, []string{`for="203.0.113.\7"`}, "10.0.0.1"},
		{"forwarded two for= is malformed", "10.0.0.1", nil, []string{"for=198.51.100.1;for=203.0.113.7"}, "10.0.0.1"},
		{"forwarded garbage", "10.0.0.1", nil, []string{"nonsense"}, "10.0.0.1"},
		{"forwarded empty elements", "10.0.0.1", nil, []string{" , for=203.0.113.7 ,, "}, "203.0.113.7"},
		{"invalid peer", "", []string{"203.0.113.7"}, nil, "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var peer netip.Addr
			if tt.peer != "" {
				peer = netip.MustParseAddr(tt.peer)
			}
			h := http.Header{}
			for _, v := range tt.xff {
				h.Add("X-Forwarded-For", v)
			}
			for _, v := range tt.fwd {
				h.Add("Forwarded", v)
			}
			if got := ClientIP(peer, h, trustedTest).String(); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestClientIPNilTrusted(t *testing.T) {
	h := http.Header{"X-Forwarded-For": {"203.0.113.7"}}
	peer := netip.MustParseAddr("10.0.0.1")
	if got := ClientIP(peer, h, nil); got != peer {
		t.Errorf("got %s, want the peer %s when nothing is trusted", got, peer)
	}
}

func TestBearerToken(t *testing.T) {
	tests := []struct {
		lines  []string
		want   string
		wantOK bool
	}{
		{nil, "", false},
		{[]string{"Bearer abc.def.ghi"}, "abc.def.ghi", true},
		{[]string{"bearer abc"}, "abc", true},
		{[]string{"BEARER \t abc  "}, "abc", true},
		{[]string{"  Bearer abc"}, "abc", true},
		{[]string{"Bearer"}, "", true},
		{[]string{"Bearer "}, "", true},
		{[]string{"Bearerabc"}, "", false},
		{[]string{"Basic dXNlcjpwYXNz"}, "", false},
		{[]string{""}, "", false},
		{[]string{"Bear"}, "", false},
		{[]string{"Bearer first", "Bearer second"}, "first", true},
	}
	for _, tt := range tests {
		h := http.Header{"Authorization": tt.lines}
		got, ok := BearerToken(h)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("BearerToken(%q): got %q, %v; want %q, %v", tt.lines, got, ok, tt.want, tt.wantOK)
		}
	}
}

var t0 = time.Unix(1_700_000_000, 0)

// testRSAKey is generated once per test binary: 2048-bit generation is slow under -race.
var testRSAKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

// writePublicKey writes k's public half as PEM into a temporary file.
func writePublicKey(t *testing.T, k *rsa.PrivateKey) (path string, pemBytes []byte) {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	path = filepath.Join(t.TempDir(), "pub.pem")
	if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, pemBytes
}

func sign(t *testing.T, m jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// userKey is the bucket key that a policy keyed by user derives for a user id, computed here
// from the documented recipe rather than from the package's own helper.
func userKey(policy, alg, user string) bucket.Key {
	sum := sha256.Sum256([]byte(policy + "\x00" + alg + "\x00user\x00" + user))
	var k bucket.Key
	copy(k[:], sum[:16])
	return k
}

func TestPlanJWT(t *testing.T) {
	rsaKey := testRSAKey()
	otherRSA, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // a throwaway wrong key
	if err != nil {
		t.Fatal(err)
	}
	pubPath, pubPEM := writePublicKey(t, rsaKey)
	getenv := env("JWT_SECRET", secret32)
	policies := "policies:\n  - {name: per-user, key: user, algorithm: token_bucket, rate: 1/s, burst: 5}\n"
	hsOnly := "upstream: http://h\nidentity: {jwt: {hs256_secret_env: JWT_SECRET, issuer: idp, audience: api, leeway: 30s}}\n" + policies
	rsOnly := "upstream: http://h\nidentity: {jwt: {rs256_public_key_file: " + pubPath + ", claim: uid}}\n" + policies
	both := "upstream: http://h\nidentity: {jwt: {hs256_secret_env: JWT_SECRET, rs256_public_key_file: " + pubPath + "}}\n" + policies

	good := func(extra jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "alice", "uid": "u-42", "iss": "idp", "aud": "api", "exp": t0.Add(time.Hour).Unix()}
		for k, v := range extra {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	hs := jwt.SigningMethodHS256
	rs := jwt.SigningMethodRS256
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good(nil))

	tests := []struct {
		name     string
		cfg      string
		auth     string // Authorization header; "" = none
		wantUser string // "" = no user charge
		wantErr  bool   // ErrUnauthorized
	}{
		{"valid HS256", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(nil)), "alice", false},
		{"valid RS256, custom claim", rsOnly, "Bearer " + sign(t, rs, rsaKey, good(nil)), "u-42", false},
		{"both configured: HS256", both, "Bearer " + sign(t, hs, []byte(secret32), good(nil)), "alice", false},
		{"both configured: RS256", both, "Bearer " + sign(t, rs, rsaKey, good(nil)), "alice", false},
		{"numeric claim", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"sub": 12345678901234567})), "12345678901234567", false},
		{"no Authorization: no user", hsOnly, "", "", false},
		{"Basic scheme: no user", hsOnly, "Basic dXNlcjpwYXNz", "", false},
		{"wrong HMAC secret", hsOnly, "Bearer " + sign(t, hs, []byte(strings.Repeat("x", 32)), good(nil)), "", true},
		{"wrong RSA key", rsOnly, "Bearer " + sign(t, rs, otherRSA, good(nil)), "", true},
		{"alg none", hsOnly, "Bearer " + none, "", true},
		{"alg none against RSA", rsOnly, "Bearer " + none, "", true},
		{"HS256 signed with the RSA public key (algorithm confusion)", rsOnly, "Bearer " + sign(t, hs, pubPEM, good(nil)), "", true},
		{"RS256 token against an HS256-only config", hsOnly, "Bearer " + sign(t, rs, rsaKey, good(nil)), "", true},
		{"expired", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"exp": t0.Add(-time.Minute).Unix()})), "", true},
		{"no exp", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"exp": nil})), "", true},
		{"no exp, RS256", rsOnly, "Bearer " + sign(t, rs, rsaKey, good(jwt.MapClaims{"exp": nil})), "", true},
		{"expired within leeway", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"exp": t0.Add(-10 * time.Second).Unix()})), "alice", false},
		{"nbf in the future", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"nbf": t0.Add(time.Minute).Unix()})), "", true},
		{"nbf passed", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"nbf": t0.Add(-time.Minute).Unix()})), "alice", false},
		{"wrong issuer", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"iss": "evil"})), "", true},
		{"wrong audience", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"aud": "other"})), "", true},
		{"missing claim", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"sub": nil})), "", true},
		{"empty claim", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"sub": ""})), "", true},
		{"claim not a string", hsOnly, "Bearer " + sign(t, hs, []byte(secret32), good(jwt.MapClaims{"sub": []string{"a"}})), "", true},
		{"malformed", hsOnly, "Bearer not.a.jwt", "", true},
		{"empty bearer", hsOnly, "Bearer ", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := Compile(mustParse(t, tt.cfg, noEnv), CompileOptions{Getenv: getenv, Now: func() time.Time { return t0 }})
			if err != nil {
				t.Fatal(err)
			}
			r := newRequest("GET", "/", "192.0.2.1:1")
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			p := Plan{Charges: []bucket.Charge{{}}, Policies: []*Policy{{}}} // stale content must go
			err = set.Plan(r, &p)
			if gotErr := errors.Is(err, ErrUnauthorized); gotErr != tt.wantErr {
				t.Fatalf("got error %v, want ErrUnauthorized: %v", err, tt.wantErr)
			}
			if tt.wantErr {
				// The only policy is keyed by user: a 401 charges no user policy.
				if len(p.Charges) != 0 || len(p.Policies) != 0 {
					t.Errorf("got %d charges, %d policies on a 401, want none", len(p.Charges), len(p.Policies))
				}
				return
			}
			if tt.wantUser == "" {
				if len(p.Charges) != 0 {
					t.Errorf("got %d charges, want none without a user", len(p.Charges))
				}
				return
			}
			if len(p.Charges) != 1 {
				t.Fatalf("got %d charges, want 1", len(p.Charges))
			}
			if want := userKey("per-user", "token_bucket", tt.wantUser); p.Charges[0].Key != want {
				t.Errorf("got key %s, want the key of user %q (%s)", p.Charges[0].Key, tt.wantUser, want)
			}
		})
	}
}

func TestPlanJWTErrorHidesToken(t *testing.T) {
	set, err := Compile(mustParse(t, "upstream: http://h\nidentity: {jwt: {hs256_secret_env: S}}\npolicies:\n  - {name: u, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", noEnv),
		CompileOptions{Getenv: env("S", secret32), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jwt.SigningMethodHS256, []byte(secret32), jwt.MapClaims{"sub": "secret-user-id", "exp": t0.Add(-time.Hour).Unix()})
	r := newRequest("GET", "/", "192.0.2.1:1", "Authorization", "Bearer "+tok)
	err = set.Plan(r, &Plan{})
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("got %v, want ErrUnauthorized", err)
	}
	if msg := err.Error(); strings.Contains(msg, tok) || strings.Contains(msg, "secret-user-id") {
		t.Errorf("error %q repeats the token or the user id", msg)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A token without exp would be valid forever: it is refused however late it is presented.
func TestPlanJWTRequiresExp(t *testing.T) {
	for _, at := range []time.Time{t0, t0.Add(50 * 365 * 24 * time.Hour)} {
		set, err := Compile(mustParse(t, "upstream: http://h\nidentity: {jwt: {hs256_secret_env: S, leeway: 1h}}\npolicies:\n"+
			"  - {name: u, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", noEnv),
			CompileOptions{Getenv: env("S", secret32), Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		tok := sign(t, jwt.SigningMethodHS256, []byte(secret32), jwt.MapClaims{"sub": "alice", "iat": t0.Unix()})
		err = set.Plan(newRequest("GET", "/", "192.0.2.1:1", "Authorization", "Bearer "+tok), &Plan{})
		if !errors.Is(err, ErrUnauthorized) || !errors.Is(err, jwt.ErrTokenRequiredClaimMissing) {
			t.Errorf("at %s: got %v, want ErrUnauthorized for a missing exp", at, err)
		}
	}
}

// Several Authorization lines of which one is Bearer are refused (ambiguous credentials): a
// Basic line first must not hide the Bearer one, and two Bearer lines name two users.
func TestPlanJWTSeveralAuthorizationLines(t *testing.T) {
	set, err := Compile(mustParse(t, "upstream: http://h\nidentity: {jwt: {hs256_secret_env: S}}\npolicies:\n"+
		"  - {name: u, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", noEnv),
		CompileOptions{Getenv: env("S", secret32), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	good := "Bearer " + sign(t, jwt.SigningMethodHS256, []byte(secret32), jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix()})
	tests := []struct {
		name     string
		lines    []string
		wantErr  bool
		wantUser bool
	}{
		{"one Bearer line", []string{good}, false, true},
		{"Basic then Bearer", []string{"Basic dXNlcjpwYXNz", good}, true, false},
		{"Bearer then Basic", []string{good, "Basic dXNlcjpwYXNz"}, true, false},
		{"two Bearer lines", []string{good, good}, true, false},
		{"two Basic lines: no user", []string{"Basic a", "Basic b"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("GET", "/", "192.0.2.1:1")
			r.Header["Authorization"] = tt.lines
			var p Plan
			err := set.Plan(r, &p)
			if gotErr := errors.Is(err, ErrUnauthorized); gotErr != tt.wantErr {
				t.Fatalf("got error %v, want ErrUnauthorized: %v", err, tt.wantErr)
			}
			if got := len(p.Charges) == 1; got != tt.wantUser {
				t.Errorf("got %d user charges, want user charged: %v", len(p.Charges), tt.wantUser)
			}
		})
	}
}

// TestPlanJWTQueryToken: RFC 6750's access_token query parameter is a bearer token too: an
// upstream that accepts it must not act on a token the gateway did not verify. Alone it is
// verified like the header's; with the header, or twice, the request is refused.
func TestPlanJWTQueryToken(t *testing.T) {
	set, err := Compile(mustParse(t, "upstream: http://h\nidentity: {jwt: {hs256_secret_env: S}}\npolicies:\n"+
		"  - {name: u, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", noEnv),
		CompileOptions{Getenv: env("S", secret32), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	good := sign(t, jwt.SigningMethodHS256, []byte(secret32), jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix()})
	tests := []struct {
		name, query, auth string
		wantErr, wantUser bool
	}{
		{"query token verified", "access_token=" + good, "", false, true},
		{"query token percent-encoded key", "access%5Ftoken=" + good, "", false, true},
		{"bad query token", "access_token=not.a.jwt", "", true, false},
		{"query and header", "access_token=" + good, "Bearer " + good, true, false},
		{"two query tokens", "access_token=" + good + "&access_token=" + good, "", true, false},
		{"other parameters", "page=2&token_type=x", "Bearer " + good, false, true},
		{"no token", "page=2", "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest("GET", "/x?"+tt.query, "192.0.2.1:1")
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			var p Plan
			err := set.Plan(r, &p)
			if gotErr := errors.Is(err, ErrUnauthorized); gotErr != tt.wantErr {
				t.Fatalf("got error %v, want ErrUnauthorized: %v", err, tt.wantErr)
			}
			if got := len(p.Charges) == 1; got != tt.wantUser {
				t.Errorf("got %d user charges, want user charged: %v", len(p.Charges), tt.wantUser)
			}
		})
	}
}

// The contract of Plan on ErrUnauthorized: the charges of the matching ip policies stay in the
// plan (so bad tokens are held by the ip limits), and nothing else (api_key, user, header and
// global pools are not drained by requests that are never forwarded).
func TestPlanUnauthorizedChargesIPPoliciesOnly(t *testing.T) {
	set, err := Compile(mustParse(t, `upstream: http://h
identity: {jwt: {hs256_secret_env: S}}
policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 1/s
    burst: 1
    overrides: [{key: 198.51.100.0/24, unlimited: true}]
  - {name: per-ip-api, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, match: {path_prefix: /api/}}
  - {name: per-ip-shadow, key: ip, algorithm: fixed_window, limit: 5, window: 1m, mode: shadow}
  - {name: per-key, key: api_key, algorithm: token_bucket, rate: 1/s, burst: 1}
  - {name: per-user, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}
  - {name: per-tenant, key: 'header:X-Tenant', algorithm: token_bucket, rate: 1/s, burst: 1}
  - {name: account, key: global, algorithm: token_bucket, rate: 1/s, burst: 1}
`, noEnv), CompileOptions{Getenv: env("S", secret32), Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	ipAlgs := map[string]string{"per-ip": "token_bucket", "per-ip-api": "token_bucket", "per-ip-shadow": "fixed_window"}
	good := "Bearer " + sign(t, jwt.SigningMethodHS256, []byte(secret32), jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix()})
	bad := good[:len(good)-4] + "AAAA"
	tests := []struct {
		name    string
		r       *http.Request
		wantErr bool
		want    []string
	}{
		{"valid token: every policy", newRequest("GET", "/api/x", "192.0.2.1:1", "Authorization", good, "X-Api-Key", "k", "X-Tenant", "t"), false,
			[]string{"per-ip", "per-ip-api", "per-ip-shadow", "per-key", "per-user", "per-tenant", "account"}},
		{"bad signature: matching ip policies", newRequest("GET", "/api/x", "192.0.2.1:1", "Authorization", bad, "X-Api-Key", "k", "X-Tenant", "t"), true,
			[]string{"per-ip", "per-ip-api", "per-ip-shadow"}},
		{"bad signature off /api/", newRequest("GET", "/", "192.0.2.1:1", "Authorization", bad, "X-Api-Key", "k"), true,
			[]string{"per-ip", "per-ip-shadow"}},
		{"malformed token", newRequest("GET", "/", "192.0.2.1:1", "Authorization", "Bearer garbage"), true,
			[]string{"per-ip", "per-ip-shadow"}},
		{"ambiguous lines", newRequest("GET", "/", "192.0.2.1:1", "Authorization", "Basic a", "Authorization", good), true,
			[]string{"per-ip", "per-ip-shadow"}},
		{"unlimited override still applies", newRequest("GET", "/", "198.51.100.7:1", "Authorization", bad), true,
			[]string{"per-ip-shadow"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Plan{Charges: []bucket.Charge{{}}, Policies: []*Policy{{Name: "stale"}}}
			err := set.Plan(tt.r, &p)
			if gotErr := errors.Is(err, ErrUnauthorized); gotErr != tt.wantErr {
				t.Fatalf("got error %v, want ErrUnauthorized: %v", err, tt.wantErr)
			}
			if len(p.Charges) != len(p.Policies) {
				t.Fatalf("got %d charges for %d policies", len(p.Charges), len(p.Policies))
			}
			var got []string
			for _, pol := range p.Policies {
				got = append(got, pol.Name)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got policies %v, want %v", got, tt.want)
			}
			if !tt.wantErr {
				return
			}
			// The ip charges are the client's usual ones: a 401 shares the ip buckets.
			client, _, _ := strings.Cut(tt.r.RemoteAddr, ":")
			for i, pol := range p.Policies {
				if want := keyOf(pol.Name, ipAlgs[pol.Name], "ip", client); p.Charges[i].Key != want {
					t.Errorf("%s: got key %s, want %s's ip key %s", pol.Name, p.Charges[i].Key, client, want)
				}
			}
		})
	}
}

func BenchmarkPlanJWT(b *testing.B) {
	cfg, err := Parse([]byte("upstream: http://h\nidentity: {jwt: {hs256_secret_env: S}}\npolicies:\n  - {name: u, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n"), LoadOptions{Getenv: noEnv})
	if err != nil {
		b.Fatal(err)
	}
	set, err := Compile(cfg, CompileOptions{Getenv: env("S", secret32), Now: func() time.Time { return t0 }})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": t0.Add(time.Hour).Unix()}).SignedString([]byte(secret32))
	if err != nil {
		b.Fatal(err)
	}
	r := newRequest("GET", "/", "192.0.2.1:1", "Authorization", "Bearer "+tok)
	b.ReportAllocs()
	var p Plan
	for b.Loop() {
		if err := set.Plan(r, &p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanJWTBadSignature measures a request with a bad RS256 signature: it costs an RSA
// verification, and (the ErrUnauthorized contract) still takes the ip policy's charge, which is
// what holds a flood of such tokens. Compare BenchmarkPlanJWT.
func BenchmarkPlanJWTBadSignature(b *testing.B) {
	k := testRSAKey()
	path := b.TempDir() + "/pub.pem"
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, err := Parse([]byte("upstream: http://h\nidentity: {jwt: {rs256_public_key_file: "+path+"}}\npolicies:\n"+
		"  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"), LoadOptions{Getenv: noEnv})
	if err != nil {
		b.Fatal(err)
	}
	set, err := Compile(cfg, CompileOptions{Getenv: noEnv, Now: func() time.Time { return t0 }})
	if err != nil {
		b.Fatal(err)
	}
	good, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{"sub": "a", "exp": t0.Add(time.Hour).Unix()}).SignedString(k)
	if err != nil {
		b.Fatal(err)
	}
	bad := good[:len(good)-4] + "AAAA" // same shape, wrong signature
	r := newRequest("GET", "/", "192.0.2.1:1", "Authorization", "Bearer "+bad)
	var p Plan
	b.ReportAllocs()
	for b.Loop() {
		if err := set.Plan(r, &p); !errors.Is(err, ErrUnauthorized) {
			b.Fatalf("got %v, want ErrUnauthorized", err)
		}
		if len(p.Charges) != 1 {
			b.Fatalf("got %d charges on a 401, want the ip policy's 1", len(p.Charges))
		}
	}
}
