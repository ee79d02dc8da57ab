package e2e

// Sessions the docs ask a reader to paste in order, run in order against the real binary (with
// configs/example.yaml in front of the demo upstream, as `make run` starts them), each shown
// output compared with what the command printed. The README's tour drifted twice (a 429 that
// answered 200 when typed by hand, a replay of an access.log no step made): this keeps it true.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docSession is the commands of the given sections of a page (not of their "### "
// subsections), pasted in order.
type docSession struct {
	page     string
	sections []string // "## " headings
}

// sessionStep is one command of a session with the output shown after it.
type sessionStep struct {
	where, cmd string
	output     []string
}

// sessionSteps returns the commands of sh and console blocks in the page's sections, in order.
func sessionSteps(t *testing.T, s docSession) []sessionStep {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, s.page))
	if err != nil {
		t.Fatal(err)
	}
	d := docFile{path: s.page, lines: strings.Split(string(b), "\n")}
	inSection := func(line int) bool {
		heading := ""
		for i := line - 1; i >= 0; i-- {
			if h, ok := strings.CutPrefix(d.lines[i], "## "); ok {
				heading = h
				break
			}
			if strings.HasPrefix(d.lines[i], "### ") {
				break // a subsection of its own
			}
		}
		for _, want := range s.sections {
			if heading == want {
				return true
			}
		}
		return false
	}
	var steps []sessionStep
	found := map[string]bool{}
	for _, blk := range fencedBlocks(d) {
		if !inSection(blk.line) || (blk.lang != "console" && blk.lang != "sh") {
			continue
		}
		for i, l := range blk.lines {
			where := fmt.Sprintf("%s:%d", d.path, blk.line+1+i)
			switch {
			case blk.lang == "sh" && strings.TrimSpace(l) != "":
				steps = append(steps, sessionStep{where: where, cmd: l})
			case blk.lang == "console" && strings.HasPrefix(l, "$ "):
				steps = append(steps, sessionStep{where: where, cmd: strings.TrimPrefix(l, "$ ")})
			case blk.lang == "console" && len(steps) > 0:
				steps[len(steps)-1].output = append(steps[len(steps)-1].output, l)
			}
		}
		found[blk.lang] = true
	}
	if len(steps) == 0 {
		t.Fatalf("%s: no commands in sections %q", s.page, s.sections)
	}
	return steps
}

// shownLines turns the output a page shows into the lines to look for: a trailing comment
// (two spaces, then #) dropped, a line that starts with one space after a line that ends with a
// comma joined to it (a long JSON line wrapped for reading), "..." (abridged) and blank lines
// skipped.
func shownLines(output []string) []string {
	var out []string
	for _, l := range output {
		l = shownComment.ReplaceAllString(strings.TrimRight(l, " \t"), "")
		switch {
		case l == "" || l == "...":
		case strings.HasPrefix(l, " ") && !strings.HasPrefix(l, "  ") && len(out) > 0 && strings.HasSuffix(out[len(out)-1], ","):
			out[len(out)-1] += l[1:]
		default:
			out = append(out, l)
		}
	}
	return out
}

var (
	shownComment = regexp.MustCompile(`\s{2,}#\s.*$`)
	// Values that differ on every run: the reset instant in epoch seconds, the time until a
	// window's reset (rls check, the RateLimit header's t).
	shownVarying = []*regexp.Regexp{
		regexp.MustCompile(`(?i)^(x-ratelimit-reset: )\d+$`),
		regexp.MustCompile(`(reset in )[0-9.]+[mµn]?s`),
		regexp.MustCompile(`(;t=)\d+`),
	}
	statusCodes = regexp.MustCompile(`^(\d{3} ?)+$`)
)

// masked replaces the values that differ on every run.
func masked(s string) string {
	for _, re := range shownVarying {
		s = re.ReplaceAllString(s, "${1}N")
	}
	return s
}

// matchShown checks that every shown line appears in got, in order. A line of status codes
// (a burst loop) must match in length, begin with at least as many 200s as shown and hold a
// 429 where the page shows one.
func matchShown(shown []string, got string) error {
	lines := strings.Split(strings.ReplaceAll(got, "\r\n", "\n"), "\n")
	i := 0
	for _, want := range shown {
		ok := false
		for ; i < len(lines) && !ok; i++ {
			ok = lineMatches(want, strings.TrimRight(lines[i], " \t"))
		}
		if !ok {
			return fmt.Errorf("the page shows %q, which the output lacks (in that order)", want)
		}
	}
	return nil
}

func lineMatches(want, got string) bool {
	if statusCodes.MatchString(want) && statusCodes.MatchString(got) {
		w, g := strings.Fields(want), strings.Fields(got)
		lead := func(codes []string) int {
			n := 0
			for n < len(codes) && codes[n] == "200" {
				n++
			}
			return n
		}
		return len(w) == len(g) && lead(g) >= lead(w) &&
			(!strings.Contains(want, "429") || strings.Contains(got, "429")) &&
			strings.Trim(strings.ReplaceAll(strings.ReplaceAll(got, "200", ""), "429", ""), " ") == ""
	}
	return masked(want) == masked(got)
}

// TestReadmeTour runs the README's tour and its replay step, and the HTTP/2 example of
// docs/grpc-http2-tls.md, in order, as a reader pastes them: the gateway and the demo upstream
// run as `make run` starts them (only on free ports, which the commands are rewritten to),
// the commands run in a directory that holds bin/ and configs/ as the repository does.
func TestReadmeTour(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"../../cmd/demo-upstream", "../../cmd/ratelimit-replay", "../../scripts/replaylog"} {
		out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	if err := os.Symlink(binary, filepath.Join(bin, "ratelimit-proxy")); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(filepath.Join(repoRoot, "configs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(dir, "configs")); err != nil {
		t.Fatal(err)
	}

	// How each page's reader has the gateway running: `make run`, or the RLS of docs/envoy.md.
	proxy := func(t *testing.T) *strings.Replacer {
		ports := freePorts(t, 3)
		upstream := startDemoUpstream(t, filepath.Join(bin, "demo-upstream"), ports[2])
		g := startServe(t, []string{"serve", "--config", filepath.Join(abs, "example.yaml")}, []string{
			"RATELIMIT_LISTEN=" + ports[0], "RATELIMIT_ADMIN_LISTEN=" + ports[1], "RATELIMIT_UPSTREAM=http://" + upstream,
		}, nil)
		g.waitReady(t, "http://"+ports[1], 30*time.Second)
		return strings.NewReplacer("127.0.0.1:8080", ports[0], "127.0.0.1:9090", ports[1],
			"go run ./scripts/replaylog", "./bin/replaylog")
	}
	rls := func(t *testing.T) *strings.Replacer {
		ports := freePorts(t, 2)
		local := filepath.Join(abs, "..", "deploy", "envoy", "local")
		g := startServe(t, []string{"serve", "--config", filepath.Join(local, "ratelimit-proxy.yaml")}, []string{
			"RATELIMIT_ADMIN_LISTEN=" + ports[0], "RATELIMIT_RLS_LISTEN=" + ports[1], "RATELIMIT_RLS_CONFIG_DIR=" + filepath.Join(local, "rules"),
		}, nil)
		g.waitReady(t, "http://"+ports[0], 30*time.Second)
		return strings.NewReplacer("rls check ", "rls check --addr "+ports[1]+" ")
	}
	for _, s := range []struct {
		docSession
		start func(*testing.T) *strings.Replacer
		skip  *regexp.Regexp // the commands that start what start started
		// pace is the least time between two commands: a person pasting them one by one
		// (the README's burst shows what a bucket refilled since the command before admits).
		pace time.Duration
	}{
		{docSession{"README.md", []string{"A quick tour with curl", "Before you enforce: what if?"}}, proxy, nil, time.Second},
		{docSession{"docs/grpc-http2-tls.md", []string{"HTTP/2 on the listener"}}, proxy, nil, 0},
		{docSession{"docs/envoy.md", []string{"Trying it locally"}}, rls, regexp.MustCompile(`^make |ratelimit-proxy serve `), 0},
	} {
		t.Run(s.page, func(t *testing.T) {
			steps := sessionSteps(t, s.docSession)
			rewrite := s.start(t)
			var last time.Time
			for _, st := range steps {
				if s.skip != nil && s.skip.MatchString(st.cmd) {
					continue
				}
				// A reader's pace, not a wait for anything: nothing here is synchronised by it.
				time.Sleep(time.Until(last.Add(s.pace)))
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", rewrite.Replace(st.cmd))
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
				var stderr strings.Builder
				cmd.Stderr = &stderr // curl's progress meter, when not -s
				out, err := cmd.Output()
				cancel()
				if err != nil {
					t.Fatalf("%s: %s: %v\n%s%s", st.where, st.cmd, err, out, stderr.String())
				}
				if err := matchShown(shownLines(st.output), string(out)); err != nil {
					t.Errorf("%s: %s: %v; it printed:\n%s", st.where, st.cmd, err, out)
				}
				last = time.Now()
			}
			checkTourFilesIgnored(t, dir)
		})
	}
}

// checkTourFilesIgnored: every file the session's commands left in the working directory (the
// repository's root, for a reader) is one the repository's .gitignore ignores.
func checkTourFilesIgnored(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "bin" || e.Name() == "configs" {
			continue // the repository's own
		}
		cmd := exec.Command("git", "check-ignore", "-q", "--no-index", e.Name())
		cmd.Dir = repoRoot
		if err := cmd.Run(); err != nil {
			t.Errorf("the tour leaves %s, which git does not ignore (add it to .gitignore): %v", e.Name(), err)
		}
	}
}

// startDemoUpstream runs the demo upstream on addr until the test ends.
func startDemoUpstream(t *testing.T, path, addr string) string {
	t.Helper()
	cmd := exec.Command(path, "-listen", addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	eventually(t, "the demo upstream listens on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}
