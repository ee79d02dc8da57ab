package e2e

// docs/dynamodb.md's laptop recipe, followed as written against DynamoDB Local: its
// configuration, with the credentials and region its export line sets, starts a gateway whose
// decisions DynamoDB makes (not store.on_error); and a table that does not exist is named at
// startup, with its region.

import (
	"os"
	"os/exec"
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

// TestDynamoDBLaptopRecipe follows the recipe as written on a DynamoDB Local of its own, fresh
// (a cold JVM, as a reader's first try meets it): the project's script starts it, the recipe's
// configuration gets its URL (and free ports for 8081, 9091 and the upstream's 3000), the
// commands run in order with the recipe's AWS environment alone, and each shown output is what
// the command printed: the burst ends in 429s and the store counts no error.
func TestDynamoDBLaptopRecipe(t *testing.T) {
	if _, err := exec.LookPath("java"); err != nil {
		t.Skip("java is not installed: no DynamoDB Local of its own (make deps)")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed (make deps)")
	}
	state := t.TempDir()
	script := filepath.Join(repoRoot, "scripts", "dynamodb-local.sh")
	start := exec.Command(script, "start")
	start.Env = append(os.Environ(), "DYNAMODB_LOCAL_STATE_DIR="+state)
	out, err := start.Output()
	if err != nil {
		t.Fatalf("scripts/dynamodb-local.sh start: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		stop := exec.Command(script, "stop")
		stop.Env = append(os.Environ(), "DYNAMODB_LOCAL_STATE_DIR="+state)
		_ = stop.Run()
	})
	endpoint := strings.TrimSpace(string(out))

	config, env := laptopRecipe(t)
	up := newUpstream(t, nil)
	ports := freePorts(t, 2)
	upHost := strings.TrimPrefix(up.URL, "http://")
	rewrite := strings.NewReplacer("127.0.0.1:8081", ports[0], "127.0.0.1:9091", ports[1], "127.0.0.1:3000", upHost)
	config = rewrite.Replace(recipeEndpoint.ReplaceAllString(config, "${1}"+endpoint))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "local.yaml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	// The recipe's environment over one that names nothing else (no profile, no files).
	procEnv := append(awsEnv(), env...)
	ran := 0
	for _, st := range sessionSteps(t, docSession{"docs/dynamodb.md", []string{laptopSection}}) {
		cmd := strings.TrimSpace(st.cmd)
		words := strings.Fields(cmd)
		switch {
		case strings.HasPrefix(cmd, "export "), strings.HasPrefix(cmd, "scripts/dynamodb-local.sh start"), strings.HasPrefix(cmd, "kill %1"):
			continue // done above, or by the cleanup
		case len(words) > 1 && words[0] == "./bin/ratelimit-proxy" && words[1] == "serve":
			args := strings.Fields(strings.TrimSuffix(strings.TrimPrefix(cmd, "./bin/ratelimit-proxy "), "&"))
			for i, a := range args {
				if a == "local.yaml" {
					args[i] = filepath.Join(dir, a)
				}
			}
			g := startServe(t, args, procEnv, nil)
			g.waitReady(t, "http://"+ports[1], time.Minute)
		case len(words) > 0 && words[0] == "./bin/ratelimit-proxy":
			c := exec.Command(binary, strings.Fields(strings.TrimPrefix(cmd, "./bin/ratelimit-proxy "))...)
			c.Dir, c.Env = dir, append(procEnv, "GORACE=atexit_sleep_ms=0")
			if out, err := c.CombinedOutput(); err != nil {
				t.Fatalf("%s: %s: %v\n%s", st.where, cmd, err, out)
			}
		default:
			c := exec.Command("bash", "-o", "pipefail", "-c", rewrite.Replace(cmd))
			c.Dir = dir
			out, err := c.Output()
			if err != nil {
				t.Fatalf("%s: %s: %v\n%s", st.where, cmd, err, out)
			}
			if err := matchShown(shownLines(st.output), string(out)); err != nil {
				t.Errorf("%s: %s: %v; it printed:\n%s", st.where, cmd, err, out)
			}
		}
		ran++
	}
	if ran < 4 {
		t.Errorf("ran %d of the recipe's commands, want table create, serve and the two checks", ran)
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
