package policy

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/eight/mistakes.golden")

// TestEveryMistakeInOneRun: a file with eight different mistakes (an unknown field, a value
// of the wrong type, a bad duration, a negative rate, an unknown algorithm, a duplicate
// policy name, a bad store.on_error, a bad CIDR) gets all eight reported by one Check, each
// at FILE:LINE:COL, in file order. Before this check existed, validate printed three of them
// (the unknown field and the two type errors hid the rest; testdata/eight/before.txt).
func TestEveryMistakeInOneRun(t *testing.T) {
	path := filepath.Join("testdata", "eight", "mistakes.yaml")
	_, _, err := Check(path, LoadOptions{Getenv: noEnv}, CompileOptions{Getenv: noEnv})
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("got %v, want Errors", err)
	}
	var out bytes.Buffer
	WriteInvalid(&out, path, err)
	golden := filepath.Join("testdata", "eight", "mistakes.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	// The golden file itself is held to the promise: eight lines, each placed and in order.
	lines := strings.Split(strings.TrimSuffix(string(want), "\n"), "\n")[1:]
	if len(lines) != 8 {
		t.Fatalf("got %d problems, want 8", len(lines))
	}
	placed := regexp.MustCompile(`^  ` + regexp.QuoteMeta(path) + `:(\d+):(\d+): `)
	for _, l := range lines {
		if !placed.MatchString(l) {
			t.Errorf("%q is not placed at FILE:LINE:COL", l)
		}
	}
	for i, want := range []string{"trusted_proxies[0]", "store.on_error", "store.timeout", "policies[0].rate",
		"policies[1].algorithm", "policies[2].name", "policies[2].limit", "policies[2].methds"} {
		if !strings.Contains(lines[i], ": "+want+": ") {
			t.Errorf("problem %d: got %q, want one about %s", i+1, lines[i], want)
		}
	}
	for _, hint := range []string{`(did you mean "leaky_bucket"?)`, `(did you mean "match.methods"?)`} {
		if !strings.Contains(out.String(), hint) {
			t.Errorf("no %s in the report", hint)
		}
	}
}

// TestCheckReportsUndecodedFieldOnce: a field whose value did not decode is not reported again
// by validation (as missing, or as its default).
func TestCheckReportsUndecodedFieldOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "upstream: http://x\nstore: memory\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: lots, window: 1m}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := Check(path, LoadOptions{Getenv: noEnv}, CompileOptions{Getenv: noEnv})
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("got %v, want Errors", err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Text())
	}
	want := []string{
		path + `:2:8: store: "memory": must be a mapping`,
		path + `:4:56: policies[0].limit: "lots": must be an integer`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
