package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
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

// rlsConfig is an RLS-only configuration for dir.
func rlsConfig(t *testing.T, dir, extra string) *Config {
	t.Helper()
	cfg, err := Parse([]byte("admin_listen: 127.0.0.1:9090\nrls:\n  listen: 127.0.0.1:8081\n  config_dir: "+dir+"\n"+extra), LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func compileRLSFiles(t *testing.T, files map[string]string) *RLSRules {
	t.Helper()
	set, err := Compile(rlsConfig(t, rlsDir(t, files), ""), CompileOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return set.RLS()
}

func entries(kv ...string) []RLSEntry {
	var out []RLSEntry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, RLSEntry{Key: kv[i], Value: kv[i+1]})
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
		entries []RLSEntry
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
	var m RLSMatch
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
	var m RLSMatch
	berlin, _ := time.LoadLocation("Europe/Berlin")
	tests := []struct {
		entries []RLSEntry
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
	key := func(e []RLSEntry) bucket.Key {
		t.Helper()
		var m RLSMatch
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
	key := func(domain string, e []RLSEntry) bucket.Key {
		var m RLSMatch
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
		e    []RLSEntry
		want string
	}{
		{entries("user", "alice"), "d.user_alice"},
		{entries("route", "/a", "method", "GET"), "d.route_/a.method_GET"},
		{entries("file", "docs/x.pdf"), "d.file_docs/*"},
		{entries("plain", "secret-value"), "d.plain"},
	}
	var m RLSMatch
	for _, tt := range tests {
		if d.Match(tt.e, &m) == nil {
			t.Fatalf("%v: no rule", tt.e)
		}
		if got := m.Label("d", tt.e); got != tt.want {
			t.Errorf("%v: label %q, want %q", tt.e, got, tt.want)
		}
	}
	if got := OverrideLabel("d", entries("user", "alice", "path", "/x")); got != "d.user.path" {
		t.Errorf("override label %q, want d.user.path (keys, never values)", got)
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

// TestRLSConfigErrors: every field envoyproxy/ratelimit accepts that ratelimit-proxy does not
// serve, and every bad value, is refused with the file and the field's path.
func TestRLSConfigErrors(t *testing.T) {
	tests := []struct {
		name, content string
		want          []string
	}{
		{"unknown field", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, unitt: x}\n",
			[]string{`descriptors[0].rate_limit.unitt: unknown field`}},
		{"quota_mode", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
			[]string{`descriptors[0].quota_mode: not supported`}},
		{"metadata", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: b}\n",
			[]string{`descriptors[0].metadata: not supported`}},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minutes, requests_per_unit: 1}\n",
			[]string{`descriptors[0].rate_limit.unit: "minutes": must be second, minute`}},
		{"missing unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
			[]string{`descriptors[0].rate_limit.unit: required`}},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
			[]string{`descriptors[0].rate_limit.unit: must not be set when unlimited is true`}},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n",
			[]string{`descriptors[0].key: required`}},
		{"empty domain", "descriptors: []\n", []string{`domain: required`}},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
			[]string{`descriptors[1]: duplicate descriptor`}},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n",
			[]string{`descriptors[0].rate_limit.replaces[0].name: "a": a rate_limit cannot replace itself`}},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
			[]string{`descriptors[0].rate_limit.replaces[0].name: required`}},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			[]string{`descriptors[0].share_threshold: "true": applies to a wildcard value`}},
		{"leaky bucket", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky_bucket}\n",
			[]string{`descriptors[0].rate_limit.algorithm: "leaky_bucket": must be fixed_window, sliding_window, token_bucket or quota: an RLS answer can neither hold`}},
		{"quota of hours", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: quota}\n",
			[]string{`descriptors[0].rate_limit.unit: "hour": must be day, week or month for algorithm quota`}},
		{"burst on a window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, burst: 5}\n",
			[]string{`descriptors[0].rate_limit.burst: "5": used by algorithm token_bucket only`}},
		{"two years", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}\n",
			[]string{`descriptors[0].rate_limit.unit_multiplier: "2": unit times unit_multiplier must be at most 366 days`}},
		{"not a number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: many}\n",
			[]string{`descriptors[0].rate_limit.requests_per_unit: "many": must be an integer`}},
		{"not YAML", "domain: [\n", []string{`invalid YAML`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := rlsDir(t, map[string]string{"conf.yaml": tt.content})
			err := rlsConfig(t, dir, "").Validate(nil)
			if err == nil {
				t.Fatal("validated")
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("error %T is not Errors", err)
			}
			file := filepath.Join(dir, "conf.yaml")
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), file+": "+w) {
					t.Errorf("error\n%s\ndoes not name %q", err, file+": "+w)
				}
			}
		})
	}
}

func TestRLSDuplicateDomainNamesBothFiles(t *testing.T) {
	dir := rlsDir(t, map[string]string{
		"a.yaml":    "domain: d\n",
		"b.yml":     "domain: d\n",
		".hidden":   "not: [yaml",
		"notes.txt": "not: [yaml",
	})
	err := rlsConfig(t, dir, "").Validate(nil)
	want := filepath.Join(dir, "b.yml") + `: domain: "d": also the domain of ` + filepath.Join(dir, "a.yaml")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want an error containing %q", err, want)
	}
}

func TestRLSOnlyConfig(t *testing.T) {
	dir := rlsDir(t, map[string]string{"a.yaml": "domain: d\n"})
	// admin_listen, store and rls: complete, no upstream, listen or policies.
	if err := rlsConfig(t, dir, "store:\n  backend: memory\n").Validate(nil); err != nil {
		t.Fatalf("RLS-only config: %v", err)
	}
	err := rlsConfig(t, dir, "policies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n").Validate(nil)
	if err == nil || !strings.Contains(err.Error(), "policies: set, but upstream is empty") {
		t.Errorf("policies without upstream: got %v", err)
	}
	cfg := rlsConfig(t, dir, "")
	cfg.RLS.Listen = cfg.AdminListen
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), "rls.listen: \"127.0.0.1:9090\": must differ from admin_listen") {
		t.Errorf("rls.listen = admin_listen: got %v", err)
	}
	cfg = rlsConfig(t, dir, "")
	cfg.RLS.ConfigDir = filepath.Join(dir, "missing")
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), "rls.config_dir: ") {
		t.Errorf("missing folder: got %v", err)
	}
	cfg = rlsConfig(t, dir, "")
	cfg.RLS.ResponseHeaders = "draft"
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), `rls.response_headers: "draft"`) {
		t.Errorf("response_headers draft: got %v", err)
	}
	// Without rls, upstream stays required.
	cfg = rlsConfig(t, dir, "")
	cfg.RLS = nil
	if err := cfg.Validate(nil); err == nil || !strings.Contains(err.Error(), "upstream: required") {
		t.Errorf("no upstream, no rls: got %v", err)
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
	var m RLSMatch
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
	cfg, err := Parse([]byte("rls:\n  listen: 127.0.0.1:8081\n  config_dir: "+dir+"\n"), LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		b.Fatal(err)
	}
	set, err := Compile(cfg, CompileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	d := set.RLS().Domain("messaging")
	e := entries("message_type", "marketing", "to_number", "2061234567")
	var m RLSMatch
	b.ReportAllocs()
	for b.Loop() {
		if d.Match(e, &m) == nil {
			b.Fatal("no rule")
		}
		_ = m.Key(e)
	}
}

// FuzzRLSFile: any file content either is refused with errors or compiles into rules that match
// any descriptor without panicking, and a rule found twice for the same entries has one key.
func FuzzRLSFile(f *testing.F) {
	f.Add([]byte(messagingConfig), "path", "/api/x")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), "k", "abbc")
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n"), "k", "")
	f.Add([]byte("domain: [\n"), "", "")
	f.Fuzz(func(t *testing.T, data []byte, key, value string) {
		var es Errors
		file := parseRLSFile(&es, "f.yaml", data)
		if file == nil {
			if len(es) == 0 {
				t.Fatal("no file and no error")
			}
			return
		}
		rules := compileRLS(&es, []*rlsFile{file}, &Config{})
		if len(es) > 0 {
			return
		}
		d := rules.Domain(file.domain)
		if d == nil {
			t.Fatalf("domain %q not compiled", file.domain)
		}
		e := []RLSEntry{{Key: key, Value: value}}
		var m1, m2 RLSMatch
		r := d.Match(e, &m1)
		if r != d.Match(e, &m2) {
			t.Fatal("two matches of one descriptor differ")
		}
		if r != nil && !r.Unlimited {
			if m1.Key(e) != m2.Key(e) {
				t.Fatal("two keys of one descriptor differ")
			}
			_ = m1.Label(file.domain, e)
		}
	})
}

// TestRLSKeyEntriesAndIndex checks what the operators' console names an rls key by: the
// entries as the bucket key hashed them (a share_threshold wildcard's values all as the
// wildcard, so that every value of one bucket has one pseudonym), and each rule's Index, unique
// within the set so that the console can find a rule's state by it.
func TestRLSKeyEntriesAndIndex(t *testing.T) {
	rules := compileRLSFiles(t, map[string]string{"m.yaml": messagingConfig,
		"o.yaml": "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"})
	d := rules.Domain("messaging")
	keyed := func(e []RLSEntry) []RLSEntry {
		t.Helper()
		var m RLSMatch
		if d.Match(e, &m) == nil {
			t.Fatalf("%v: no rule", e)
		}
		return m.KeyEntries(e)
	}
	a, b := keyed(entries("path", "/api/a")), keyed(entries("path", "/api/b"))
	if len(a) != 1 || a[0] != b[0] || a[0].Value == "/api/a" {
		t.Errorf("share_threshold values keyed as %v and %v, want both as the wildcard", a, b)
	}
	if got := keyed(entries("to_number", "1")); len(got) != 1 || got[0] != (RLSEntry{Key: "to_number", Value: "1"}) {
		t.Errorf("a key-only descriptor keyed as %v, want its own entry", got)
	}
	seen := map[int]*RLSRule{}
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
