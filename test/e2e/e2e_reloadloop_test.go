package e2e

// End-to-end test of the config watcher's event filter: a file that changes beside the config
// (here the gateway's own log, at debug level) must not wake it.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReloadNoLoopOnLogFileBesideConfig runs the gateway with debug logging written to a file in
// the config's own folder, as `serve > /etc/gw/gateway.log` does. Each line the watcher logs is
// a change in that folder: a watcher that reacts to every file there logs about each of its own
// lines, for ever (about 10 lines a second). One change of the config must give one reload and
// then silence.
func TestReloadNoLoopOnLogFileBesideConfig(t *testing.T) {
	up := newUpstream(t, nil)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	logPath := filepath.Join(dir, "gateway.log")
	ports := freePorts(t, 2)
	proxyURL, adminURL := "http://"+ports[0], "http://"+ports[1]
	write := func(burst int) {
		t.Helper()
		rest := fmt.Sprintf("log: {level: debug}\npolicies:\n  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 100/s, burst: %d}\n", burst)
		if err := os.WriteFile(cfgPath, []byte(config(ports[0], ports[1], up.URL, rest)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(5)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	startProcess(t, logFile, adminURL, "serve", "--config", cfgPath)
	readLog := func() string {
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log (last 4 KiB):\n%s", tail(readLog(), 4096))
		}
	})
	limitOf := func() string {
		resp, _ := get(t, proxyURL+"/")
		return resp.Header.Get("X-RateLimit-Limit")
	}
	if got := limitOf(); got != "5" {
		t.Fatalf("X-RateLimit-Limit before the change got %q, want 5", got)
	}

	write(7) // one change
	eventually(t, "the change applied", func() bool { return limitOf() == "7" })
	eventually(t, "the reload logged", func() bool { return strings.Count(readLog(), `"config reloaded"`) == 1 })

	// The watcher's lines (those naming the config's path) after the reload: the loop writes
	// one every debounce (100 ms), and each is the event for the next.
	watcherLines := func() int { return strings.Count(readLog(), `"path":"`+cfgPath+`"`) }
	after := watcherLines()
	const window = 2 * time.Second // 20 debounces: the loop would log about 20 lines
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		if n := watcherLines() - after; n > 0 {
			t.Fatalf("the watcher logged %d more lines within %v after a single config change, with nothing else changing: it reacts to its own log file", n, window)
		}
		time.Sleep(50 * time.Millisecond) // observing a process for a bounded window
	}
	if n := strings.Count(readLog(), `"config reloaded"`); n != 1 {
		t.Errorf("config reloads logged got %d, want 1", n)
	}
	if got := metric(t, adminURL, `ratelimit_config_reloads_total{result="success"}`); got != 1 {
		t.Errorf(`ratelimit_config_reloads_total{result="success"} got %v, want 1`, got)
	}

	// The config is still watched: a second change applies.
	write(9)
	eventually(t, "a second change applied", func() bool { return limitOf() == "9" })
}

// startProcess starts the binary with args, its output to out, and waits until admin's /readyz
// answers 200. The process is killed when the test ends.
func startProcess(t *testing.T, out *os.File, admin string, args ...string) *gateway {
	t.Helper()
	g := &gateway{admin: admin, serveProc: startServe(t, args, nil, out)}
	g.waitReady(t, admin, 20*time.Second)
	return g
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
