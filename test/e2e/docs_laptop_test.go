package e2e

// docs/dynamodb.md's laptop recipe, followed as written against DynamoDB Local: its
// configuration, with the credentials and region its export line sets, starts a gateway whose
// decisions DynamoDB makes (not store.on_error); and a table that does not exist is named at
// startup, with its region.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// laptopRecipe returns the YAML configuration and the `export` line of docs/dynamodb.md's
// laptop section.
func laptopRecipe(t *testing.T) (config string, env []string) {
	t.Helper()
	for _, s := range []docSession{{"docs/dynamodb.md", []string{laptopSection}}} {
		for _, st := range sessionSteps(t, s) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(st.cmd), "export "); ok {
				env = append(env, shellWords(rest)...)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs/dynamodb.md"))
	if err != nil {
		t.Fatal(err)
	}
	d := docFile{path: "docs/dynamodb.md", lines: strings.Split(string(b), "\n")}
	in := false
	for i, l := range d.lines {
		if strings.HasPrefix(l, "## ") {
			in = l == "## "+laptopSection
		}
		if in && strings.TrimSpace(l) == "```yaml" {
			for _, blk := range fencedBlocks(d) {
				if blk.line == i+1 {
					config = strings.Join(blk.lines, "\n")
				}
			}
		}
	}
	if config == "" || len(env) == 0 {
		t.Fatalf("docs/dynamodb.md: section %q has no yaml block or no export line", laptopSection)
	}
	return config, env
}

const laptopSection = "On a laptop: DynamoDB Local"

var recipeEndpoint = regexp.MustCompile(`(?m)^(\s*endpoint:\s*)\S+`)

// TestDynamoDBLaptopRecipe runs the recipe's configuration (its endpoint replaced by the test's
// DynamoDB Local, listen addresses by free ports) with only the recipe's AWS environment, and
// checks that DynamoDB decides: rate-limit headers, a 429 at the burst, no store error.
func TestDynamoDBLaptopRecipe(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	config, env := laptopRecipe(t)
	config = recipeEndpoint.ReplaceAllString(config, "${1}"+endpoint)
	config = strings.Replace(config, "table: ratelimit-local", "table: laptop-"+randomSuffix(), 1)
	up := newUpstream(t, nil)
	ports := freePorts(t, 2)
	path := filepath.Join(t.TempDir(), "local.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	// The recipe's environment over one that names nothing else (no profile, no files).
	g := startServe(t, []string{"serve", "--config", path}, append(awsEnv(), append(env,
		"RATELIMIT_LISTEN="+ports[0], "RATELIMIT_ADMIN_LISTEN="+ports[1], "RATELIMIT_UPSTREAM="+up.URL)...), nil)
	admin, proxy := "http://"+ports[1], "http://"+ports[0]
	g.waitReady(t, admin, time.Minute)
	limited := false
	for i := range 30 {
		resp, _ := get(t, proxy+"/")
		if resp.Header.Get("X-RateLimit-Limit") == "" {
			t.Fatalf("request %d: %d without rate-limit headers: the store did not decide", i, resp.StatusCode)
		}
		limited = limited || resp.StatusCode == 429
	}
	if !limited {
		t.Error("30 requests at once, a burst of 10: none limited")
	}
	if n := metric(t, admin, `ratelimit_store_errors_total{backend="dynamodb",reason="timeout"}`) +
		metric(t, admin, `ratelimit_store_errors_total{backend="dynamodb",reason="error"}`); n != 0 {
		t.Errorf("%v store errors: the recipe's store.timeout is too short for DynamoDB Local", n)
	}
}

// TestDynamoDBMissingTableNamed: a table that does not exist (create_table false) is named at
// startup with its region, rather than "did not answer".
func TestDynamoDBMissingTableNamed(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "missing-" + randomSuffix()
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, dynamoStore(table, endpoint, false, "1s", "")+ipPolicy, awsEnv()...)
	want := "table " + table + " not found in region "
	eventually(t, "the startup log naming the table", func() bool { return strings.Contains(g.logs.String(), want) })
	if strings.Contains(g.logs.String(), "did not answer") {
		t.Errorf("the log says the store did not answer; it answered that the table does not exist:\n%s", g.logs.String())
	}
}
