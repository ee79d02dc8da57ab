package policy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestPseudonymsRecipe(t *testing.T) {
	secret := []byte(strings.Repeat("s", 32))
	ps := NewPseudonyms(secret)
	// The documented recipe, computed independently: HMAC-SHA256(secret, kind 0x00 value)[:16].
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("api_key\x00sk_live_1"))
	want := hex.EncodeToString(m.Sum(nil)[:16])
	if got := ps.Of("api_key", "sk_live_1"); got != want {
		t.Errorf("Of = %s, want %s", got, want)
	}
	if got := NewPseudonyms(secret).Of("api_key", "sk_live_1"); got != want {
		t.Errorf("another Pseudonyms with the same secret: got %s, want %s", got, want)
	}
	if got := ps.Of("user", "sk_live_1"); got == want {
		t.Error("the same value of two kinds shares a pseudonym")
	}
	if got := NewPseudonyms([]byte(strings.Repeat("t", 32))).Of("api_key", "sk_live_1"); got == want {
		t.Error("two secrets give the same pseudonym")
	}
	if a, b := NewPseudonyms(nil).Of("ip", "192.0.2.1"), NewPseudonyms(nil).Of("ip", "192.0.2.1"); a == b {
		t.Error("two random secrets give the same pseudonym")
	}
	long := strings.Repeat("x", 1000) // past the stack buffer
	m.Reset()
	m.Write([]byte("api_key\x00" + long))
	if got, want := ps.Of("api_key", long), hex.EncodeToString(m.Sum(nil)[:16]); got != want {
		t.Errorf("long value: got %s, want %s", got, want)
	}
}

func TestPseudonymSecret(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	if _, err := PseudonymSecret("S", env("")); err == nil {
		t.Error("unset variable accepted")
	}
	if _, err := PseudonymSecret("S", env("short-secret-value")); err == nil || strings.Contains(err.Error(), "short-secret-value") {
		t.Errorf("short secret: got %v, want an error that does not quote it", err)
	}
	good := strings.Repeat("k", 32)
	got, err := PseudonymSecret("S", env(good))
	if err != nil || string(got) != good {
		t.Errorf("got %q, %v; want the secret", got, err)
	}
	cfg := mustParse(t, minimal+"log: {pseudonym_secret_env: S}\n", noEnv)
	ps, err := LogPseudonyms(cfg, env(good))
	if err != nil {
		t.Fatal(err)
	}
	if want := NewPseudonyms([]byte(good)).Of("ip", "192.0.2.1"); ps.Of("ip", "192.0.2.1") != want {
		t.Error("LogPseudonyms does not use the named secret")
	}
}

func TestPlanIdentityAndKeyValues(t *testing.T) {
	set := mustCompile(t, planConfig)
	p := Plan{WantIdentity: true}
	// GET: per-user-writes does not match, yet the user is in Identity.
	r := newRequest("GET", "/x", "10.0.0.1:1", "X-Api-Key", "k1", "X-User-Id", "alice", "X-Tenant", "acme")
	if err := set.Plan(r, &p); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for i, kv := range p.Identity {
		got[kv.Kind] = p.IdentityValue(i)
	}
	want := map[string]string{"ip": "10.0.0.1", "api_key": "k1", "user": "alice", "header:x-tenant": "acme"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Identity = %v, want %v", got, want)
	}
	vals := map[string]string{}
	for i, pol := range p.Policies {
		vals[pol.Name] = p.KeyValue(i)
	}
	wantVals := map[string]string{"per-ip": "10.0.0.1", "per-key": "k1", "per-tenant": "acme", "account": ""}
	if !reflect.DeepEqual(vals, wantVals) {
		t.Errorf("KeyValue by policy = %v, want %v", vals, wantVals)
	}
	// Without WantIdentity nothing is collected; absent values are left out.
	p = Plan{}
	if err := set.Plan(newRequest("GET", "/x", "10.0.0.1:1"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Identity) != 0 {
		t.Errorf("Identity without WantIdentity = %v", p.Identity)
	}
	p.WantIdentity = true
	if err := set.Plan(newRequest("GET", "/x", "10.0.0.1:1"), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Identity) != 1 || p.Identity[0].Kind != "ip" {
		t.Errorf("Identity of a bare request = %v, want the ip only", p.Identity)
	}
}

// TestPlanFieldsMatchesPlan: a request and its log fields get the same charges.
func TestPlanFieldsMatchesPlan(t *testing.T) {
	set := mustCompile(t, planConfig)
	cases := []struct {
		r *http.Request
		f Fields
	}{
		{newRequest("GET", "/", "192.0.2.1:1", "X-Api-Key", "premium"),
			Fields{Method: "GET", Path: "/", Client: netip.MustParseAddr("192.0.2.1"), APIKey: "premium"}},
		{newRequest("POST", "/api/x", "10.0.0.1:1", "X-User-Id", "alice", "X-Tenant", "acme"),
			Fields{Method: "POST", Path: "/api/x", Client: netip.MustParseAddr("10.0.0.1"), User: "alice",
				Headers: []KindValue{{Kind: "header:x-tenant", Value: "acme"}}}},
		// CIDR overrides (unlimited for .128/25) apply to the log's address.
		{newRequest("GET", "/", "198.51.100.200:1"),
			Fields{Method: "GET", Path: "/", Client: netip.MustParseAddr("198.51.100.200")}},
		{newRequest("GET", "/", "198.51.100.7:1", "X-Api-Key", "internal"),
			Fields{Method: "GET", Path: "/", Client: netip.MustParseAddr("198.51.100.7"), APIKey: "internal"}},
		// IPv6 clients are keyed by their /64 in both.
		{newRequest("HEAD", "/", "[2001:db8:1:2::99]:1"),
			Fields{Method: "HEAD", Path: "/", Client: netip.MustParseAddr("2001:db8:1:2::5")}},
	}
	for _, c := range cases {
		var want, got Plan
		if err := set.Plan(c.r, &want); err != nil {
			t.Fatal(err)
		}
		set.PlanFields(&c.f, &got)
		if !reflect.DeepEqual(got.Charges, want.Charges) || !reflect.DeepEqual(got.Policies, want.Policies) {
			t.Errorf("%s %s: PlanFields charges %v, want Plan's %v", c.r.Method, c.r.URL.Path, got.Policies, want.Policies)
		}
	}
	// An ip key value given as such (a pseudonym) is hashed like an address text.
	var p Plan
	set.PlanFields(&Fields{Method: "GET", Path: "/", IP: "0123abcd"}, &p)
	if len(p.Charges) == 0 || p.Policies[0].Name != "per-ip" || p.Charges[0].Key != keyOf("per-ip", "token_bucket", "ip", "0123abcd") {
		t.Errorf("IP given as a value: got %v", p.Charges)
	}
}

func TestPlanFieldsAllocs(t *testing.T) {
	set := mustCompile(t, planConfig)
	f := Fields{Method: "GET", Path: "/", Client: netip.MustParseAddr("192.0.2.1"), APIKey: "k"}
	var p Plan
	set.PlanFields(&f, &p)
	if n := testing.AllocsPerRun(100, func() { set.PlanFields(&f, &p) }); n != 0 {
		t.Errorf("PlanFields allocates %v times, want 0", n)
	}
}

func TestScrubAddrs(t *testing.T) {
	ps := NewPseudonyms([]byte("0123456789abcdef0123456789abcdef"))
	v4, v6 := "ip:"+ps.Of("ip", "127.0.0.23"), "ip:"+ps.Of("ip", "2001:db8::1")
	for in, want := range map[string]string{
		"read tcp 127.0.0.1:8080->127.0.0.23:5555: i/o timeout": "read tcp " + "ip:" + ps.Of("ip", "127.0.0.1") + ":8080->" + v4 + ":5555: i/o timeout",
		"http: TLS handshake error from [2001:db8::1]:443: EOF": "http: TLS handshake error from " + v6 + ":443: EOF",
		"peer 2001:db8::1 left at 17:44:38":                     "peer " + v6 + " left at 17:44:38",
		"no address here, version 1.2.3":                        "no address here, version 1.2.3",
		"::ffff:127.0.0.23 mapped":                              v4 + " mapped",
	} {
		if got := ps.ScrubAddrs(in); got != want {
			t.Errorf("ScrubAddrs(%q) = %q, want %q", in, got, want)
		}
	}
}
