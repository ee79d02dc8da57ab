package e2e

// End-to-end tests: the real binary, real sockets, a real upstream.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

var binary string

// testGateway is the test gateway (internal/testkit/gateway): the same command line with the test
// seams it reads from the environment. startServe runs it instead of binary when the
// environment asks for a seam.
var testGateway string

// clockOffset is the environment entry that starts a test gateway whose clock is shifted by d.
func clockOffset(d string) string { return "RATELIMIT_TEST_CLOCK_OFFSET=" + d }

// isTestSeam reports whether an environment entry asks for one of the test gateway's seams.
func isTestSeam(kv string) bool {
	return strings.HasPrefix(kv, "RATELIMIT_TEST_CLOCK_OFFSET=") || strings.HasPrefix(kv, "RATELIMIT_EXACT_MUTANT=")
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ratelimit-proxy-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "ratelimit-proxy")
	testGateway = filepath.Join(dir, "test-gateway")
	for bin, pkg := range map[string]string{binary: "../../cmd/ratelimit-proxy", testGateway: "../../internal/testkit/gateway"} {
		build := exec.Command("go", "build", "-race", "-o", bin, pkg)
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	ddb.Stop()
	redisSingle.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects a process's output while tests read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// gatewayPorts chooses the ports of launchGateway's gateways: freePorts, or a test's stand-in.
var gatewayPorts = freePorts

func freePort(t *testing.T) string {
	t.Helper()
	return freePorts(t, 1)[0]
}

// freePorts returns n distinct free loopback addresses: the listeners stay open until all are
// chosen, so the kernel cannot hand the same port out twice (which made the proxy and admin
// addresses collide now and then).
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs
}

type gateway struct {
	*serveProc
	proxy      string // http://host:port
	admin      string
	configPath string
}

// serveProc is a gateway process that a test started (startServe).
type serveProc struct {
	cmd     *exec.Cmd
	logs    *syncBuffer   // its output, unless the test sent it elsewhere
	exited  chan struct{} // closed when the process has exited; then exitErr holds Wait's error
	exitErr error
}

// startServe starts the binary with args, env added to the environment, its output to out (nil:
// the logs buffer). The process is killed when the test ends, and its logs shown if it failed.
func startServe(t *testing.T, args, env []string, out io.Writer) *serveProc {
	t.Helper()
	p := &serveProc{logs: &syncBuffer{}, exited: make(chan struct{})}
	if out == nil {
		out = p.logs
	}
	bin := binary
	if slices.ContainsFunc(env, isTestSeam) {
		bin = testGateway
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exitErr = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if logs := p.logs.String(); t.Failed() && logs != "" {
			t.Logf("gateway logs:\n%s", logs)
		}
	})
	return p
}

// waitReady polls admin's /readyz until it answers 200; the test fails if the process exits
// first or timeout passes.
func (p *serveProc) waitReady(t *testing.T, admin string, timeout time.Duration) {
	t.Helper()
	if err := p.ready(admin, timeout); err != nil {
		t.Fatal(err)
	}
}

// errPortTaken is ready's error for a process that exited because a port chosen for it was taken
// in between (freePorts closes its listeners before the gateway binds: another process, a
// parallel test or another test binary, may take one first). The caller may choose new ports.
var errPortTaken = errors.New("a port chosen for the gateway was taken before it bound it")

// ready polls admin's /readyz until it answers 200 and, where the process's output is captured,
// the process has logged that it serves on admin: a /readyz answered by some other process that
// holds the port (see errPortTaken) does not count. It fails if the process exits first (with
// errPortTaken when that is why) or timeout passes.
func (p *serveProc) ready(admin string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	ours := `"admin_listen":"` + strings.TrimPrefix(admin, "http://") + `"`
	for {
		if resp, err := http.Get(admin + "/readyz"); err == nil {
			resp.Body.Close()
			captured := p.cmd.Stdout == io.Writer(p.logs)
			if resp.StatusCode == http.StatusOK && (!captured || strings.Contains(p.logs.String(), ours)) {
				return nil
			}
		}
		select {
		case <-p.exited:
			logs := p.logs.String()
			if strings.Contains(logs, "address already in use") {
				return fmt.Errorf("%w:\n%s", errPortTaken, logs)
			}
			return fmt.Errorf("gateway exited before it was ready: %w\n%s", p.exitErr, logs)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gateway not ready after %s:\n%s", timeout, p.logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a process with a deadline
	}
}

// counting upstream: records how many requests reached it.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t *testing.T, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		if h != nil {
			h(w, r)
			return
		}
		fmt.Fprintf(w, "upstream saw %s %s", r.Method, r.URL.Path)
	}))
	t.Cleanup(u.Close)
	return u
}

// config renders a full config for the given upstream and policies block.
func config(proxyAddr, adminAddr, upstreamURL, rest string) string {
	return fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: %s\n%s", proxyAddr, adminAddr, upstreamURL, rest)
}

func startGateway(t *testing.T, upstreamURL, rest string, env ...string) *gateway {
	t.Helper()
	return startGatewayArgs(t, nil, upstreamURL, rest, env...)
}

// startGatewayArgs is startGateway with more arguments for serve.
func startGatewayArgs(t *testing.T, args []string, upstreamURL, rest string, env ...string) *gateway {
	t.Helper()
	for attempt := 1; ; attempt++ {
		g := launchGateway(t, args, upstreamURL, rest, env...)
		err := g.ready(g.admin, 20*time.Second)
		if err == nil {
			return g
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; starting again on new ports", attempt, errPortTaken)
	}
}

// launchGateway starts the gateway process (serve with args) and stops it at the test's end,
// without waiting for it to be ready.
func launchGateway(t *testing.T, args []string, upstreamURL, rest string, env ...string) *gateway {
	t.Helper()
	if strings.Contains(rest, "fixed_window") {
		waitOutHourEdge(t, hourEdgeMargin)
	}
	dir := t.TempDir()
	g := &gateway{configPath: filepath.Join(dir, "config.yaml")}
	ports := gatewayPorts(t, 2)
	pa, aa := ports[0], ports[1]
	g.proxy, g.admin = "http://"+pa, "http://"+aa
	if err := os.WriteFile(g.configPath, []byte(config(pa, aa, upstreamURL, rest)), 0o600); err != nil {
		t.Fatal(err)
	}
	g.serveProc = startServe(t, append([]string{"serve", "--config", g.configPath}, args...), env, nil)
	return g
}

// waitListenerClosed polls until the proxy port refuses connections (shutdown has begun).
func (g *gateway) waitListenerClosed(t *testing.T) {
	t.Helper()
	eventually(t, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(g.proxy, "http://"), time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
}

// rewrite replaces the policies part of the config.
func (g *gateway) rewrite(t *testing.T, upstreamURL, rest string) {
	t.Helper()
	pa, aa := strings.TrimPrefix(g.proxy, "http://"), strings.TrimPrefix(g.admin, "http://")
	if err := os.WriteFile(g.configPath, []byte(config(pa, aa, upstreamURL, rest)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// hourEdgeMargin is how much of the hour a test with a clock-aligned window must have left.
const hourEdgeMargin = 10 * time.Second

// waitOutHourEdge waits for the next hour when less than margin of this one is left. Fixed
// windows of an hour, a day or a week all end on an hour boundary, and the tests count exact
// totals: requests that straddle the boundary split over two windows (a hostile-keys test
// once saw [200 200 200] at 12:00:00). Waiting costs at most margin, once an hour.
func waitOutHourEdge(t *testing.T, margin time.Duration) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < margin {
		t.Logf("%s: %v before the hour ends; waiting for the next one (clock-aligned windows)", now.Format(time.TimeOnly), left.Round(time.Millisecond))
		time.Sleep(left + 50*time.Millisecond) // the clock, not a process: nothing to poll
	}
}

func get(t *testing.T, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	return doMethod(t, http.MethodGet, url, hdr...)
}

// doMethod sends one request with the header pairs and returns the response and its body, read
// to the end (so that the next request reuses the connection).
func doMethod(t *testing.T, method, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// metric returns the value of one exposition line (name with labels exactly as printed), or -1.
func metric(t *testing.T, admin, series string) float64 {
	t.Helper()
	_, body := get(t, admin+"/metrics")
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, series+" ") {
			var v float64
			fmt.Sscanf(strings.TrimPrefix(line, series+" "), "%g", &v)
			return v
		}
	}
	return -1
}

// histogramOver reads the histogram name{label="value"} from the admin port and returns how many
// of its observations lie beyond the smallest bucket bound at or above threshold, and how many
// there are. Absent, it fails the test.
func histogramOver(t *testing.T, admin, name, label, value string, threshold float64) (over, total float64) {
	t.Helper()
	_, body := get(t, admin+"/metrics")
	if f := parseFamilies(t, body)[name]; f != nil {
		for _, m := range f.GetMetric() {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
				continue
			}
			h := m.GetHistogram()
			for _, b := range h.GetBucket() { // ascending bounds
				if b.GetUpperBound() >= threshold {
					return float64(h.GetSampleCount() - b.GetCumulativeCount()), float64(h.GetSampleCount())
				}
			}
		}
	}
	t.Fatalf("histogram %s{%s=%q} with a bucket at or above %v: not on %s/metrics", name, label, value, threshold, admin)
	return 0, 0
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

const ipPolicy = `policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 1/h
    burst: 3
`

func TestServeLimitsAndForwards(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, ipPolicy)

	for i := 0; i < 3; i++ {
		resp, body := get(t, g.proxy+"/hello")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: got status %d, want 200 (%s)", i, resp.StatusCode, body)
		}
		if got, want := resp.Header.Get("X-RateLimit-Limit"), "3"; got != want {
			t.Errorf("request %d: X-RateLimit-Limit got %q, want %q", i, got, want)
		}
		if got, want := resp.Header.Get("X-RateLimit-Remaining"), fmt.Sprint(2-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining got %q, want %q", i, got, want)
		}
		if body != "upstream saw GET /hello" {
			t.Errorf("request %d: body got %q", i, body)
		}
	}
	resp, body := get(t, g.proxy+"/hello")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request: got %d, want 429", resp.StatusCode)
	}
	if got := resp.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("429 Content-Type got %q, want application/problem+json", got)
	}
	var problem struct {
		Status     int    `json:"status"`
		Policy     string `json:"policy"`
		RetryAfter int    `json:"retry_after_seconds"`
	}
	if err := json.Unmarshal([]byte(body), &problem); err != nil {
		t.Fatalf("429 body %q: %v", body, err)
	}
	// One token per hour (T = 3600 s): after the burst of 3 the next request conforms T later.
	if problem.Status != 429 || problem.Policy != "per-ip" || problem.RetryAfter < 3599 || problem.RetryAfter > 3600 {
		t.Errorf("429 body got %+v, want status 429, policy per-ip, retry ~3600", problem)
	}
	if got, want := resp.Header.Get("Retry-After"), fmt.Sprint(problem.RetryAfter); got != want {
		t.Errorf("Retry-After got %q, want %q (= retry_after_seconds)", got, want)
	}
	if got := resp.Header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Errorf("429 X-RateLimit-Remaining got %q, want 0", got)
	}
	if got := up.hits.Load(); got != 3 {
		t.Errorf("upstream hits got %d, want 3 (a 429 must never reach it)", got)
	}
	if got := metric(t, g.admin, `ratelimit_requests_total{policy="per-ip",result="limited"}`); got != 1 {
		t.Errorf("limited counter got %v, want 1", got)
	}
	// /metrics on the proxy port is an ordinary request for the upstream (here: rejected, like any).
	if resp, _ := get(t, g.proxy+"/metrics"); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("proxy /metrics got %d, want 429 like any other request of this client", resp.StatusCode)
	}
	if resp, _ := get(t, g.admin+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz got %d, want 200", resp.StatusCode)
	}
}

func TestProxyMetricsPathGoesUpstream(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, ipPolicy)
	resp, body := get(t, g.proxy+"/metrics")
	if resp.StatusCode != 200 || body != "upstream saw GET /metrics" {
		t.Errorf("proxy /metrics got %d %q, want the upstream's answer", resp.StatusCode, body)
	}
}

func TestUpstreamDownIs502JSON(t *testing.T) {
	dead := freePort(t) // nothing listens there
	g := startGateway(t, "http://"+dead, ipPolicy)
	resp, body := get(t, g.proxy+"/")
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("got %d, want 502", resp.StatusCode)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("502 body is not JSON: %q", body)
	}
	// And the gateway is still alive.
	if resp, _ := get(t, g.admin+"/healthz"); resp.StatusCode != 200 {
		t.Errorf("healthz after 502 got %d", resp.StatusCode)
	}
}

func TestReloadInPlaceRenameAndInvalid(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, ipPolicy)
	limitOf := func() string {
		resp, _ := get(t, g.proxy+"/")
		return resp.Header.Get("X-RateLimit-Limit")
	}
	policyWithBurst := func(name string, burst int) string {
		return fmt.Sprintf("policies:\n  - name: %s\n    key: ip\n    algorithm: token_bucket\n    rate: 100/s\n    burst: %d\n", name, burst)
	}

	// In-place rewrite.
	g.rewrite(t, up.URL, policyWithBurst("reloaded", 50))
	eventually(t, "in-place rewrite applied", func() bool { return limitOf() == "50" })

	// Atomic rename over the file, as editors and ConfigMaps do.
	tmp := g.configPath + ".tmp"
	pa, aa := strings.TrimPrefix(g.proxy, "http://"), strings.TrimPrefix(g.admin, "http://")
	if err := os.WriteFile(tmp, []byte(config(pa, aa, up.URL, policyWithBurst("renamed", 60))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, g.configPath); err != nil {
		t.Fatal(err)
	}
	eventually(t, "renamed file applied", func() bool { return limitOf() == "60" })

	// An invalid file is logged and the running policies stay.
	g.rewrite(t, up.URL, "policies:\n  - name: broken\n    key: ip\n    algorithm: token_bucket\n    rate: 10/x\n    burst: 5\n")
	eventually(t, "reload error counted", func() bool {
		return metric(t, g.admin, `ratelimit_config_reloads_total{result="error"}`) >= 1
	})
	if got := limitOf(); got != "60" {
		t.Errorf("after invalid reload X-RateLimit-Limit got %q, want the old 60", got)
	}
	// The error counted may be that of a read that caught the file half rewritten; the read of
	// the whole file follows it.
	eventually(t, "the reload error names the bad value 10/x", func() bool { return strings.Contains(g.logs.String(), `10/x`) })
	if got := limitOf(); got != "60" {
		t.Errorf("after invalid reload X-RateLimit-Limit got %q, want the old 60", got)
	}

	// SIGHUP reloads too (after restoring a valid file, SIGHUP forces a read).
	g.rewrite(t, up.URL, policyWithBurst("hup", 70))
	if err := g.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, "SIGHUP reload applied", func() bool { return limitOf() == "70" })
	select {
	case <-g.exited:
		t.Fatalf("gateway exited on SIGHUP: %v", g.exitErr)
	default:
	}
}

func TestSIGTERMDrainsInFlight(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "finished")
	})
	g := startGateway(t, up.URL, ipPolicy)

	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.Get(g.proxy + "/slow")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, string(b), err}
	}()
	<-arrived
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The gateway must not exit while the request is in flight; it has stopped accepting.
	g.waitListenerClosed(t)
	select {
	case <-g.exited:
		t.Fatalf("gateway exited with a request in flight: %v", g.exitErr)
	default:
	}
	close(release)
	r := <-done
	if r.err != nil || r.status != 200 || r.body != "finished" {
		t.Fatalf("in-flight request got %d %q %v, want 200 finished", r.status, r.body, r.err)
	}
	select {
	case <-g.exited:
		if g.exitErr != nil {
			t.Fatalf("exit after drain: %v, want status 0", g.exitErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("gateway did not exit after draining")
	}
}

func TestSecretsNeverLogged(t *testing.T) {
	up := newUpstream(t, nil)
	pseudonymSecret := strings.Repeat("q", 32)
	g := startGateway(t, up.URL, `identity:
  api_key_header: X-Api-Key
log: {access: true, pseudonym_secret_env: TEST_PSEUDONYM_SECRET}
policies:
  - name: per-key
    key: api_key
    algorithm: fixed_window
    limit: 1
    window: 1h
`, "TEST_PSEUDONYM_SECRET="+pseudonymSecret)
	const secret = "sk-live-SECRET-4242"
	for i := 0; i < 3; i++ {
		get(t, g.proxy+"/", "X-Api-Key", secret)
	}
	eventually(t, "a rejection counted", func() bool {
		return metric(t, g.admin, `ratelimit_requests_total{policy="per-key",result="limited"}`) >= 1
	})
	// log.access: a line per request, the key as the pseudonym under the configured secret.
	want := `"keys":{"api_key":"` + policy.NewPseudonyms([]byte(pseudonymSecret)).Of("api_key", secret) + `"}`
	eventually(t, "three access lines", func() bool { return strings.Count(g.logs.String(), want) == 3 })
	if n := strings.Count(g.logs.String(), `"decision":"limited","protocol":"http1","policy":"per-key"`); n != 2 {
		t.Errorf("got %d access lines of limited requests, want 2", n)
	}
	_, metrics := get(t, g.admin+"/metrics")
	for where, text := range map[string]string{"logs": g.logs.String(), "metrics": metrics} {
		if strings.Contains(text, secret) || strings.Contains(text, "SECRET-4242") {
			t.Errorf("raw API key found in %s", where)
		}
	}
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runBinary(t, func(*exec.Cmd) {}, args...)
}

// runBinary runs the gateway binary with args (setup adjusts the command: its directory, stdin,
// environment), bounded by 30 s, and returns its exit code and output.
func runBinary(t *testing.T, setup func(*exec.Cmd), args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	setup(cmd)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		return ee.ExitCode(), out.String(), errb.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errb.String()
}

func TestValidateCommand(t *testing.T) {
	code, out, errs := runCLI(t, "validate", "--config", "../../configs/example.yaml")
	if code != 0 {
		t.Fatalf("validate example: exit %d, stderr %s", code, errs)
	}
	if !strings.Contains(out, "per-ip") {
		t.Errorf("validate output does not list per-ip:\n%s", out)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte(`upstream: http://127.0.0.1:1
policies:
  - name: a
    key: ip
    algorithm: token_bucket
    rate: 10/s
    burst: 5
  - name: b
    key: ip
    algorithm: token_bucket
    rate: 10/s
    burst: 5
  - name: c
    key: ip
    algorithm: token_bucket
    rate: 10/x
    burst: 5
`), 0o600)
	code, _, errs = runCLI(t, "validate", "--config", bad)
	if code == 0 {
		t.Fatal("validate of a bad file exited 0")
	}
	if want := `policies[2].rate: "10/x": unit must be s, m or h`; !strings.Contains(errs, want) {
		t.Errorf("validate stderr lacks %q:\n%s", want, errs)
	}
	code, _, errs = runCLI(t, "serve", "--config", bad)
	if code == 0 || !strings.Contains(errs, "10/x") {
		t.Errorf("serve of a bad file: exit %d, stderr %s; want non-zero naming 10/x", code, errs)
	}
	// A bare --config serves too: with a bad file it must fail the same way.
	if code, _, _ = runCLI(t, "--config", bad); code == 0 {
		t.Error("bare --config with a bad file exited 0")
	}
	code, out, _ = runCLI(t, "--version")
	if code != 0 || !strings.Contains(out, "ratelimit-proxy") {
		t.Errorf("--version: exit %d, out %q", code, out)
	}
}

func TestSpoofedForwardedForFromUntrustedPeer(t *testing.T) {
	up := newUpstream(t, nil)
	// The test client (127.0.0.1) is not a trusted proxy: its X-Forwarded-For must be ignored.
	g := startGateway(t, up.URL, "trusted_proxies: [10.0.0.0/8]\n"+ipPolicy)
	for i := 0; i < 5; i++ {
		spoof := fmt.Sprintf("198.51.100.%d", i)
		resp, _ := get(t, g.proxy+"/", "X-Forwarded-For", spoof, "Forwarded", "for="+spoof)
		want := http.StatusOK
		if i >= 3 {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Errorf("request %d with X-Forwarded-For %s: got %d, want %d (rotating the header must not escape the IP limit)", i, spoof, resp.StatusCode, want)
		}
	}
}

func TestRejectedRequestConsumesNoOtherQuota(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, `identity:
  user_header: X-User-Id
policies:
  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 2
    window: 1h
  - name: account
    key: global
    algorithm: token_bucket
    rate: 1/h
    burst: 4
`)
	codes := func(user string, n int) []int {
		var out []int
		for i := 0; i < n; i++ {
			resp, _ := get(t, g.proxy+"/", "X-User-Id", user)
			out = append(out, resp.StatusCode)
		}
		return out
	}
	// alice: 2 admitted, then 5 rejected by per-user. Those 5 must not drain the account pool.
	if got := fmt.Sprint(codes("alice", 7)); got != "[200 200 429 429 429 429 429]" {
		t.Fatalf("alice got %s", got)
	}
	// bob gets the pool's last 2 (4 - alice's 2); carol then finds it empty.
	if got := fmt.Sprint(codes("bob", 2)); got != "[200 200]" {
		t.Fatalf("bob got %s, want [200 200]: alice's rejected requests drained the account pool", got)
	}
	resp, body := get(t, g.proxy+"/", "X-User-Id", "carol")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"policy":"account"`) {
		t.Fatalf("carol got %d %s, want 429 from policy account", resp.StatusCode, body)
	}
	if got := up.hits.Load(); got != 4 {
		t.Errorf("upstream hits got %d, want 4", got)
	}
}

// jwtIdentity configures HS256 bearer tokens with jwtSecret (passed as E2E_JWT_SECRET); the
// policies follow it.
const (
	jwtSecret   = "0123456789abcdef0123456789abcdef-test-only"
	jwtIdentity = `identity:
  jwt:
    claim: sub
    hs256_secret_env: E2E_JWT_SECRET
policies:
`
)

func TestJWTUserAndInvalidTokens(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, jwtIdentity+`  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 1
    window: 1h
`, "E2E_JWT_SECRET="+jwtSecret)
	sign := func(key any, method jwt.SigningMethod, claims jwt.MapClaims) string {
		t.Helper()
		s, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	now := time.Now()
	good := sign([]byte(jwtSecret), jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix()})
	if resp, _ := get(t, g.proxy+"/", "Authorization", "Bearer "+good); resp.StatusCode != 200 {
		t.Fatalf("valid token: got %d, want 200", resp.StatusCode)
	}
	if resp, _ := get(t, g.proxy+"/", "Authorization", "Bearer "+good); resp.StatusCode != 429 {
		t.Fatalf("valid token, second request: got %d, want 429 (limit 1 per user)", resp.StatusCode)
	}
	unsigned := sign(jwt.UnsafeAllowNoneSignatureType, jwt.SigningMethodNone, jwt.MapClaims{"sub": "mallory"})
	bad := map[string]string{
		"wrong signature": sign([]byte("another-secret-another-secret-xx"), jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory"}),
		"alg none":        unsigned,
		"expired":         sign([]byte(jwtSecret), jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory", "exp": now.Add(-time.Hour).Unix()}),
		"not yet valid":   sign([]byte(jwtSecret), jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory", "nbf": now.Add(time.Hour).Unix()}),
		"malformed":       "not.a.jwt",
	}
	before := up.hits.Load()
	for name, tok := range bad {
		resp, _ := get(t, g.proxy+"/", "Authorization", "Bearer "+tok)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: got %d, want 401", name, resp.StatusCode)
		}
	}
	if got := up.hits.Load(); got != before {
		t.Errorf("upstream saw %d requests with invalid tokens, want 0", got-before)
	}
	if strings.Contains(g.logs.String(), good) || strings.Contains(g.logs.String(), "alice") {
		t.Error("a token or user id appears in the logs")
	}
}

// TestBadTokensHeldByIPLimit: a flood of invalid bearer tokens is refused 401 and never
// forwarded, but it is charged to the ip policy (and only to it): once the peer is over its IP
// limit it gets 429, and the per-user and global pools are untouched.
func TestBadTokensHeldByIPLimit(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, jwtIdentity+`  - name: per-ip
    key: ip
    algorithm: fixed_window
    limit: 3
    window: 1h
  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 100
    window: 1h
  - name: account
    key: global
    algorithm: fixed_window
    limit: 100
    window: 1h
`, "E2E_JWT_SECRET="+jwtSecret)
	forged, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory", "exp": time.Now().Add(time.Hour).Unix()}).
		SignedString([]byte("another-secret-another-secret-xx"))
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for range 5 {
		resp, _ := get(t, g.proxy+"/", "Authorization", "Bearer "+forged)
		got = append(got, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Error("429 for a bad token without Retry-After")
		}
		if resp.StatusCode == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
	}
	if want := []int{401, 401, 401, 429, 429}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("statuses for 5 forged tokens from one peer got %v, want %v (401 while the IP limit of 3 holds, then 429)", got, want)
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("upstream saw %d requests with forged tokens, want 0", n)
	}
	for sel, want := range map[string]float64{
		`ratelimit_decisions_total{result="unauthorized"}`:           3,
		`ratelimit_decisions_total{result="limited"}`:                2,
		`ratelimit_requests_total{policy="per-ip",result="limited"}`: 2,
	} {
		if v := metric(t, g.admin, sel); v != want {
			t.Errorf("%s got %v, want %v", sel, v, want)
		}
	}
	// The other layers were never charged: their series are absent (metric: -1) or zero.
	for _, sel := range []string{
		`ratelimit_requests_total{policy="per-user",result="allowed"}`,
		`ratelimit_requests_total{policy="per-user",result="limited"}`,
		`ratelimit_requests_total{policy="account",result="allowed"}`,
		`ratelimit_requests_total{policy="account",result="limited"}`,
	} {
		if v := metric(t, g.admin, sel); v > 0 {
			t.Errorf("%s got %v, want none: a refused token must not draw on that pool", sel, v)
		}
	}
}

func TestLeakyBucketShapesUpstreamRate(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
	})
	// T = 250 ms; one served at once and up to 2 waiting behind it.
	g := startGateway(t, up.URL, `policies:
  - name: smooth
    key: global
    algorithm: leaky_bucket
    rate: 4/s
    burst: 2
`)
	count := map[int]int{}
	for _, c := range getAll(g.proxy+"/", g.proxy+"/", g.proxy+"/", g.proxy+"/") {
		count[c]++
	}
	// Sent within far less than T of each other: three fit (1 served + 2 queued), the fourth does not.
	if count[200] != 3 || count[429] != 1 {
		t.Fatalf("got %v, want 3×200 and 1×429", count)
	}
	mu.Lock()
	defer mu.Unlock()
	// The gateway releases the queued requests T apart, but each then takes its own way to the
	// upstream: a loaded machine that delays one forward and not the next narrows that gap as
	// much as it widens the one before. So the bound is half of T per gap: unshaped requests
	// arrive within milliseconds of each other.
	for i := 1; i < len(arrivals); i++ {
		if gap := arrivals[i].Sub(arrivals[i-1]); gap < 125*time.Millisecond {
			t.Errorf("upstream arrivals %d and %d only %v apart, want about 250ms (the leaky rate)", i-1, i, gap)
		}
	}
	if span := arrivals[len(arrivals)-1].Sub(arrivals[0]); span < 400*time.Millisecond {
		t.Errorf("upstream arrivals span %v, want about 500ms (2 T)", span)
	}
}

// TestSecondSignalDuringDrainExits: the first SIGTERM starts the drain; a second signal (Ctrl-C
// twice, a supervisor re-sending SIGTERM) ends the process at once instead of after the whole
// server.drain_timeout.
func TestSecondSignalDuringDrainExits(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	g := startGateway(t, up.URL, ipPolicy, "RATELIMIT_SERVER_DRAIN_TIMEOUT=8s")

	go func() {
		resp, err := http.Get(g.proxy + "/slow")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	g.waitListenerClosed(t) // the drain has begun
	second := time.Now()
	if err := g.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.exited:
		t.Logf("exited %v after the second signal: %v", time.Since(second).Round(time.Millisecond), g.exitErr)
	case <-time.After(3 * time.Second):
		t.Fatalf("still running 3s after a second signal during the drain, want it to stop at once (drain_timeout 8s)")
	}
}
