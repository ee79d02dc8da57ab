package envoyrules

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// rlsDir writes files (name → content) into a fresh folder and returns it.
func rlsDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// compileRLSFiles loads files as a gateway without a namespace does, failing on any problem.
func compileRLSFiles(t *testing.T, files map[string]string) *Rules {
	t.Helper()
	return compileRLSInNamespace(t, files, "")
}

// compileRLSInNamespace loads files as a gateway whose store.dynamodb.namespace is ns.
func compileRLSInNamespace(t *testing.T, files map[string]string, ns string) *Rules {
	t.Helper()
	rules, problems, err := Load(rlsDir(t, files), Options{Namespace: ns})
	if err != nil || len(problems) > 0 {
		t.Fatalf("load: %v %v", err, problems)
	}
	return rules
}

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// A configuration in the style of envoyproxy/ratelimit's documentation: exact values, key-only
// defaults, nesting, wildcards and a descriptor without a limit.
const messagingConfig = `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: remote_address
    rate_limit:
      name: per_address
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 10.0.0.1
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /files/*/raw
    rate_limit:
      unit: minute
      requests_per_unit: 7
  - key: path
    value: "*"
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: client
    descriptors:
      - key: plan
        value: gold
        rate_limit:
          unit: minute
          requests_per_unit: 500
          unit_multiplier: 5
          algorithm: token_bucket
          burst: 50
      - key: plan
        rate_limit:
          unit: month
          requests_per_unit: 3
          algorithm: quota
          time_zone: Europe/Berlin
`

func TestRLSMatchMostSpecificWins(t *testing.T) {
	rules := compileRLSFiles(t, map[string]string{"messaging.yaml": messagingConfig})
	d := rules.Domain("messaging")
	if d == nil {
		t.Fatal("domain messaging not loaded")
	}
	if rules.Domain("other") != nil {
		t.Error("an unknown domain has rules")
	}
	tests := []struct {
		name    string
		entries []Entry
		want    string // the rule's label; "" for no rule
	}{
		{"nested exact then key", entries("message_type", "marketing", "to_number", "555"), "messaging.message_type_marketing.to_number"},
		{"parent without limit", entries("message_type", "marketing"), ""},
		{"unknown value at a level without default", entries("message_type", "transactional", "to_number", "555"), ""},
		{"key-only default", entries("to_number", "555"), "messaging.to_number"},
		{"deeper than the tree", entries("to_number", "555", "x", "y"), ""},
		{"named rule", entries("remote_address", "10.0.0.9"), "messaging.per_address"},
		{"exact value without limit wins over the default", entries("remote_address", "10.0.0.1"), ""},
		{"trailing wildcard", entries("path", "/api/v1/users"), "messaging.path_/api/*"},
		{"middle wildcard", entries("path", "/files/a/b/raw"), "messaging.path_/files/*/raw"},
		{"middle wildcard needs its suffix; the catch-all wildcard takes it", entries("path", "/files/a/cooked"), "messaging.path_*"},
		{"first wildcard in file order", entries("path", "/api/files/x/raw"), "messaging.path_/api/*"},
		{"catch-all wildcard matches empty", entries("path", ""), "messaging.path_*"},
		{"exact nested value", entries("client", "c1", "plan", "gold"), "messaging.client.plan_gold"},
		{"nested key-only", entries("client", "c1", "plan", "silver"), "messaging.client.plan"},
		{"unknown key", entries("nothing", "x"), ""},
		{"no entries", nil, ""},
	}
	var m Match
	for _, tt := range tests {
		r := d.Match(tt.entries, &m)
		got := ""
		if r != nil {
			got = r.Label
		}
		if got != tt.want {
			t.Errorf("%s: got rule %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestRLSLimits(t *testing.T) {
	d := compileRLSFiles(t, map[string]string{"m.yaml": messagingConfig}).Domain("messaging")
	var m Match
	berlin, _ := time.LoadLocation("Europe/Berlin")
	tests := []struct {
		entries []Entry
		want    bucket.Limit
	}{
		{entries("to_number", "1"), bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: 24 * time.Hour}},
		{entries("remote_address", "a"), bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Second}},
		// 500 per 5 minutes: a rate of 500/300 per second, a bucket of 50.
		{entries("client", "c", "plan", "gold"), bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 500.0 / 300, Burst: 50}},
		{entries("client", "c", "plan", "x"), bucket.Limit{Algorithm: bucket.Quota, Count: 3, Period: bucket.Month, Zone: berlin}},
	}
	for _, tt := range tests {
		r := d.Match(tt.entries, &m)
		if r == nil {
			t.Fatalf("%v: no rule", tt.entries)
		}
		got := r.Limit
		if got.Zone != nil && tt.want.Zone != nil && got.Zone.String() == tt.want.Zone.String() {
			got.Zone = tt.want.Zone
		}
		if got != tt.want {
			t.Errorf("%v: got limit %+v, want %+v", tt.entries, got, tt.want)
		}
	}
	r := d.Match(entries("client", "c", "plan", "gold"), &m)
	if r.RequestsPerUnit != 500 || r.Unit != UnitMinute || r.UnitMultiplier != 5 {
		t.Errorf("current limit: got %d per %d x %d, want 500 per minute x 5", r.RequestsPerUnit, r.Unit, r.UnitMultiplier)
	}
}

func TestRLSKeys(t *testing.T) {
	d := compileRLSFiles(t, map[string]string{"m.yaml": messagingConfig}).Domain("messaging")
	key := func(e []Entry) bucket.Key {
		t.Helper()
		var m Match
		if d.Match(e, &m) == nil {
			t.Fatalf("%v: no rule", e)
		}
		return m.Key(e)
	}
	if key(entries("to_number", "1")) == key(entries("to_number", "2")) {
		t.Error("two values of a key-only descriptor share a bucket")
	}
	if key(entries("path", "/files/a/raw")) == key(entries("path", "/files/b/raw")) {
		t.Error("two values of a wildcard without share_threshold share a bucket")
	}
	if key(entries("path", "/api/a")) != key(entries("path", "/api/b")) {
		t.Error("two values of a share_threshold wildcard have different buckets")
	}
	// Length-prefixed: moving a byte from key to value is another descriptor.
	if key(entries("client", "ab", "plan", "x")) == key(entries("client", "a", "plan", "bx")) {
		t.Error("entries that concatenate alike share a bucket")
	}
	// An override with the window of a fixed-window rule counts in the rule's bucket, as
	// envoyproxy/ratelimit keys both by domain, entries and window.
	l, ok := OverrideLimit(100, UnitDay, 1)
	if !ok {
		t.Fatal("OverrideLimit(100, day, 1) refused")
	}
	e := entries("to_number", "1")
	if got, want := d.OverrideKey(e, l), key(e); got != want {
		t.Errorf("override key %s, want the rule's %s", got, want)
	}
	l2, _ := OverrideLimit(100, UnitHour, 1)
	if d.OverrideKey(e, l2) == key(e) {
		t.Error("an override of another window shares the rule's bucket")
	}
	if _, ok := OverrideLimit(1, 0, 1); ok {
		t.Error("OverrideLimit accepted unit UNKNOWN")
	}
	if _, ok := OverrideLimit(1, UnitYear, 2); ok {
		t.Error("OverrideLimit accepted two years")
	}
}

func TestRLSKeysAreScopedByDomainPoolAndNamespace(t *testing.T) {
	files := map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: p\n    rate_limit: {unit: minute, requests_per_unit: 1, pool: shared}\n",
		"b.yaml": "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: p\n    rate_limit: {unit: minute, requests_per_unit: 1, pool: shared}\n",
	}
	rules := compileRLSFiles(t, files)
	key := func(domain string, e []Entry) bucket.Key {
		var m Match
		if rules.Domain(domain).Match(e, &m) == nil {
			t.Fatalf("%s %v: no rule", domain, e)
		}
		return m.Key(e)
	}
	if key("a", entries("k", "v")) == key("b", entries("k", "v")) {
		t.Error("two domains share a bucket")
	}
	if key("a", entries("p", "v")) != key("b", entries("p", "v")) {
		t.Error("two domains naming one pool do not share its bucket")
	}
}

// TestRLSKeyBytes pins the bytes a descriptor's bucket key digests: keys are the state in the
// store, and a change of one byte would start every bucket afresh on upgrade (and part a pool
// from the gateways still on the old version). Each want is written out by hand.
func TestRLSKeyBytes(t *testing.T) {
	entry := func(b []byte, k, v string) []byte {
		b = append(b, byte(len(k)))
		b = append(b, k...)
		b = append(b, byte(len(v)))
		return append(b, v...)
	}
	want := func(prefix string, kv ...string) bucket.Key {
		b := []byte(prefix)
		for i := 0; i+1 < len(kv); i += 2 {
			b = entry(b, kv[i], kv[i+1])
		}
		sum := sha256.Sum256(b)
		var k bucket.Key
		copy(k[:], sum[:])
		return k
	}
	pools := map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: p\n    rate_limit: {unit: minute, requests_per_unit: 1, pool: shared}\n"}
	msg := compileRLSFiles(t, map[string]string{"m.yaml": messagingConfig}).Domain("messaging")
	plain := compileRLSFiles(t, pools).Domain("a")
	spaced := compileRLSInNamespace(t, pools, "team").Domain("a")
	tests := []struct {
		name string
		d    *Domain
		e    []Entry
		want bucket.Key
	}{
		{"fixed window", msg, entries("to_number", "1"),
			want("\x03rls\x00messaging\x00fixed_window/86400000000000\x00rls\x00", "to_number", "1")},
		{"nested", msg, entries("message_type", "marketing", "to_number", "555"),
			want("\x03rls\x00messaging\x00fixed_window/86400000000000\x00rls\x00", "message_type", "marketing", "to_number", "555")},
		{"share_threshold hashes the wildcard", msg, entries("path", "/api/x"),
			want("\x03rls\x00messaging\x00fixed_window/60000000000\x00rls\x00", "path", "/api/*")},
		{"token bucket", msg, entries("client", "c", "plan", "gold"),
			want("\x03rls\x00messaging\x00token_bucket\x00rls\x00", "client", "c", "plan", "gold")},
		{"quota", msg, entries("client", "c", "plan", "x"),
			want("\x03rls\x00messaging\x00quota/3/Europe/Berlin/0\x00rls\x00", "client", "c", "plan", "x")},
		{"domain", plain, entries("k", "v"), want("\x03rls\x00a\x00fixed_window/60000000000\x00rls\x00", "k", "v")},
		{"pool", plain, entries("p", "v"), want("\x02pool\x00shared\x00fixed_window/60000000000\x00rls\x00", "p", "v")},
		{"domain in a namespace", spaced, entries("k", "v"), want("\x01ns\x00team\x00\x03rls\x00a\x00fixed_window/60000000000\x00rls\x00", "k", "v")},
		{"a pool ignores the namespace", spaced, entries("p", "v"), want("\x02pool\x00shared\x00fixed_window/60000000000\x00rls\x00", "p", "v")},
	}
	for _, tt := range tests {
		var m Match
		if tt.d.Match(tt.e, &m) == nil {
			t.Fatalf("%s: no rule", tt.name)
		}
		if got := m.Key(tt.e); got != tt.want {
			t.Errorf("%s: key %s, want %s", tt.name, got, tt.want)
		}
	}
	l, _ := OverrideLimit(7, UnitHour, 2)
	e := entries("to_number", "1")
	if got, w := msg.OverrideKey(e, l), want("\x03rls\x00messaging\x00fixed_window/7200000000000\x00rls\x00", "to_number", "1"); got != w {
		t.Errorf("override key %s, want %s", got, w)
	}
}

func TestRLSLabels(t *testing.T) {
	d := compileRLSFiles(t, map[string]string{"m.yaml": `domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: file
    value: docs/*
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
`}).Domain("d")
	tests := []struct {
		e    []Entry
		want string
	}{
		{entries("user", "alice"), "d.user_alice"},
		{entries("route", "/a", "method", "GET"), "d.route_/a.method_GET"},
		{entries("file", "docs/x.pdf"), "d.file_docs/*"},
		{entries("plain", "secret-value"), "d.plain"},
	}
	var m Match
	for _, tt := range tests {
		if d.Match(tt.e, &m) == nil {
			t.Fatalf("%v: no rule", tt.e)
		}
		if got := m.Label("d", tt.e); got != tt.want {
			t.Errorf("%v: label %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"*c", "abc", true}, {"*c", "ab", false},
		{"a*c", "ac", true}, {"a*c", "abbc", true}, {"a*c", "abcd", false},
		{"a*b*c", "a-b-c", true}, {"a*b*c", "acb", false}, {"a*b*c", "abc", true},
		{"ab*ba", "aba", false}, // prefix and suffix may not overlap
		{"*", "", true}, {"**", "x", true}, {"x", "x", true}, {"x", "y", false},
	}
	for _, tt := range tests {
		if got := globMatch(strings.Split(tt.pattern, "*"), tt.value); got != tt.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

func TestRLSUnlimitedAndShadow(t *testing.T) {
	d := compileRLSFiles(t, map[string]string{"a.yaml": `domain: d
descriptors:
  - key: k
    value: vip
    rate_limit: {unlimited: true}
  - key: k
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, name: base}
  - key: j
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: base}]}
`}).Domain("d")
	var m Match
	if r := d.Match(entries("k", "vip"), &m); r == nil || !r.Unlimited {
		t.Errorf("vip: got %+v, want an unlimited rule", r)
	}
	if r := d.Match(entries("k", "x"), &m); r == nil || !r.Shadow || r.Name != "base" {
		t.Errorf("k: got %+v, want the shadow rule base", r)
	}
	if r := d.Match(entries("j", "x"), &m); r == nil || len(r.Replaces) != 1 || r.Replaces[0] != "base" {
		t.Errorf("j: got %+v, want a rule replacing base", r)
	}
}

func BenchmarkRLSMatchAndKey(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.yaml"), []byte(messagingConfig), 0o600); err != nil {
		b.Fatal(err)
	}
	rules, problems, err := Load(dir, Options{})
	if err != nil || len(problems) > 0 {
		b.Fatal(err, problems)
	}
	d := rules.Domain("messaging")
	e := entries("message_type", "marketing", "to_number", "2061234567")
	var m Match
	b.ReportAllocs()
	for b.Loop() {
		if d.Match(e, &m) == nil {
			b.Fatal("no rule")
		}
		_ = m.Key(e)
	}
}

// TestAlgorithmNames: a rule's algorithm is spelled as limitterms names it, the name its bucket
// keys hash and its messages print.
func TestAlgorithmNames(t *testing.T) {
	for name, alg := range algorithms {
		if got := limitterms.AlgorithmName(alg); got != name {
			t.Errorf("algorithm %q reads as %d, whose name is %q", name, alg, got)
		}
	}
}

// TestRLSKeyEntriesAndIndex checks what the operators' console names an rls key by: the
// entries as the bucket key hashed them (a share_threshold wildcard's values all as the
// wildcard, so that every value of one bucket has one pseudonym), and each rule's Index, unique
// within the set so that the console can find a rule's state by it.
func TestRLSKeyEntriesAndIndex(t *testing.T) {
	rules := compileRLSFiles(t, map[string]string{"m.yaml": messagingConfig,
		"o.yaml": "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"})
	d := rules.Domain("messaging")
	keyed := func(e []Entry) []Entry {
		t.Helper()
		var m Match
		if d.Match(e, &m) == nil {
			t.Fatalf("%v: no rule", e)
		}
		return m.KeyEntries(e)
	}
	a, b := keyed(entries("path", "/api/a")), keyed(entries("path", "/api/b"))
	if len(a) != 1 || a[0] != b[0] || a[0].Value == "/api/a" {
		t.Errorf("share_threshold values keyed as %v and %v, want both as the wildcard", a, b)
	}
	if got := keyed(entries("to_number", "1")); len(got) != 1 || got[0] != (Entry{Key: "to_number", Value: "1"}) {
		t.Errorf("a key-only descriptor keyed as %v, want its own entry", got)
	}
	seen := map[int]*Rule{}
	n := 0
	for _, dn := range rules.Domains() {
		for _, r := range rules.Domain(dn).Rules() {
			n++
			if other, dup := seen[r.Index]; dup {
				t.Errorf("rules %q and %q share index %d", r.Label, other.Label, r.Index)
			}
			if r.Index < 0 || r.Index >= rules.Len() {
				t.Errorf("rule %q: index %d outside [0, %d)", r.Label, r.Index, rules.Len())
			}
			seen[r.Index] = r
		}
	}
	if n != rules.Len() || n < 3 {
		t.Fatalf("walked %d rules, Len %d", n, rules.Len())
	}
}
