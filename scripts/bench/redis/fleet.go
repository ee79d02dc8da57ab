package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// A front is what a fleet's replicas serve.
type front string

const (
	frontProxy front = "proxy"                // our HTTP front end, one policy
	frontRLS   front = "rls"                  // our ShouldRateLimit
	frontERL   front = "envoyproxy/ratelimit" // theirs, when ERL_BIN names a build
)

// benchRules is the rule file both RLS serve (envoyproxy/ratelimit's format, which ours reads):
// one fixed window no load reaches, so that every call is a full read-count-write; and the rules
// of the same-answers check, small fixed windows that the check's sequence runs into.
const benchRules = `domain: bench
descriptors:
  - key: key
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`

const sameRules = `domain: same
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 4}
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: hour, requests_per_unit: 2}
`

// fleet is n replicas of one front on one Redis: real processes, each with its own ports.
type fleet struct {
	front  front
	addrs  []string // the HTTP listeners (proxy) or gRPC listeners (RLS)
	admins []string // our admin listeners (/readyz, /metrics); theirs: the HTTP port (/healthcheck)
	cmds   []*exec.Cmd
	logs   []*syncBuffer
}

// syncBuffer is a bytes.Buffer a process writes while the bench may read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 { // a chatty replica must not hold the machine's memory
		s.b.Reset()
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pids are the replicas' process ids.
func (f *fleet) pids() []int {
	out := make([]int, len(f.cmds))
	for i, c := range f.cmds {
		out[i] = c.Process.Pid
	}
	return out
}

// stop ends every replica (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (f *fleet) stop() {
	if f == nil {
		return
	}
	for _, c := range f.cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range f.cmds {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	f.cmds = nil
}

// fleetSpec is what startFleet starts.
type fleetSpec struct {
	front     front
	replicas  int
	bin       string // ours: bin/ratelimit-proxy; theirs: ERL_BIN
	redisURL  string // redis://127.0.0.1:PORT
	redisAddr string // 127.0.0.1:PORT
	upstream  string // the proxy's upstream URL
	rulesDir  string // envoyproxy/ratelimit's RUNTIME_ROOT; the rules are in rulesDir/ratelimit/config
	workDir   string
	env       []string // extra environment of every replica (theirs: settings)
}

// configDir is where the rule files are, for both RLS.
func (s fleetSpec) configDir() string { return filepath.Join(s.rulesDir, "ratelimit", "config") }

// writeRules writes the rule files both RLS read.
func writeRules(rulesDir string) error {
	dir := filepath.Join(rulesDir, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(benchRules), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "same.yaml"), []byte(sameRules), 0o644)
}

// startFleet starts the replicas and waits until each is ready.
func startFleet(ctx context.Context, s fleetSpec) (*fleet, error) {
	f := &fleet{front: s.front}
	for i := range s.replicas {
		ports, err := harness.FreeAddrs(3)
		if err != nil {
			f.stop()
			return nil, err
		}
		var cmd *exec.Cmd
		var ready string
		switch s.front {
		case frontProxy, frontRLS:
			cfg := fmt.Sprintf("admin_listen: %s\nlog:\n  level: warn\nstore:\n  backend: redis\n  timeout: 1s\n  on_error: deny\n  redis:\n    url: %s\n    key_prefix: 'bench:'\n", ports[1], s.redisURL)
			if s.front == frontProxy {
				cfg += fmt.Sprintf("listen: %s\nupstream: %s\npolicies:\n  - name: per-key\n    key: api_key\n    algorithm: fixed_window\n    limit: 1000000000\n    window: 1h\n", ports[0], s.upstream)
			} else {
				cfg += fmt.Sprintf("rls:\n  listen: %s\n  config_dir: %s\n", ports[0], s.configDir())
			}
			path := filepath.Join(s.workDir, fmt.Sprintf("%s-%d.conf", s.front, i)) // not *.yaml
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				f.stop()
				return nil, err
			}
			cmd = exec.Command(s.bin, "serve", "--config", path)
			cmd.Env = os.Environ()
			ready = "http://" + ports[1] + "/readyz"
		case frontERL:
			cmd = exec.Command(s.bin)
			cmd.Env = append(os.Environ(),
				"HOST=127.0.0.1", "PORT="+port(ports[1]),
				"GRPC_HOST=127.0.0.1", "GRPC_PORT="+port(ports[0]),
				"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+port(ports[2]),
				"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+s.redisAddr,
				"RUNTIME_ROOT="+s.rulesDir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
				"USE_STATSD=false", "LOG_LEVEL=warn")
			cmd.Env = append(cmd.Env, s.env...)
			ready = "http://" + ports[1] + "/healthcheck"
		}
		logs := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // Ctrl-C reaches the bench, which stops them
		if err := cmd.Start(); err != nil {
			f.stop()
			return nil, fmt.Errorf("%s replica %d: %w", s.front, i, err)
		}
		f.cmds, f.logs = append(f.cmds, cmd), append(f.logs, logs)
		f.addrs, f.admins = append(f.addrs, ports[0]), append(f.admins, ports[1])
		exited := make(chan struct{})
		go func() {
			// Polls the process without reaping it: stop's Wait reaps it.
			for cmd.Process.Signal(syscall.Signal(0)) == nil {
				time.Sleep(100 * time.Millisecond) // a liveness poll, not a wait for an outcome
			}
			close(exited)
		}()
		if err := harness.WaitReady(ctx, ready, exited, 60*time.Second); err != nil {
			f.stop()
			return nil, fmt.Errorf("%s replica %d: %w\n%s", s.front, i, err, tail(logs.String(), 2000))
		}
	}
	return f, nil
}

func port(addr string) string {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[i+1:]
		}
	}
	return addr
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// storeWithin1ms sums the replicas' ratelimit_store_duration_seconds histogram: the calls so far
// and those within 1 ms (the bucket le="0.001").
func (f *fleet) storeWithin1ms() (within, total float64) {
	if f.front == frontERL {
		return 0, 0
	}
	for _, a := range f.admins {
		res, err := http.Get("http://" + a + "/metrics")
		if err != nil {
			continue
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		_ = res.Body.Close()
		for _, l := range bytes.Split(b.Bytes(), []byte("\n")) {
			switch {
			case bytes.HasPrefix(l, []byte(`ratelimit_store_duration_seconds_bucket{backend="redis",le="0.001"} `)):
				within += metricValue(l)
			case bytes.HasPrefix(l, []byte(`ratelimit_store_duration_seconds_count{backend="redis"} `)):
				total += metricValue(l)
			}
		}
	}
	return within, total
}

func metricValue(l []byte) float64 {
	i := bytes.LastIndexByte(l, ' ')
	v, _ := strconv.ParseFloat(string(l[i+1:]), 64)
	return v
}
