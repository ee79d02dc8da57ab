package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// startRun runs the gateway in-process on free loopback ports (extra: more lines of its server
// block) and returns its addresses, the
// cancel that starts the shutdown, and a channel with Run's result.
func startRun(t *testing.T, upstream, extra string) (proxyAddr, adminAddr string, stop context.CancelFunc, finished <-chan struct{}, result func() error) {
	t.Helper()
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
upstream: %s
server:
  drain_timeout: 5s
%spolicies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 100/s
    burst: 100
`, upstream, extra)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	errc := make(chan error, 1)
	fin := make(chan struct{})
	var runErr error
	go func() {
		defer close(fin)
		runErr = Run(ctx, Options{
			ConfigPath: path,
			Getenv:     func(string) string { return "" },
			Log:        io.Discard,
			Ready:      func(p, a net.Addr) { ready <- [2]string{p.String(), a.String()} },
		})
		errc <- runErr
	}()
	select {
	case a := <-ready:
		t.Cleanup(func() {
			cancel()
			select {
			case <-fin:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return within 10s of cancel")
			}
		})
		return a[0], a[1], cancel, fin, func() error { <-fin; return runErr }
	case err := <-errc:
		cancel()
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("Run not ready after 10s")
	}
	return "", "", nil, nil, nil
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// TestMetricsLint: every series the wired gateway exposes passes promlint
// (naming, units, _total suffixes), after one request so the lazily created series exist too.
func TestMetricsLint(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	pa, aa, _, _, _ := startRun(t, up.URL, "")
	if code, _ := httpGet(t, "http://"+pa+"/"); code != http.StatusOK {
		t.Fatalf("proxy GET /: got %d, want 200", code)
	}
	_, body := httpGet(t, "http://"+aa+"/metrics")
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "ratelimit_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestReadyzDuringDrain: once shutdown has begun and the proxy port refuses new connections,
// /readyz answers 503, so a load balancer or an endpoint list still probing stops sending
// connections to a port that refuses them.
func TestReadyzDuringDrain(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "finished")
	}))
	defer up.Close()
	defer close(release)
	pa, aa, stop, _, _ := startRun(t, up.URL, "")

	inflight := make(chan int, 1)
	go func() {
		resp, err := http.Get("http://" + pa + "/slow")
		if err != nil {
			inflight <- -1
			return
		}
		resp.Body.Close()
		inflight <- resp.StatusCode
	}()
	<-arrived
	stop() // SIGTERM

	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", pa, time.Second)
		if err != nil {
			break // the proxy listener is closed: shutdown has begun
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("proxy listener still open 5s after shutdown began")
		}
		time.Sleep(10 * time.Millisecond) // polling a socket with a deadline
	}
	if code, body := httpGet(t, "http://"+aa+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while the proxy port refuses connections: got %d %q, want 503", code, body)
	}
}

// TestShutdownDelayKeepsServing: with server.shutdown_delay, SIGTERM turns /readyz to 503 at
// once while the proxy still accepts and forwards new requests; its listener closes only after
// the delay.
func TestShutdownDelayKeepsServing(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	const delay = 1500 * time.Millisecond
	pa, aa, stop, finished, result := startRun(t, up.URL, "  shutdown_delay: 1500ms\n")
	if code, _ := httpGet(t, "http://"+aa+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before shutdown: got %d, want 200", code)
	}
	stopped := time.Now()
	stop() // SIGTERM
	// /readyz turns 503 (poll: the signal is handled by Run's goroutine).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) { // polling a process with a deadline
		if code, _ := httpGet(t, "http://"+aa+"/readyz"); code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 5s after shutdown began")
		}
	}
	// Still serving, on new connections, while the delay runs.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	served := 0
	for time.Since(stopped) < delay*2/3 {
		resp, err := c.Get("http://" + pa + "/")
		if err != nil {
			t.Fatalf("request %v after SIGTERM, within shutdown_delay %v: %v", time.Since(stopped).Round(time.Millisecond), delay, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request within shutdown_delay: got %d, want 200", resp.StatusCode)
		}
		served++
		time.Sleep(50 * time.Millisecond) // pacing requests over the delay
	}
	select {
	case <-finished:
		if err := result(); err != nil {
			t.Fatalf("Run returned %v, want nil", err)
		}
		if took := time.Since(stopped); took < delay {
			t.Errorf("Run returned %v after SIGTERM, want no sooner than shutdown_delay %v", took, delay)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of SIGTERM")
	}
	t.Logf("%d requests served on new connections during the %v shutdown_delay", served, delay)
}

// TestRunStoppedWhileStartingIsClean: a SIGTERM that arrives while the gateway is still starting
// (here before it listens) is a shutdown asked for, not a failure: Run returns nil.
func TestRunStoppedWhileStartingIsClean(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	cfg := "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nupstream: http://127.0.0.1:1\npolicies:\n" +
		"  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var logs strings.Builder
	err := Run(ctx, Options{ConfigPath: path, Getenv: func(string) string { return "" }, Log: &logs,
		Ready: func(net.Addr, net.Addr) { t.Error("Run became ready with its context already canceled") }})
	if err != nil {
		t.Errorf("Run with a canceled context: got %v, want nil (a shutdown, not a failure)", err)
	}
	if !strings.Contains(logs.String(), "shut down before serving") {
		t.Errorf("logs %q, want the shutdown before serving logged", logs.String())
	}
}
