package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// newRequest builds a request to target from remote with header pairs kv.
func newRequest(method, target, remote string, kv ...string) *http.Request {
	r, err := http.NewRequest(method, "http://proxy"+target, nil)
	if err != nil {
		panic(err)
	}
	r.RemoteAddr = remote
	for i := 0; i+1 < len(kv); i += 2 {
		r.Header.Add(kv[i], kv[i+1])
	}
	return r
}

func mustCompile(t testing.TB, yaml string) *Set {
	t.Helper()
	cfg, err := Parse([]byte(yaml), LoadOptions{Getenv: noEnv})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	set, err := Compile(cfg, CompileOptions{Getenv: noEnv})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return set
}

func sha256Key(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// keyOf is the documented bucket key recipe, computed independently of the package.
func keyOf(policy, alg, kind, value string) bucket.Key {
	sum := sha256.Sum256([]byte(policy + "\x00" + alg + "\x00" + kind + "\x00" + value))
	var k bucket.Key
	copy(k[:], sum[:16])
	return k
}

var planConfig = `upstream: http://h
trusted_proxies: [10.0.0.0/8]
identity: {user_header: X-User-Id}
policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 10/s
    burst: 20
    overrides:
      - {key: 198.51.100.0/24, burst: 50}
      - {key: 198.51.100.128/25, unlimited: true}
      - {key: 198.51.100.200, burst: 7}
  - name: per-key
    key: api_key
    algorithm: fixed_window
    limit: 100
    window: 1m
    overrides:
      - {key: "` + sha256Key("premium") + `", limit: 1000}
      - {key: "` + sha256Key("internal") + `", unlimited: true}
  - name: per-user-writes
    key: user
    algorithm: sliding_window
    limit: 5
    window: 1m
    match: {methods: [POST, PUT], path_prefix: /api/}
  - name: per-tenant
    key: header:X-Tenant
    algorithm: leaky_bucket
    rate: 5/m
    burst: 3
    mode: shadow
  - name: account
    key: global
    algorithm: token_bucket
    rate: 1000/s
    burst: 2000
`

// charged maps policy name to charge for one planned request.
func plan(t *testing.T, set *Set, r *http.Request) map[string]bucket.Charge {
	t.Helper()
	var p Plan
	if err := set.Plan(r, &p); err != nil {
		t.Fatalf("Plan: %v", err)
	}
	if len(p.Charges) != len(p.Policies) {
		t.Fatalf("got %d charges for %d policies", len(p.Charges), len(p.Policies))
	}
	out := map[string]bucket.Charge{}
	for i, pol := range p.Policies {
		out[pol.Name] = p.Charges[i]
	}
	return out
}

func names(m map[string]bucket.Charge) []string {
	var out []string
	for _, n := range []string{"per-ip", "per-key", "per-user-writes", "per-tenant", "account"} {
		if _, ok := m[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

func TestPlanMatchingAndAbsentKeys(t *testing.T) {
	set := mustCompile(t, planConfig)
	tests := []struct {
		name string
		r    *http.Request
		want []string
	}{
		{"bare GET: ip and global", newRequest("GET", "/", "192.0.2.1:1"), []string{"per-ip", "account"}},
		{"api key", newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "k1"), []string{"per-ip", "per-key", "account"}},
		{"empty api key is absent", newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", ""), []string{"per-ip", "account"}},
		{"user on GET: method does not match", newRequest("GET", "/api/x", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "account"}},
		{"user on POST /api/", newRequest("POST", "/api/orders", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"user on PUT /api/", newRequest("PUT", "/api/orders/1", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"POST outside the prefix", newRequest("POST", "/public/x", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "account"}},
		{"POST /api without slash: /api/ matches /api", newRequest("POST", "/api", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"POST /apix is another path", newRequest("POST", "/apix", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "account"}},
		{"double slash merged", newRequest("POST", "/api//x", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"path case folded", newRequest("POST", "/API/X", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"method case folded", newRequest("post", "/api/x", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"path parameters ignored", newRequest("POST", "/api;jsessionid=1/x", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"backslash is a slash", newRequest("POST", `/api\x`, "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"method override judged", newRequest("GET", "/api/x", "10.0.0.1:1", "X-User-Id", "alice", "X-HTTP-Method-Override", "put"), []string{"per-ip", "per-user-writes", "account"}},
		{"escaped path decoded", newRequest("POST", "/%61pi/x", "10.0.0.1:1", "X-User-Id", "alice"), []string{"per-ip", "per-user-writes", "account"}},
		{"POST /api/ without user", newRequest("POST", "/api/x", "10.0.0.1:1"), []string{"per-ip", "account"}},
		{"user header from an untrusted peer is ignored", newRequest("POST", "/api/orders", "192.0.2.1:1", "X-User-Id", "alice"), []string{"per-ip", "account"}},
		{"tenant header", newRequest("GET", "/", "192.0.2.1:1", "X-Tenant", "acme"), []string{"per-ip", "per-tenant", "account"}},
		{"internal key is unlimited", newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "internal"), []string{"per-ip", "account"}},
		{"unlimited CIDR", newRequest("GET", "/", "198.51.100.130:1"), []string{"account"}},
		{"unix socket peer still has an ip key", newRequest("GET", "/", "@"), []string{"per-ip", "account"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := names(plan(t, set, tt.r)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPlanLimitsAndOverrides(t *testing.T) {
	set := mustCompile(t, planConfig)
	ipDefault := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 20}
	tests := []struct {
		name   string
		r      *http.Request
		policy string
		want   bucket.Limit
	}{
		{"ip default", newRequest("GET", "/", "192.0.2.1:1"), "per-ip", ipDefault},
		{"ip in /24 override, rate inherited", newRequest("GET", "/", "198.51.100.5:1"), "per-ip", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 50}},
		{"most specific prefix wins over the /25", newRequest("GET", "/", "198.51.100.200:1"), "per-ip", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 7}},
		{"override on the forwarded client", newRequest("GET", "/", "10.0.0.1:1", "X-Forwarded-For", "198.51.100.5"), "per-ip", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 50}},
		{"key default", newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "basic"), "per-key", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: 60e9}},
		{"premium key", newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "premium"), "per-key", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1000, Window: 60e9}},
		{"leaky bucket rate per minute", newRequest("GET", "/", "192.0.2.1:1", "X-Tenant", "acme"), "per-tenant", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 5.0 / 60, Burst: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := plan(t, set, tt.r)[tt.policy]
			if !ok {
				t.Fatalf("%s not charged", tt.policy)
			}
			if c.Limit != tt.want {
				t.Errorf("got %+v, want %+v", c.Limit, tt.want)
			}
		})
	}
}

func TestPlanKeys(t *testing.T) {
	set := mustCompile(t, planConfig)
	// Through a trusted proxy, which is also what makes X-User-Id believed.
	m := plan(t, set, newRequest("POST", "/api/x", "10.0.0.7:1", "X-Forwarded-For", "192.0.2.1", "X-Api-Key", "k1", "X-User-Id", "alice", "X-Tenant", "acme"))
	want := map[string]bucket.Key{
		"per-ip":          keyOf("per-ip", "token_bucket", "ip", "192.0.2.1"),
		"per-key":         keyOf("per-key", "fixed_window", "api_key", "k1"),
		"per-user-writes": keyOf("per-user-writes", "sliding_window", "user", "alice"),
		"per-tenant":      keyOf("per-tenant", "leaky_bucket", "header:x-tenant", "acme"),
		"account":         keyOf("account", "token_bucket", "global", ""),
	}
	for name, k := range want {
		if got := m[name].Key; got != k {
			t.Errorf("%s: got key %s, want %s", name, got, k)
		}
	}
	// Shadow is the policy's mode.
	for name, c := range m {
		if wantShadow := name == "per-tenant"; c.Shadow != wantShadow {
			t.Errorf("%s: got Shadow %v, want %v", name, c.Shadow, wantShadow)
		}
	}
	// The same client directly lands in the same ip bucket.
	direct := plan(t, set, newRequest("GET", "/", "192.0.2.1:1"))
	if direct["per-ip"].Key != m["per-ip"].Key {
		t.Errorf("direct: got key %s, want the proxied client's %s", direct["per-ip"].Key, m["per-ip"].Key)
	}
	// A spoofed header from an untrusted peer does not move the bucket.
	spoof := plan(t, set, newRequest("GET", "/", "203.0.113.9:1", "X-Forwarded-For", "192.0.2.1"))
	if spoof["per-ip"].Key == m["per-ip"].Key {
		t.Errorf("spoofed XFF from an untrusted peer reached the client's bucket")
	}
}

func TestPlanTwoPoliciesNeverShareABucket(t *testing.T) {
	set := mustCompile(t, `upstream: http://h
policies:
  - {name: a, key: api_key, algorithm: token_bucket, rate: 1/s, burst: 1}
  - {name: b, key: api_key, algorithm: token_bucket, rate: 1/s, burst: 1}
  - {name: c, key: header:X-Api-Key, algorithm: token_bucket, rate: 1/s, burst: 1}
`)
	m := plan(t, set, newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "same"))
	if len(m) != 3 {
		t.Fatalf("got %d charges, want 3", len(m))
	}
	if m["a"].Key == m["b"].Key || m["a"].Key == m["c"].Key || m["b"].Key == m["c"].Key {
		t.Errorf("got keys %s %s %s, want three different keys", m["a"].Key, m["b"].Key, m["c"].Key)
	}
}

func TestPlanReusesAndResets(t *testing.T) {
	set := mustCompile(t, planConfig)
	var p Plan
	if err := set.Plan(newRequest("POST", "/api/x", "10.0.0.1:1", "X-Api-Key", "k", "X-User-Id", "u", "X-Tenant", "t"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Charges) != 5 {
		t.Fatalf("got %d charges, want 5", len(p.Charges))
	}
	if err := set.Plan(newRequest("GET", "/", "198.51.100.130:1"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Charges) != 1 || len(p.Policies) != 1 || p.Policies[0].Name != "account" {
		t.Errorf("got %d charges %v, want only account", len(p.Charges), p.Policies)
	}
}

func TestSetHeadersAndTrusted(t *testing.T) {
	set := mustCompile(t, minimal+"headers: {reset: delta, ietf_draft: true}\ntrusted_proxies: [10.0.0.0/8, '2001:db8::1']\n")
	if h := set.Headers(); h != (Headers{Reset: ResetDelta, IETF: true}) {
		t.Errorf("got %+v, want delta reset with IETF", h)
	}
	for addr, want := range map[string]bool{
		"10.1.2.3": true, "::ffff:10.1.2.3": true, "11.0.0.1": false,
		"2001:db8::1": true, "2001:db8::2": false, "fe80::1%eth0": false,
	} {
		if got := set.Trusted(mustAddr(t, addr)); got != want {
			t.Errorf("Trusted(%s): got %v, want %v", addr, got, want)
		}
	}
}

func TestPlanAllocations(t *testing.T) {
	set := mustCompile(t, planConfig)
	reqs := map[string]*http.Request{
		"direct":           newRequest("GET", "/", "192.0.2.1:1234", "X-Api-Key", "premium", "X-Tenant", "acme"),
		"via proxy chain":  newRequest("GET", "/", "10.0.0.1:1234", "X-Forwarded-For", "198.51.100.9, 203.0.113.7, 10.0.0.2", "X-Api-Key", "k"),
		"forwarded":        newRequest("GET", "/", "10.0.0.1:1234", "Forwarded", `for="[2001:db8::1]:80";proto=https, for=10.0.0.2`),
		"IPv6 CIDR lookup": newRequest("GET", "/", "[2001:db8::5]:1234"),
		"IPv6 /64 via XFF": newRequest("GET", "/", "10.0.0.1:1234", "X-Forwarded-For", "2001:db8:1:2:3:4:5:6"),
		"user header":      newRequest("POST", "/api/x", "10.0.0.1:1234", "X-User-Id", "alice"),
		"override CIDR":    newRequest("GET", "/", "198.51.100.5:1"),
	}
	for name, r := range reqs {
		p := Plan{Charges: make([]bucket.Charge, 0, 8), Policies: make([]*Policy, 0, 8)}
		allocs := testing.AllocsPerRun(100, func() {
			if err := set.Plan(r, &p); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: got %v allocations per Plan, want 0", name, allocs)
		}
		if len(p.Charges) == 0 {
			t.Errorf("%s: no charges", name)
		}
	}
}

func BenchmarkPlan(b *testing.B) {
	set := mustCompile(b, planConfig)
	r := newRequest("POST", "/api/orders", "10.0.0.1:1234", "X-Forwarded-For", "203.0.113.7, 10.0.0.2",
		"X-Api-Key", "premium", "X-User-Id", "alice", "X-Tenant", "acme")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var p Plan
		for pb.Next() {
			if err := set.Plan(r, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The methods of a policy that lists GET also cover HEAD, which Go (and most servers) answer
// with the GET handler; nothing else is added.
func TestPlanHEADMatchesGETPolicies(t *testing.T) {
	set := mustCompile(t, `upstream: http://h
policies:
  - {name: reads, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [GET]}}
  - {name: writes, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [POST]}}
  - {name: heads, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [HEAD]}}
`)
	tests := []struct {
		method string
		want   []string
	}{
		{"GET", []string{"reads"}},
		{"HEAD", []string{"reads", "heads"}},
		{"POST", []string{"writes"}},
		{"OPTIONS", nil},
	}
	for _, tt := range tests {
		var got []string
		for name := range plan(t, set, newRequest(tt.method, "/", "192.0.2.1:1")) {
			got = append(got, name)
		}
		slices.Sort(got)
		slices.Sort(tt.want)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: got policies %v, want %v", tt.method, got, tt.want)
		}
	}
	// The summary shows the methods as written.
	if got, want := set.Policies()[0].Summary, "reads: key=global token_bucket rate=1/s burst=1 enforce methods=GET"; got != want {
		t.Errorf("got summary %q, want %q", got, want)
	}
}

// identity.user_header is believed only from a trusted peer when trusted_proxies is set, and
// from every peer when it is not (a sidecar in front must then overwrite the header).
func TestPlanUserHeaderTrust(t *testing.T) {
	policies := "identity: {user_header: X-User-Id}\npolicies:\n" +
		"  - {name: per-user, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n"
	withTrusted := mustCompile(t, "upstream: http://h\ntrusted_proxies: [10.0.0.0/8]\n"+policies)
	without := mustCompile(t, "upstream: http://h\n"+policies)
	tests := []struct {
		name   string
		set    *Set
		r      *http.Request
		charge bool
	}{
		{"trusted peer", withTrusted, newRequest("GET", "/", "10.0.0.1:1", "X-User-Id", "alice"), true},
		{"trusted IPv4-mapped peer", withTrusted, newRequest("GET", "/", "[::ffff:10.0.0.1]:1", "X-User-Id", "alice"), true},
		{"untrusted peer", withTrusted, newRequest("GET", "/", "203.0.113.9:1", "X-User-Id", "alice"), false},
		{"untrusted peer naming a trusted hop", withTrusted, newRequest("GET", "/", "203.0.113.9:1", "X-User-Id", "alice", "X-Forwarded-For", "10.0.0.1"), false},
		{"unix socket peer is not trusted", withTrusted, newRequest("GET", "/", "@", "X-User-Id", "alice"), false},
		{"no trusted_proxies: any peer", without, newRequest("GET", "/", "203.0.113.9:1", "X-User-Id", "alice"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := plan(t, tt.set, tt.r)["per-user"]
			if ok != tt.charge {
				t.Fatalf("got charged %v, want %v", ok, tt.charge)
			}
			if want := userKey("per-user", "token_bucket", "alice"); ok && c.Key != want {
				t.Errorf("got key %s, want alice's %s", c.Key, want)
			}
		})
	}
}

// An IPv6 client is keyed by its identity.ipv6_prefix (default /64), in netip.Prefix text form;
// IPv4 and IPv4-mapped clients by their address; CIDR overrides still see the whole address.
func TestPlanIPv6Prefix(t *testing.T) {
	cfg := func(extra string) string {
		return "upstream: http://h\ntrusted_proxies: [10.0.0.0/8]\n" + extra + "policies:\n" +
			"  - name: per-ip\n    key: ip\n    algorithm: token_bucket\n    rate: 1/s\n    burst: 1\n    overrides:\n" +
			"      - {key: '2001:db8:1:2::5', unlimited: true}\n" +
			"      - {key: '" + sha256Key("2001:db8:9::/64") + "', burst: 9}\n"
	}
	def := mustCompile(t, cfg(""))
	per48 := mustCompile(t, cfg("identity: {ipv6_prefix: 48}\n"))
	per128 := mustCompile(t, cfg("identity: {ipv6_prefix: 128}\n"))
	key := func(v string) bucket.Key { return keyOf("per-ip", "token_bucket", "ip", v) }
	tests := []struct {
		name      string
		set       *Set
		r         *http.Request
		want      bucket.Key
		wantBurst int64 // 0: not charged
	}{
		{"default /64", def, newRequest("GET", "/", "[2001:db8:1:2::1]:1"), key("2001:db8:1:2::/64"), 1},
		{"same /64, other address", def, newRequest("GET", "/", "[2001:db8:1:2:ffff::9]:1"), key("2001:db8:1:2::/64"), 1},
		{"other /64", def, newRequest("GET", "/", "[2001:db8:1:3::1]:1"), key("2001:db8:1:3::/64"), 1},
		{"zone dropped", def, newRequest("GET", "/", "[fe80::1%eth0]:1"), key("fe80::/64"), 1},
		{"forwarded client", def, newRequest("GET", "/", "10.0.0.1:1", "X-Forwarded-For", "2001:db8:1:2::7"), key("2001:db8:1:2::/64"), 1},
		{"IPv4 per address", def, newRequest("GET", "/", "192.0.2.1:1"), key("192.0.2.1"), 1},
		{"IPv4-mapped is IPv4", def, newRequest("GET", "/", "[::ffff:192.0.2.1]:1"), key("192.0.2.1"), 1},
		{"forwarded IPv4-mapped is IPv4", def, newRequest("GET", "/", "10.0.0.1:1", "X-Forwarded-For", "::ffff:192.0.2.1"), key("192.0.2.1"), 1},
		{"CIDR override matches the full address", def, newRequest("GET", "/", "[2001:db8:1:2::5]:1"), bucket.Key{}, 0},
		{"sha256 override of the prefix text", def, newRequest("GET", "/", "[2001:db8:9::abc]:1"), key("2001:db8:9::/64"), 9},
		{"/48", per48, newRequest("GET", "/", "[2001:db8:1:2::1]:1"), key("2001:db8:1::/48"), 1},
		{"/128 is per address", per128, newRequest("GET", "/", "[2001:db8:1:2::1]:1"), key("2001:db8:1:2::1"), 1},
		{"/128 IPv4 unchanged", per128, newRequest("GET", "/", "192.0.2.1:1"), key("192.0.2.1"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := plan(t, tt.set, tt.r)["per-ip"]
			if ok != (tt.wantBurst != 0) {
				t.Fatalf("got charged %v, want %v", ok, tt.wantBurst != 0)
			}
			if !ok {
				return
			}
			if c.Key != tt.want {
				t.Errorf("got key %s, want %s", c.Key, tt.want)
			}
			if c.Limit.Burst != tt.wantBurst {
				t.Errorf("got burst %d, want %d", c.Limit.Burst, tt.wantBurst)
			}
		})
	}
}

// A key header sent on several lines with different values is refused (ErrBadRequest naming
// it), and only the ip policies charge; the same value on several lines is that value, and
// StripUnjudged leaves one line of it. For api_key, header:NAME and the user header alike.
func TestPlanRepeatedKeyHeaders(t *testing.T) {
	set := mustCompile(t, `upstream: http://h
identity: {user_header: X-User-Id}
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}
  - name: per-key
    key: api_key
    algorithm: token_bucket
    rate: 1/s
    burst: 1
  - {name: per-tenant, key: 'header:X-Tenant', algorithm: token_bucket, rate: 1/s, burst: 1}
  - {name: per-user, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}
`)
	for _, tc := range []struct{ header, a, b string }{
		{"X-Api-Key", "k1", "junk"}, {"X-Tenant", "a", "b"}, {"X-User-Id", "alice", "bob"}, {"X-Api-Key", "", "k1"},
	} {
		var p Plan
		err := set.Plan(newRequest("GET", "/", "192.0.2.1:1", tc.header, tc.a, tc.header, tc.b), &p)
		var re *RequestError
		if !errors.As(err, &re) || !errors.Is(err, ErrBadRequest) || re.Header != tc.header || !strings.Contains(re.Detail(), tc.header) {
			t.Errorf("%s sent as %q and %q: got error %v, want a RequestError naming it", tc.header, tc.a, tc.b, err)
		}
		if len(p.Policies) != 1 || p.Policies[0].Name != "per-ip" {
			t.Errorf("%s sent as %q and %q: got %d charges, want the ip policy's only", tc.header, tc.a, tc.b, len(p.Policies))
		}
	}
	r := newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "k1", "X-Api-Key", "k1", "X-Tenant", "t", "X-Tenant", "t", "X-Tenant", "t")
	var p Plan
	if err := set.Plan(r, &p); err != nil {
		t.Fatal(err)
	}
	m := plan(t, set, r)
	if got, want := m["per-key"].Key, keyOf("per-key", "token_bucket", "api_key", "k1"); got != want {
		t.Errorf("X-Api-Key k1 twice: got key %s, want k1's %s", got, want)
	}
	p.StripUnjudged(r.Header)
	if got := r.Header["X-Api-Key"]; len(got) != 1 || got[0] != "k1" {
		t.Errorf("after StripUnjudged: got X-Api-Key %q, want one line k1", got)
	}
	if got := r.Header["X-Tenant"]; len(got) != 1 || got[0] != "t" {
		t.Errorf("after StripUnjudged: got X-Tenant %q, want one line t", got)
	}
	// One line is keyed as it is.
	one := plan(t, set, newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "real-key"))
	if got, want := one["per-key"].Key, keyOf("per-key", "token_bucket", "api_key", "real-key"); got != want {
		t.Errorf("one line: got key %s, want %s", got, want)
	}
}

// When X-Forwarded-For is present at all, Forwarded is ignored (README: a trusted proxy that
// writes only Forwarded must remove X-Forwarded-For). This pins that precedence.
func TestPlanXFFWinsOverForwarded(t *testing.T) {
	set := mustCompile(t, "upstream: http://h\ntrusted_proxies: [10.0.0.0/8]\npolicies:\n"+
		"  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n")
	r := newRequest("GET", "/", "10.0.0.1:1",
		"X-Forwarded-For", "198.51.100.77", // written by the client
		"Forwarded", "for=203.0.113.5") // written by the trusted proxy
	got := plan(t, set, r)["per-ip"].Key
	if want := keyOf("per-ip", "token_bucket", "ip", "198.51.100.77"); got != want {
		t.Fatalf("got key %s, want the X-Forwarded-For client's %s", got, want)
	}
}

// TestPlanCostAndQuota: every charge of a policy carries its cost (1 by default, also under an
// override), and a quota's limit and bucket key carry its calendar, so that a changed calendar
// starts fresh periods instead of reading the old one's counts.
func TestPlanCostAndQuota(t *testing.T) {
	set := mustCompile(t, `upstream: http://h
policies:
  - {name: search, key: ip, algorithm: token_bucket, rate: 10/s, burst: 20, cost: 5, match: {path_prefix: /search},
     overrides: [{key: 192.0.2.1, burst: 40}]}
  - {name: monthly, key: ip, algorithm: quota, limit: 1000, period: month, time_zone: Europe/Berlin, offset: 14}
  - {name: plain, key: ip, algorithm: fixed_window, limit: 10, window: 1m}
`)
	var p Plan
	for _, remote := range []string{"192.0.2.1:1", "192.0.2.2:1"} {
		if err := set.Plan(newRequest("GET", "/search", remote), &p); err != nil {
			t.Fatal(err)
		}
		if got := []int64{p.Charges[0].Cost, p.Charges[1].Cost, p.Charges[2].Cost}; !slices.Equal(got, []int64{5, 1, 1}) {
			t.Errorf("%s: got costs %v, want [5 1 1]", remote, got)
		}
	}
	q := p.Charges[1]
	if q.Limit.Algorithm != bucket.Quota || q.Limit.Count != 1000 || q.Limit.Period != bucket.Month ||
		q.Limit.Offset != 14 || q.Limit.Zone == nil || q.Limit.Zone.String() != "Europe/Berlin" {
		t.Errorf("got quota limit %+v, want 1000 per month from the 15th in Europe/Berlin", q.Limit)
	}
	if want := keyOf("monthly", "quota", "ip", "month/Europe/Berlin/14\x00192.0.2.2"); q.Key != want {
		t.Errorf("got quota key %v, want %v", q.Key, want)
	}
	if want := keyOf("plain", "fixed_window", "ip", "192.0.2.2"); p.Charges[2].Key != want {
		t.Errorf("got fixed-window key %v, want %v (unchanged by quotas)", p.Charges[2].Key, want)
	}
	pols := set.Policies()
	if got, want := pols[1].IETFPolicy, `"monthly";q=1000;w=2592000`; got != want {
		t.Errorf("got RateLimit-Policy item %s, want %s", got, want)
	}
	if got, want := pols[1].Summary, "monthly: key=ip quota limit=1000 period=month time_zone=Europe/Berlin offset=14 enforce"; got != want {
		t.Errorf("got summary %q, want %q", got, want)
	}
	if got, want := pols[0].Summary, "search: key=ip token_bucket rate=10/s burst=20 cost=5 enforce path_prefix=/search overrides=1"; got != want {
		t.Errorf("got summary %q, want %q", got, want)
	}
}

// TestPlanCostsByRoute: one budget, routes charged differently; the first matching entry wins,
// a GET entry also covers HEAD, and requests no entry matches spend the policy's cost.
func TestPlanCostsByRoute(t *testing.T) {
	set := mustCompile(t, `upstream: http://h
policies:
  - name: monthly
    key: api_key
    algorithm: quota
    limit: 1000
    period: month
    cost: 2
    costs:
      - {methods: [POST], path_prefix: /search, cost: 5}
      - {path_prefix: /search, cost: 3}
      - {methods: [GET], path_prefix: /export, cost: 20}
`)
	var p Plan
	for _, tc := range []struct {
		method, path string
		want         int64
	}{
		{"POST", "/search/q", 5},
		{"GET", "/search/q", 3},
		{"GET", "/export/all", 20},
		{"HEAD", "/export/all", 20},
		{"POST", "/export/all", 2},
		{"GET", "/other", 2},
		{"post", "/SEARCH;x//q", 5}, // the canonical route is matched, as for match.path_prefix
		{"GET", "/Export", 20},
		{"GET", "/search/q", 3},
	} {
		if err := set.Plan(newRequest(tc.method, tc.path, "192.0.2.1:1", "X-Api-Key", "k"), &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Charges) != 1 || p.Charges[0].Cost != tc.want {
			t.Errorf("%s %s: got charges %+v, want one of cost %d", tc.method, tc.path, p.Charges, tc.want)
		}
	}
}
