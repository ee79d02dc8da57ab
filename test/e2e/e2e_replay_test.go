package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// replayReport is the part of `replay --json` these tests read.
type replayReport struct {
	Lines, Requests, Unparseable, Admitted, Limited int64
	Errors                                          []struct {
		File  string
		Line  int64
		Error string
	}
	Policies []struct {
		Name                                      string
		Matched, Admitted, Limited, ShadowLimited int64
		TopLimitedKeys                            []struct{ Key string } `json:"top_limited_keys"`
	}
}

// The replay binary (cmd/ratelimit-replay), built once on first use. Without -race: the
// replay's own packages run their tests with it, and this build links the plotting stack.
var replayBuild = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "ratelimit-replay-e2e")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ratelimit-replay")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ratelimit-replay").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ../ratelimit-replay: %w\n%s", err, out)
	}
	return bin, nil
})

// runReplay runs ratelimit-replay with stdin and returns its exit code and output.
func runReplay(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	bin, err := replayBuild()
	if err != nil {
		t.Fatal(err)
	}
	return runBinary(t, func(cmd *exec.Cmd) {
		cmd.Path, cmd.Args[0] = bin, bin
		cmd.Dir = repoRoot
		cmd.Stdin = strings.NewReader(stdin)
	}, args...)
}

func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "access.log")
	var log strings.Builder
	// 40 requests of one key in one second, spread at k/40 s: per-key (10/s, burst 20) admits
	// the first 26, then one every 4 (+0.4 s refills a token): requests 28, 32 and 36.
	for range 40 {
		log.WriteString(`203.0.113.7 - - [24/Nov/2026:09:00:00 +0000] "GET /api/search?q=1 HTTP/1.1" 200 5 "-" "t" "key-scraper"` + "\n")
	}
	log.WriteString("not a log line\n")
	if err := os.WriteFile(logPath, []byte(log.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	plot := filepath.Join(dir, "out.png")
	code, out, errs := runReplay(t, "", "--config", "configs/replay-demo.yaml", "--key-field", "api_key",
		"--json", "--plot", plot, logPath)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	var rep replayReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if rep.Lines != 41 || rep.Requests != 40 || rep.Unparseable != 1 || rep.Limited != 11 ||
		len(rep.Errors) != 1 || rep.Errors[0].Line != 41 {
		t.Errorf("report = %+v; want 41 lines, 40 requests, 11 limited, line 41 unparseable", rep)
	}
	if p := rep.Policies[1]; p.Name != "per-key" || p.Limited != 11 || len(p.TopLimitedKeys) != 1 ||
		!strings.HasPrefix(p.TopLimitedKeys[0].Key, "api_key:") || strings.Contains(out, "key-scraper") {
		t.Errorf("per-key = %+v; want 11 limited, one pseudonymous top key, no raw key in the output", p)
	}
	png, err := os.ReadFile(plot)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("--plot wrote no PNG (%v)", err)
	}

	// stdin, text output.
	code, out, errs = runReplay(t, log.String(), "--config", "configs/replay-demo.yaml", "--key-field", "api_key")
	if code != 0 || !strings.Contains(out, "41 lines: 40 requests, 1 unparseable") || !strings.Contains(out, "stdin:41:") {
		t.Errorf("stdin: exit %d\n%s%s", code, out, errs)
	}

	for _, bad := range [][]string{
		{"--format", "xml"}, {"--plot", filepath.Join(dir, "x.gif")}, {"--key-field", "cookie"},
		{"--format", "alb", "--key-field", "api_key"}, {filepath.Join(dir, "missing.log")},
	} {
		args := append([]string{"--config", "configs/replay-demo.yaml"}, bad...)
		if code, out, errs := runReplay(t, "", args...); code != 1 || errs == "" {
			t.Errorf("replay %v: exit %d, stderr %q, stdout %q; want exit 1 and a message", bad, code, errs, out)
		}
	}
}

// TestReplayOfTheGatewaysLog replays the access log a real gateway wrote and gets its decisions.
func TestReplayOfTheGatewaysLog(t *testing.T) {
	up := newUpstream(t, nil)
	const policies = `log: {access: true}
policies:
  - {name: per-key, key: api_key, algorithm: fixed_window, limit: 2, window: 1h}
`
	g := startGateway(t, up.URL, policies)
	for i := range 5 {
		get(t, g.proxy+"/x", "X-Api-Key", "sk-e2e-"+string(rune('a'+i%2)))
	}
	eventually(t, "five access lines", func() bool { return strings.Count(g.logs.String(), `"logger":"access"`) == 5 })

	cfg := filepath.Join(t.TempDir(), "replay.yaml")
	if err := os.WriteFile(cfg, []byte("upstream: http://127.0.0.1:1\n"+policies), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runReplay(t, g.logs.String(), "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	var rep replayReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	// key a: 3 requests (1 limited), key b: 2 — as the gateway decided.
	if rep.Requests != 5 || rep.Unparseable != 0 || rep.Admitted != 4 || rep.Limited != 1 {
		t.Errorf("replay of the gateway's log = %+v; want 5 requests, 4 admitted, 1 limited", rep)
	}
	if n := strings.Count(g.logs.String(), `"decision":"limited"`); n != 1 {
		t.Errorf("the gateway limited %d requests, want 1", n)
	}
}
