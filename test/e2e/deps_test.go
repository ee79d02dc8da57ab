package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// depsPath is a PATH with only the tools scripts/deps.sh and scripts/test.sh use besides the
// packages they look for, plus fake go, apt-get and id commands: so every package the tests
// use is missing, go test runs nothing, and an apt-get call is recorded instead of made.
func depsPath(t *testing.T) (path, aptLog string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"bash", "sh", "cat", "cut", "tr", "grep", "awk", "mkdir", "dirname", "head", "wc", "xargs", "env", "printf"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	aptLog = filepath.Join(dir, "apt-get.log")
	for name, script := range map[string]string{
		"go":      "exit 0",
		"id":      "echo 0",
		"apt-get": `echo "$*" >>` + aptLog,
		"python3": "exit 1",
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin, aptLog
}

// scriptsCopy copies the named scripts into a scripts/ folder of a fresh directory and returns
// that folder. test.sh writes its log and the apt log under its own checkout's .cache, which, in
// the repository itself, is where the outer `make test` running this test keeps its log: the
// inner run truncated it, and the outer summary then listed no package at all.
func scriptsCopy(t *testing.T, names ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "scripts")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(repoRoot, "scripts", n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// cacheFiles describes the repository's .cache logs that test.sh and deps.sh write (size and
// modification time), to show that the inner run left them alone.
func cacheFiles(t *testing.T) string {
	t.Helper()
	var d strings.Builder
	for _, n := range []string{"test.log", "apt.log", "fuzz.log"} {
		if fi, err := os.Stat(filepath.Join(repoRoot, ".cache", n)); err == nil {
			fmt.Fprintf(&d, "%s %d %s; ", n, fi.Size(), fi.ModTime().Format(time.RFC3339Nano))
		}
	}
	return d.String()
}

// TestDepsNamedNotInstalled: `make test` (scripts/test.sh) run as root on a machine without the
// packages names each one and what needs it, and installs nothing unless asked (CI=true or
// RATELIMIT_INSTALL_DEPS=1), when it installs exactly the missing ones.
func TestDepsNamedNotInstalled(t *testing.T) {
	path, aptLog := depsPath(t)
	script := scriptsCopy(t, "test.sh", "deps.sh")
	before := cacheFiles(t)
	defer func() {
		if after := cacheFiles(t); after != before {
			t.Errorf("the inner make test wrote the outer run's .cache:\nbefore %s\nafter  %s", before, after)
		}
	}()
	run := func(env ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(script, "test.sh"))
		cmd.Env = append([]string{"PATH=" + path, "HOME=" + t.TempDir(), "DYNAMODB_ENDPOINT=http://127.0.0.1:1"}, env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("scripts/test.sh %v: %v\n%s", env, err, out)
		}
		return string(out)
	}
	out := run()
	for _, pkg := range []string{"curl", "default-jre-headless", "npm", "chromium"} {
		if !strings.Contains(out, "  "+pkg+" ") {
			t.Errorf("make test does not name the missing %s:\n%s", pkg, out)
		}
	}
	if !strings.Contains(out, "make deps") {
		t.Errorf("make test does not say how to install them:\n%s", out)
	}
	if b, err := os.ReadFile(aptLog); err == nil {
		t.Errorf("make test ran apt-get unasked: %s", b)
	}
	for _, asked := range []string{"CI=true", "RATELIMIT_INSTALL_DEPS=1"} {
		os.Remove(aptLog)
		run(asked)
		b, err := os.ReadFile(aptLog)
		if err != nil {
			t.Errorf("with %s make test installed nothing", asked)
			continue
		}
		if !strings.Contains(string(b), "install -y -qq curl default-jre-headless npm") {
			t.Errorf("with %s apt-get ran %q", asked, b)
		}
	}
}
