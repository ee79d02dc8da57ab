package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docsOwnedElsewhere are pages whose test names are being rewritten on another branch at the
// time this check was written; each is checked once it is listed here no more.
var docsOwnedElsewhere = map[string]bool{
	"docs/benchmarks.md": true, // rewritten with the benchmarks
	"docs/simulator.md":  true, // rewritten with the simulator
}

// goTestName is a Go test, benchmark or fuzz target's name.
var goTestName = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz)[A-Z][A-Za-z0-9_]*`)

// testNameUses returns the Go test names on one Markdown line: those in prose (a name outside a
// command: a reader is told what is checked, not what the check is called) and those in a
// command (a line of a fenced block, or a code span that starts with "go "), which must exist.
func testNameUses(line string, inFence bool) (prose, command []string) {
	if inFence {
		return nil, goTestName.FindAllString(line, -1)
	}
	rest := inlineCode.ReplaceAllStringFunc(line, func(span string) string {
		if strings.HasPrefix(span, "`go ") {
			command = append(command, goTestName.FindAllString(span, -1)...)
			return ""
		}
		return span
	})
	return goTestName.FindAllString(rest, -1), command
}

func TestTestNameUses(t *testing.T) {
	for _, c := range []struct {
		line          string
		fence         bool
		prose, inCode []string
	}{
		{"`TestX` checks that", false, []string{"TestX"}, nil},
		{"as TestDocs does, and (`BenchmarkY` in internal/z)", false, []string{"TestDocs", "BenchmarkY"}, nil},
		{"run `go test -run 'TestHerd' ./ratelimitclient/` to see it", false, nil, []string{"TestHerd"}},
		{"go test -run '^$' -bench BenchmarkCost ./internal/dynamo/", true, nil, []string{"BenchmarkCost"}},
		{"Testing, FUZZTIME, Testimony, `make test`, Test and Fuzz alone", false, nil, nil},
	} {
		prose, inCode := testNameUses(c.line, c.fence)
		if !slices.Equal(prose, c.prose) || !slices.Equal(inCode, c.inCode) {
			t.Errorf("testNameUses(%q, %v) = %q, %q; want %q, %q", c.line, c.fence, prose, inCode, c.prose, c.inCode)
		}
	}
}

// TestDocsNameNoTestInProse: README.md and docs/*.md say what the tests check, never what a
// test is called; a command that runs a test by name (in a code block, or inline as `go ...`)
// names one that some _test.go defines.
func TestDocsNameNoTestInProse(t *testing.T) {
	funcs := testFuncs(t)
	var commands int
	for _, d := range loadDocs(t) {
		if docsOwnedElsewhere[d.path] {
			t.Logf("%s: not checked (docsOwnedElsewhere)", d.path)
			continue
		}
		inFence := false
		for i, l := range d.lines {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				inFence = !inFence
				continue
			}
			prose, command := testNameUses(l, inFence)
			for _, name := range prose {
				t.Errorf("%s:%d: the prose names the test %s: say what it checks instead", d.path, i+1, name)
			}
			for _, name := range command {
				commands++
				if !slices.Contains(funcs, name) {
					t.Errorf("%s:%d: a command runs %s, which no _test.go defines", d.path, i+1, name)
				}
			}
		}
	}
	t.Logf("%d test names in commands, all defined", commands)
}

var testFunc = regexp.MustCompile(`^func ((?:Test|Benchmark|Fuzz)\w+)\(`)

// testFuncs returns the name of every test, benchmark and fuzz target in the repository.
func testFuncs(t *testing.T) []string {
	t.Helper()
	var funcs []string
	err := filepath.WalkDir(repoRoot, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (e.Name() == ".git" || e.Name() == ".tools" || e.Name() == ".cache" || e.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			if m := testFunc.FindStringSubmatch(s.Text()); m != nil {
				funcs = append(funcs, m[1])
			}
		}
		return s.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(funcs) < 100 {
		t.Fatalf("found %d test functions in the tree, want hundreds: the walk broke", len(funcs))
	}
	return funcs
}
