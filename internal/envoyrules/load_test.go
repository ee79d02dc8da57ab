package envoyrules

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// problemText puts one problem on each line, written as internal/policy's FieldError writes
// them (`file: field: "value": message`).
func problemText(ps []Problem) string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Path + ": " + p.Msg
		if p.Value != "" {
			lines[i] = p.Path + ": " + strconv.Quote(p.Value) + ": " + p.Msg
		}
		if p.Path == "" {
			lines[i] = p.Msg
		}
		lines[i] = p.File + ": " + lines[i]
	}
	return strings.Join(lines, "\n")
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
		// The checks a rule shares with the proxy's policies: the same bounds, names, zones and
		// durations, written alike.
		{"pool name", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, pool: 'a b'}\n",
			[]string{`descriptors[0].rate_limit.pool: "a b": must be 1 to 64 of A-Z a-z 0-9 _ . -`}},
		{"too many requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000000001}\n",
			[]string{`descriptors[0].rate_limit.requests_per_unit: "1000000001": must be from 0 to 1000000000`}},
		{"burst too large", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket, burst: 1000000001}\n",
			[]string{`descriptors[0].rate_limit.burst: "1000000001": must be from 1 to 1000000000`}},
		{"local zone", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, algorithm: quota, time_zone: Local}\n",
			[]string{`descriptors[0].rate_limit.time_zone: "Local": is this machine's zone, which may differ between replicas: name the zone, such as Europe/Berlin, or UTC`}},
		{"unknown zone", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, algorithm: quota, time_zone: Mars/Olympus}\n",
			[]string{`descriptors[0].rate_limit.time_zone: "Mars/Olympus": unknown time zone: use an IANA name such as Europe/Berlin or America/New_York, or UTC`}},
		{"lease fields without enabled", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, lease: {shards: 2}}\n",
			[]string{`descriptors[0].rate_limit.lease.enabled: "false": lease fields are set, but enabled is false: set enabled: true, or remove the block`}},
		{"lease of a sliding window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window, lease: {enabled: true}}\n",
			[]string{`descriptors[0].rate_limit.lease.enabled: "true": leases serve token_bucket and fixed_window only, not sliding_window`}},
		{"lease of a quota", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 10, algorithm: quota, lease: {enabled: true}}\n",
			[]string{`descriptors[0].rate_limit.lease.enabled: "true": leases serve token_bucket and fixed_window only, not quota`}},
		{"lease negative ttl", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, lease: {enabled: true, ttl: -60s}}\n",
			[]string{`descriptors[0].rate_limit.lease.ttl: "-1m": must be positive`}},
		{"lease ttl bad", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, lease: {enabled: true, ttl: soon}}\n",
			[]string{`descriptors[0].rate_limit.lease.ttl: "soon": must be a duration such as 500ms, 1m or 2h`}},
		{"lease shards over the limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, lease: {enabled: true, shards: 4}}\n",
			[]string{`descriptors[0].rate_limit.lease.shards: "4": must be at most the limit (3): every shard holds at least one request of it`}},
		{"lease without room", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 2, lease: {enabled: true, ttl: 1h0m0s}}\n",
			[]string{`descriptors[0].rate_limit.lease.ttl: "1h": must be at most 100ms (the smallest shard's burst time less one interval)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := rlsDir(t, map[string]string{"conf.yaml": tt.content})
			rules, problems, err := Load(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if rules != nil || len(problems) == 0 {
				t.Fatalf("loaded: got rules %v, problems %v", rules, problems)
			}
			text := problemText(problems)
			file := filepath.Join(dir, "conf.yaml")
			for _, w := range tt.want {
				if !strings.Contains(text, file+": "+w) {
					t.Errorf("problems\n%s\ndo not name %q", text, file+": "+w)
				}
			}
		})
	}
}

func TestRLSDuplicateDomainNamesBothFiles(t *testing.T) {
	dir := rlsDir(t, map[string]string{
		"a.yaml":       "domain: d\n",
		"b.yml":        "domain: d\n",
		".hidden":      "not: [yaml",
		".hidden.yaml": "not: [yaml", // as Kubernetes' ..data links to a ConfigMap's files
		"notes.txt":    "not: [yaml",
	})
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, problems, err := Load(dir, Options{})
	want := filepath.Join(dir, "b.yml") + `: domain: "d": also the domain of ` + filepath.Join(dir, "a.yaml") + ": each domain is in one file"
	if err != nil || problemText(problems) != want {
		t.Fatalf("got %v %q, want the one problem %q", err, problemText(problems), want)
	}
}

// TestLoadFolder: a folder that cannot be listed is an error of its own (policy reports it at
// rls.config_dir), and a folder of more files than maxFiles is refused rather than read.
func TestLoadFolder(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Load(filepath.Join(dir, "missing"), Options{}); err == nil || !strings.HasPrefix(err.Error(), "cannot read the folder: ") {
		t.Errorf("missing folder: got %v, want cannot read the folder", err)
	}
	for i := range maxFiles + 1 {
		if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)+".yaml"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want := "holds 1001 configuration files, more than 1000"
	if _, _, err := Load(dir, Options{}); err == nil || err.Error() != want {
		t.Errorf("too many files: got %v, want %q", err, want)
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
		var es problemList
		file := parseFile(&es, "f.yaml", data)
		if file == nil {
			if len(es) == 0 {
				t.Fatal("no file and no error")
			}
			return
		}
		rules := compile(&es, []*ruleFile{file}, Options{})
		if len(es) > 0 {
			return
		}
		d := rules.Domain(file.domain)
		if d == nil {
			t.Fatalf("domain %q not compiled", file.domain)
		}
		e := []Entry{{Key: key, Value: value}}
		var m1, m2 Match
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
