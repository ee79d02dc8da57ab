package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The one-way flow (docs/development.md): each internal package imports only the internal
// packages listed here. A new edge is a design decision: add it here on purpose, never to make
// a build pass. In particular the two front ends (proxy, rls) never import each other, and what
// both answer with (answer), the verdict they share (verdict) and everything below them never
// import a front end.
var allowedImports = map[string][]string{
	"internal/answer":                 {"internal/bucket", "internal/histbuckets"},
	"internal/bucket":                 {},
	"internal/bucket/buckettest":      {"internal/bucket"},
	"internal/configyaml":             {},
	"internal/memstore":               {"internal/bucket"},
	"internal/limitterms":             {"internal/bucket"},
	"internal/envoyrules":             {"internal/bucket", "internal/configyaml", "internal/limitterms"},
	"internal/policy":                 {"internal/answer", "internal/bucket", "internal/configyaml", "internal/envoyrules", "internal/limitterms"},
	"internal/protect":                {"internal/histbuckets", "internal/policy"},
	"internal/replay":                 {"internal/bucket", "internal/memstore", "internal/policy"},
	"internal/console":                {"internal/answer", "internal/bucket", "internal/envoyrules", "internal/policy"},
	"internal/verdict":                {"internal/bucket"},
	"internal/proxy":                  {"internal/answer", "internal/bucket", "internal/histbuckets", "internal/policy", "internal/protect", "internal/verdict"},
	"internal/rls":                    {"internal/answer", "internal/bucket", "internal/envoyrules", "internal/histbuckets", "internal/verdict"},
	"internal/dynamo":                 {"internal/bucket", "internal/dynamo/lease", "internal/dynamo/schema", "internal/histbuckets"},
	"internal/dynamo/lease":           {"internal/bucket", "internal/dynamo/schema"},
	"internal/dynamo/schema":          {},
	"internal/fallback":               {"internal/bucket", "internal/memstore"},
	"internal/configschema":           {"internal/limitterms", "internal/policy"},
	"internal/configschema/schemagen": {"internal/configschema"},
	"internal/clockref":               {},
	"internal/histbuckets":            {},
	"internal/redisstore":             {"internal/bucket"},
	"internal/telemetry":              {"internal/bucket", "internal/envoyrules", "internal/limitterms", "internal/policy"},
	"internal/server": {"internal/bucket", "internal/clockref", "internal/console", "internal/dynamo",
		"internal/envoyrules", "internal/fallback", "internal/memstore", "internal/policy", "internal/protect", "internal/proxy", "internal/redisstore", "internal/rls",
		"internal/telemetry"},
	"internal/cli": {"internal/console", "internal/policy", "internal/rls", "internal/server"},

	// Test and benchmark tooling: never linked into the shipped binary (TestShippedBinaryHoldsNoTooling).
	"internal/testkit/ddbrelay":    {},
	"internal/testkit/dynamolocal": {"internal/dynamo"},
	"internal/testkit/redislocal":  {},
	"internal/testkit/buckettest":  {"internal/bucket"},
	"internal/testkit/exactcheck":  {},
	"internal/testkit/exactmutant": {"internal/bucket", "internal/dynamo"},
	"internal/testkit/faultnet":    {},
	"internal/testkit/harness":     {},
	"internal/testkit/otlpsink":    {},
	"internal/testkit/sim": {"internal/bucket", "internal/dynamo", "internal/dynamo/schema", "internal/memstore", "internal/policy",
		"internal/redisstore", "internal/testkit/exactcheck", "internal/testkit/exactmutant", "internal/testkit/simddb", "internal/testkit/simredis"},
	"internal/testkit/simddb":   {},
	"internal/testkit/simredis": {},
	"internal/testkit/gateway":  {"internal/bucket", "internal/cli", "internal/dynamo", "internal/server", "internal/testkit/exactmutant"},
}

// tooling is where the test and benchmark tooling lives: nothing below it ships.
const tooling = "github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/"

// TestShippedBinaryHoldsNoTooling: the gateway's dependencies hold no package of
// internal/testkit, built with no tags and with every build tag the tree uses (a tag must not
// pull tooling in either); the test gateway, which links the mutants, is the control.
func TestShippedBinaryHoldsNoTooling(t *testing.T) {
	tags := []string{""}
	out, err := exec.Command("git", "grep", "-h", "^//go:build", "--", "../../*.go").Output()
	if err != nil && len(out) > 0 {
		t.Fatalf("git grep: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.FieldsFunc(strings.TrimPrefix(line, "//go:build"), func(r rune) bool {
			return !(r == '_' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		}) {
			if !slices.Contains(tags, f) {
				tags = append(tags, f)
			}
		}
	}
	for _, c := range []struct {
		pkg, tags string
		want      bool
	}{{"../../internal/testkit/gateway", "", true}} {
		if got := linksTooling(t, c.pkg, c.tags); got != c.want {
			t.Fatalf("control: %s links internal/testkit = %t, want %t", c.pkg, got, c.want)
		}
	}
	for _, tag := range tags {
		if linksTooling(t, ".", tag) {
			t.Errorf("the shipped binary built with tags %q links a package of internal/testkit", tag)
		}
	}
}

// linksTooling reports whether pkg, built with tags, depends on a package of internal/testkit.
func linksTooling(t *testing.T, pkg, tags string) bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-tags", tags, pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps -tags %q %s: %v", tags, pkg, err)
	}
	return slices.ContainsFunc(strings.Fields(string(out)), func(d string) bool { return strings.HasPrefix(d, tooling) })
}

func TestLayering(t *testing.T) {
	const module = "github.com/ratelimit-proxy/ratelimit-proxy/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "../../internal/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		allowed, known := allowedImports[pkg]
		if !known {
			t.Errorf("%s is not in allowedImports: place it in the layering on purpose", pkg)
			continue
		}
		seen++
		for _, imp := range fields[1:] {
			if dep, ok := strings.CutPrefix(imp, module); ok && strings.HasPrefix(dep, "internal/") && !slices.Contains(allowed, dep) {
				t.Errorf("%s imports %s, which the layering does not allow", pkg, dep)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("go list listed %d known packages: the check checks nothing", seen)
	}
}

// TestGatewayLinksNoPlotting: the gateway runs beside every service, so the offline replay's
// plotting, PDF and font stack lives in ratelimit-replay alone. The replay binary, which does
// link it, is the control that the check can fail.
func TestGatewayLinksNoPlotting(t *testing.T) {
	heavy := []string{"gonum.org/", "codeberg.org/go-fonts/", "github.com/go-pdf/", "golang.org/x/image/font", "git.sr.ht/~sbinet/gg"}
	for _, c := range []struct {
		pkg  string
		want bool
	}{{".", false}, {"../ratelimit-replay", true}} {
		out, err := exec.Command("go", "list", "-deps", c.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", c.pkg, err)
		}
		var found []string
		for _, dep := range strings.Fields(string(out)) {
			if slices.ContainsFunc(heavy, func(p string) bool { return strings.HasPrefix(dep, p) }) {
				found = append(found, dep)
			}
		}
		if got := len(found) > 0; got != c.want {
			t.Errorf("%s links plotting packages = %t (%d: %.3v), want %t", c.pkg, got, len(found), found, c.want)
		}
	}
}

// TestPackageTableMatchesTree: docs/development.md's package table names every package of
// internal/ and cmd/, and nothing that is gone, so that the map a new maintainer reads first
// cannot drift from the tree.
func TestPackageTableMatchesTree(t *testing.T) {
	const module = "github.com/ratelimit-proxy/ratelimit-proxy/"
	out, err := exec.Command("go", "list", "../../internal/...", "../../cmd/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	doc, err := os.ReadFile("../../docs/development.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			if name, _, ok := strings.Cut(rest, "` |"); ok && (strings.HasPrefix(name, "internal/") || strings.HasPrefix(name, "cmd/")) {
				rows[name] = true
			}
		}
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 10 {
		t.Fatalf("go list listed %d packages: the check checks nothing", len(pkgs))
	}
	for _, p := range pkgs {
		p = strings.TrimPrefix(p, module)
		if !rows[p] {
			t.Errorf("docs/development.md's package table has no row for %s", p)
		}
		delete(rows, p)
	}
	for p := range rows {
		t.Errorf("docs/development.md's package table names %s, which is not in the tree", p)
	}
}
