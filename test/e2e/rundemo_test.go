package e2e

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRunDemoAdminWrites runs scripts/run-demo.sh (what `make run` starts) on free ports, then
// the admin write it prints, as printed: the demo enables writes with a demo token. Without the
// token the CLI's 401 names the variable it read and says it was empty.
func TestRunDemoAdminWrites(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"bin", "scripts"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", "demo-upstream"), "../../cmd/demo-upstream").CombinedOutput(); err != nil {
		t.Fatalf("go build demo-upstream: %v\n%s", err, out)
	}
	if err := os.Symlink(binary, filepath.Join(dir, "bin", "ratelimit-proxy")); err != nil {
		t.Fatal(err)
	}
	configs, err := filepath.Abs(filepath.Join(repoRoot, "configs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(configs, filepath.Join(dir, "configs")); err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "run-demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "scripts", "run-demo.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}

	ports := freePorts(t, 3)
	cmd := exec.Command(filepath.Join(dir, "scripts", "run-demo.sh"))
	cmd.Env = append(os.Environ(), "DEMO_LISTEN="+ports[0], "DEMO_ADMIN_LISTEN="+ports[1], "DEMO_UPSTREAM_LISTEN="+ports[2], "GORACE=atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
	})
	var write string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.Contains(l, "admin reset") {
			write = l
		}
		if l == "Ctrl-C stops both." {
			break
		}
	}
	go func() { // keep the pipe drained
		for sc.Scan() {
		}
	}()
	if write == "" {
		t.Fatal("run-demo.sh prints no admin write to try")
	}
	eventually(t, "the demo gateway is ready", func() bool {
		resp, err := http.Get("http://" + ports[1] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	run := func(line string, env ...string) (string, error) {
		c := exec.Command("bash", "-c", line)
		c.Dir = dir
		c.Env = append(os.Environ(), env...)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	out, err := run(write, "RATELIMIT_ADMIN_TOKEN=")
	if err != nil || !strings.Contains(out, "reset") || !strings.Contains(out, "true") {
		t.Errorf("%s: %v\n%s", write, err, out)
	}
	// The same write without the token the demo printed.
	bare := strings.TrimPrefix(write, "RATELIMIT_ADMIN_TOKEN=demo-admin-token ")
	if bare == write {
		t.Fatalf("the printed write %q does not set RATELIMIT_ADMIN_TOKEN", write)
	}
	out, err = run(bare, "RATELIMIT_ADMIN_TOKEN=")
	if err == nil || !strings.Contains(out, "401") || !strings.Contains(out, "RATELIMIT_ADMIN_TOKEN, which is empty") {
		t.Errorf("without the token: %v\n%s", err, out)
	}
}
