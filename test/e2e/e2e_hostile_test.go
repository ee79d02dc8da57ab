package e2e

// Hostile requests and attacks: oversized and numerous headers, invalid UTF-8 in the headers that
// name keys, floods of distinct keys, forged forwarding headers, JWT algorithm confusion, and
// secrets that must never show up in logs or metrics.

import (
	"bufio"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// rawRequest writes a request on a fresh connection and returns the status code of the answer
// (0 when the gateway closed the connection without one).
func rawRequest(t *testing.T, url, request string) int {
	t.Helper()
	c := dialRaw(t, url)
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(request)); err != nil {
		return 0 // the gateway may close before reading everything, which is an answer too
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestHostileHeaders sends header blocks above server.max_header_bytes (431), many small headers
// within it (served), and checks that the gateway keeps serving.
func TestHostileHeaders(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, "server:\n  max_header_bytes: 8192\n"+countingPolicy)
	c := newClient(t, 10*time.Second)

	// net/http allows 4096 bytes of slack above MaxHeaderBytes; 64 KiB is far above both.
	if a := fetch(c, g.proxy+"/", "X-Huge", strings.Repeat("h", 64<<10)); a.err != nil || a.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("64 KiB header: got %d %v, want 431", a.status, a.err)
	}
	if a := fetch(c, g.proxy+"/", "X-Big", strings.Repeat("h", 6000)); a.err != nil || a.status != 200 {
		t.Errorf("6000-byte header under the 8192 limit: got %d %v, want 200", a.status, a.err)
	}
	var many strings.Builder
	for i := 0; i < 600; i++ {
		fmt.Fprintf(&many, "X-H%d: v\r\n", i) // ~600 headers, ~6 KiB
	}
	if got := rawRequest(t, g.proxy, "GET /many HTTP/1.1\r\nHost: x\r\n"+many.String()+"\r\n"); got != 200 {
		t.Errorf("600 small headers within the limit: got %d, want 200", got)
	}
	many.Reset()
	for i := 0; i < 20000; i++ {
		fmt.Fprintf(&many, "X-H%d: v\r\n", i) // ~250 KiB of headers
	}
	if got := rawRequest(t, g.proxy, "GET /many HTTP/1.1\r\nHost: x\r\n"+many.String()+"\r\n"); got != http.StatusRequestHeaderFieldsTooLarge && got != 0 {
		t.Errorf("20000 headers: got %d, want 431 (or the connection closed)", got)
	}
	if a := fetch(c, g.proxy+"/"); a.err != nil || a.status != 200 {
		t.Errorf("ordinary request after the hostile ones: got %d %v", a.status, a.err)
	}
	// Oversized blocks are refused before the handler: only the three requests served count.
	if got := metric(t, g.admin, `ratelimit_decisions_total{result="allowed"}`); got != 3 {
		t.Errorf("allowed decisions got %v, want 3", got)
	}
}

// TestHostileInvalidUTF8Keys puts invalid UTF-8 into every header that names a key. Each value
// is hashed as bytes: it is limited like any key, two different invalid values are two keys (not
// both collapsed to U+FFFD), and the log stays valid JSON.
func TestHostileInvalidUTF8Keys(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, `identity:
  user_header: X-User-Id
log:
  level: debug
policies:
  - name: per-key
    key: api_key
    algorithm: fixed_window
    limit: 2
    window: 1h
  - name: per-user
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 2
  - name: per-tenant
    key: header:X-Tenant
    algorithm: sliding_window
    limit: 2
    window: 1h
`)
	for _, hdr := range []string{"X-Api-Key", "X-User-Id", "X-Tenant"} {
		for _, v := range []string{"\xff\xfe", "\xfe\xff", "ok\xc3\x28", "\xed\xa0\x80"} {
			var got []int
			for i := 0; i < 3; i++ {
				got = append(got, rawRequest(t, g.proxy, "GET / HTTP/1.1\r\nHost: x\r\n"+hdr+": "+v+"\r\n\r\n"))
			}
			if fmt.Sprint(got) != "[200 200 429]" {
				t.Errorf("%s %q: got %v, want [200 200 429] (its own bucket of 2)", hdr, v, got)
			}
		}
	}
	if got := metric(t, g.admin, `ratelimit_decisions_total{result="error"}`); got != 0 {
		t.Errorf("error decisions got %v, want 0", got)
	}
	for i, line := range strings.Split(strings.TrimSpace(g.logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line %d is not valid JSON: %q", i, line)
		}
	}
}

// TestHostileManyKeys floods the gateway with distinct API keys, far more than store.max_keys.
// The store stays within max_keys, evicts (and counts) live keys, and keeps deciding.
func TestHostileManyKeys(t *testing.T) {
	// 1024 is a multiple of every shard count the store picks on up to 128 CPUs, so the bound
	// is exact; see TestHostileManyKeysUnevenCap for a cap that is not.
	manyKeys(t, 1024, 3000)
}

// TestHostileManyKeysUnevenCap is the same flood with a cap that the store's shards cannot split
// evenly.
func TestHostileManyKeysUnevenCap(t *testing.T) {
	manyKeys(t, 1000, 3000)
}

func manyKeys(t *testing.T, maxKeys, n int) {
	t.Helper()
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, fmt.Sprintf(`store:
  max_keys: %d
policies:
  - name: per-key
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 5
`, maxKeys))
	c := newClient(t, 10*time.Second)
	start := time.Now()
	as := burst(c, g.proxy+"/", n, 16, func(i int) []string { return []string{"X-Api-Key", fmt.Sprintf("key-%d", i)} })
	took := time.Since(start)
	for i, a := range as {
		if a.err != nil || a.status != 200 {
			t.Fatalf("request %d with a new key: got %d %v, want 200", i, a.status, a.err)
		}
	}
	keys := metric(t, g.admin, "ratelimit_memory_keys")
	evicted := metric(t, g.admin, `ratelimit_memory_evictions_total{kind="least_used"}`)
	rss := metric(t, g.admin, "process_resident_memory_bytes")
	t.Logf("%d distinct keys in %v (%.0f keys/s, race-enabled binary): %v tracked (max_keys %d), %v evicted, RSS %.1f MiB",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), keys, maxKeys, evicted, rss/(1<<20))
	// No key goes idle at 1/h, so every key sent is either still tracked or was evicted.
	if evicted+keys != float64(n) {
		t.Errorf("evictions %v + tracked %v = %v, want the %d keys sent: evictions are not all counted", evicted, keys, evicted+keys, n)
	}
	// A known client is still limited exactly after the flood.
	var codes []int
	for i := 0; i < 6; i++ {
		codes = append(codes, fetch(c, g.proxy+"/", "X-Api-Key", "after-the-flood").status)
	}
	if fmt.Sprint(codes) != "[200 200 200 200 200 429]" {
		t.Errorf("a key after the flood: got %v, want five 200s then 429", codes)
	}
	if keys > float64(maxKeys) {
		t.Errorf("ratelimit_memory_keys got %v, want at most max_keys %d", keys, maxKeys)
	}
}

// TestSecuritySpoofedForwardedVariants rotates every spelling of a forwarded client address from
// an untrusted peer: none of them escapes the peer's IP limit. A trusted peer's header is
// believed, which proves the headers are parsed at all.
func TestSecuritySpoofedForwardedVariants(t *testing.T) {
	up := newUpstream(t, nil)
	// Header name and a value format; %[1]d is the rotation counter.
	variants := [][2]string{
		{"X-Forwarded-For", "198.51.100.%[1]d"},
		{"X-Forwarded-For", "198.51.100.%[1]d, 203.0.113.%[1]d"},
		{"Forwarded", "for=198.51.100.%[1]d"},
		{"Forwarded", `For="[2001:db8::%[1]x]:4711";proto=https`},
		{"Forwarded", "for=198.51.100.%[1]d, for=203.0.113.%[1]d;by=10.0.0.1"},
		{"X-Real-IP", "198.51.100.%[1]d"},
		{"True-Client-IP", "198.51.100.%[1]d"},
	}
	g := startGateway(t, up.URL, "trusted_proxies: [10.0.0.0/8]\n"+ipPolicy)
	c := newClient(t, 10*time.Second)
	var codes []int
	for i := 0; i < 2*len(variants); i++ {
		v := variants[i%len(variants)]
		codes = append(codes, fetch(c, g.proxy+"/", v[0], fmt.Sprintf(v[1], i+1)).status)
	}
	want := "[200 200 200" + strings.Repeat(" 429", 2*len(variants)-3) + "]"
	if got := fmt.Sprint(codes); got != want {
		t.Errorf("rotating forwarded headers from an untrusted peer: got %s, want %s", got, want)
	}

	// Positive control: the same rotation from a trusted peer is believed (one bucket each).
	trusted := startGateway(t, up.URL, "trusted_proxies: [127.0.0.0/8]\n"+ipPolicy)
	for i := 0; i < 5; i++ {
		for j := 0; j < 4; j++ {
			a := fetch(c, trusted.proxy+"/", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
			if want := map[bool]int{true: 200, false: 429}[j < 3]; a.status != want {
				t.Errorf("trusted peer, client 198.51.100.%d request %d: got %d, want %d", i, j, a.status, want)
			}
		}
	}
}

// TestSecurityJWTAlgorithmConfusion configures an RS256 public key and presents an HS256 token
// whose HMAC key is that public key's PEM (the classic confusion attack), and other forgeries:
// each is 401, reaches no upstream and charges no bucket. A real RS256 token is the control.
func TestSecurityJWTAlgorithmConfusion(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	keyFile := filepath.Join(t.TempDir(), "rsa.pub.pem")
	if err := os.WriteFile(keyFile, pubPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, fmt.Sprintf(`identity:
  jwt:
    rs256_public_key_file: %s
policies:
  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 100
    window: 1h
`, keyFile))
	sign := func(method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
		t.Helper()
		s, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp := time.Now().Add(time.Hour).Unix()
	c := newClient(t, 10*time.Second)
	good := sign(jwt.SigningMethodRS256, key, jwt.MapClaims{"sub": "alice", "exp": exp})
	if a := fetch(c, g.proxy+"/", "Authorization", "Bearer "+good); a.status != 200 {
		t.Fatalf("valid RS256 token: got %d %v, want 200", a.status, a.err)
	}
	forged := map[string]string{
		"HS256 keyed with the RSA public key PEM": sign(jwt.SigningMethodHS256, pubPEM, jwt.MapClaims{"sub": "mallory", "exp": exp}),
		"HS256 keyed with the PEM, no newline":    sign(jwt.SigningMethodHS256, []byte(strings.TrimSpace(string(pubPEM))), jwt.MapClaims{"sub": "mallory", "exp": exp}),
		"HS256 keyed with the DER":                sign(jwt.SigningMethodHS256, der, jwt.MapClaims{"sub": "mallory", "exp": exp}),
		"RS256 from another key":                  sign(jwt.SigningMethodRS256, other, jwt.MapClaims{"sub": "mallory", "exp": exp}),
		"PS256 from the right key":                sign(jwt.SigningMethodPS256, key, jwt.MapClaims{"sub": "mallory", "exp": exp}),
		"alg none":                                sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "mallory", "exp": exp}),
	}
	hits := up.hits.Load()
	for name, tok := range forged {
		a := fetch(c, g.proxy+"/", "Authorization", "Bearer "+tok)
		wantProblem(t, name, a, http.StatusUnauthorized)
		if got := a.header.Get("WWW-Authenticate"); !strings.Contains(got, "invalid_token") {
			t.Errorf("%s: WWW-Authenticate got %q, want Bearer error=\"invalid_token\"", name, got)
		}
	}
	if got := up.hits.Load() - hits; got != 0 {
		t.Errorf("the upstream saw %d forged requests, want 0", got)
	}
	if got := metric(t, g.admin, `ratelimit_decisions_total{result="unauthorized"}`); got != float64(len(forged)) {
		t.Errorf("unauthorized decisions got %v, want %d", got, len(forged))
	}
	if got := metric(t, g.admin, `ratelimit_requests_total{policy="per-user",result="allowed"}`); got != 1 {
		t.Errorf("per-user charges got %v, want 1 (only the valid token)", got)
	}
}

// TestSecuritySecretsNeverLogged sends a known API key, a bearer token and a user id through
// every logged path (admitted, rejected, upstream failing, invalid token) at debug level and
// searches the logs and /metrics for each, raw and as a plain SHA-256.
func TestSecuritySecretsNeverLogged(t *testing.T) {
	const (
		apiKey = "sk-live-APIKEY-7f3a9c"
		userID = "user-SECRETUSER-5521"
		sub    = "sub-SECRETSUB-9113"
		hsKey  = "0123456789abcdef0123456789abcdef-secret-test"
	)
	dead := "http://" + freePort(t) // admitted requests fail upstream and log that too
	hdr := startGateway(t, dead, `identity:
  user_header: X-User-Id
log:
  level: debug
policies:
  - name: per-key
    key: api_key
    algorithm: fixed_window
    limit: 1
    window: 1h
  - name: per-user
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 1
`)
	jwtGW := startGateway(t, dead, `identity:
  jwt:
    hs256_secret_env: E2E_SECRETS_JWT
log:
  level: debug
policies:
  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 1
    window: 1h
`, "E2E_SECRETS_JWT="+hsKey)
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(hsKey))
	if err != nil {
		t.Fatal(err)
	}
	expired, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(-time.Hour).Unix()}).SignedString([]byte(hsKey))
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, 10*time.Second)
	for i := 0; i < 3; i++ {
		fetch(c, hdr.proxy+"/?q=1", "X-Api-Key", apiKey, "X-User-Id", userID)
		fetch(c, jwtGW.proxy+"/", "Authorization", "Bearer "+token)
		fetch(c, jwtGW.proxy+"/", "Authorization", "Bearer "+expired)
	}
	eventually(t, "rejections counted", func() bool {
		return metric(t, hdr.admin, `ratelimit_decisions_total{result="limited"}`) >= 2 &&
			metric(t, jwtGW.admin, `ratelimit_decisions_total{result="limited"}`) >= 2
	})
	_, m1 := get(t, hdr.admin+"/metrics")
	_, m2 := get(t, jwtGW.admin+"/metrics")
	texts := map[string]string{
		"header gateway logs": hdr.logs.String(), "header gateway metrics": m1,
		"jwt gateway logs": jwtGW.logs.String(), "jwt gateway metrics": m2,
	}
	sig := token[strings.LastIndex(token, ".")+1:]
	secrets := map[string]string{
		"API key": apiKey, "user id": userID, "JWT subject": sub, "bearer token": token,
		"token signature": sig, "expired token": expired, "HS256 secret": hsKey,
	}
	for name, s := range secrets {
		sum := sha256.Sum256([]byte(s))
		for _, needle := range []string{s, hex.EncodeToString(sum[:])} {
			for where, text := range texts {
				if strings.Contains(text, needle) {
					t.Errorf("%s (%.12s...) found in %s", name, needle, where)
				}
			}
		}
	}
	// The rejections were logged, so the search above looked at real log lines.
	if !strings.Contains(hdr.logs.String(), `"rate limited"`) || !strings.Contains(hdr.logs.String(), `"upstream error"`) {
		t.Errorf("expected rate-limited and upstream-error log lines to search:\n%s", hdr.logs.String())
	}
}
