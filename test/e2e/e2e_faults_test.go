package e2e

// Fault tests: the real binary, real sockets, and a fault-injecting TCP proxy (internal/testkit/faultnet)
// in front of the upstream. They show what the gateway does when its upstream dies, resets,
// stalls or crawls, when clients leave or dribble, when it is told to stop under load and when its
// configuration changes under load. Long soak runs are in e2e_soak_test.go (RATELIMIT_SOAK=1).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/faultnet"
)

// newClient returns a client with a keep-alive pool large enough for the tests' concurrency (the
// default of 2 idle connections per host would churn through ephemeral ports).
func newClient(t *testing.T, timeout time.Duration) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

// answer is one complete exchange as the client saw it.
type answer struct {
	status int
	header http.Header
	body   string
	err    error // transport error, or an error reading the body
	took   time.Duration
}

// fetch sends one GET with the given header pairs and reads the whole answer.
func fetch(c *http.Client, url string, hdr ...string) answer {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return answer{err: err}
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b), err: err, took: time.Since(start)}
}

// wantProblem checks that a is a problem+json answer with the given status.
func wantProblem(t *testing.T, what string, a answer, status int) {
	t.Helper()
	if a.err != nil {
		t.Errorf("%s: got error %v, want %d problem+json", what, a.err, status)
		return
	}
	if a.status != status {
		t.Errorf("%s: got status %d, want %d (body %q)", what, a.status, status, a.body)
		return
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("%s: Content-Type got %q, want application/problem+json", what, ct)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal([]byte(a.body), &p); err != nil || p.Status != status || p.Type == "" {
		t.Errorf("%s: body %q: got %+v (%v), want a problem with status %d", what, a.body, p, err, status)
	}
}

// percentile returns the p-th percentile (0..100) of ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(float64(len(ds)-1) * p / 100)
	return ds[i]
}

// burst sends n GETs from workers goroutines and returns every answer.
func burst(c *http.Client, url string, n, workers int, hdr func(i int) []string) []answer {
	out := make([]answer, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				var h []string
				if hdr != nil {
					h = hdr(i)
				}
				out[i] = fetch(c, url, h...)
			}
		}()
	}
	wg.Wait()
	return out
}

// remaining reads X-RateLimit-Remaining of a.
func remaining(t *testing.T, a answer) int64 {
	t.Helper()
	v, err := strconv.ParseInt(a.header.Get("X-RateLimit-Remaining"), 10, 64)
	if err != nil {
		t.Fatalf("X-RateLimit-Remaining %q: %v", a.header.Get("X-RateLimit-Remaining"), err)
	}
	return v
}

// faultLimit is large enough never to be reached by the fault tests, so that every request is
// admitted and X-RateLimit-Remaining counts them exactly.
const faultLimit = 1_000_000

var countingPolicy = fmt.Sprintf(`policies:
  - name: count
    key: global
    algorithm: fixed_window
    limit: %d
    window: 24h
`, faultLimit)

// TestFaultUpstream walks the upstream through every failure a sick service produces and checks
// that each is answered with the right problem, that the gateway survives all of them, and that
// the limiter's count stays exact: every request that reached the handler was charged once.
func TestFaultUpstream(t *testing.T) {
	const size = 64 << 10
	payload := strings.Repeat("y", size)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		io.WriteString(w, payload)
	})
	fn, via := faultProxy(t, up.URL)
	g := startGateway(t, via, countingPolicy)
	c := newClient(t, 10*time.Second)
	var sent int64 // requests that reached the gateway's handler, hence were charged
	send := func(what string) answer {
		t.Helper()
		sent++
		return fetch(c, g.proxy+"/"+what)
	}

	if a := send("healthy"); a.err != nil || a.status != 200 || len(a.body) != size {
		t.Fatalf("healthy: got %d, %d bytes, %v; want 200 and %d bytes", a.status, len(a.body), a.err, size)
	}

	fn.Refuse()
	wantProblem(t, "refused", send("refused"), http.StatusBadGateway)
	if err := fn.Listen(); err != nil {
		t.Fatal(err)
	}

	fn.Set(faultnet.Fault{Mode: faultnet.Reset})
	wantProblem(t, "reset before answering", send("reset"), http.StatusBadGateway)

	fn.Set(faultnet.Fault{Mode: faultnet.ResetAfter, After: 20})
	wantProblem(t, "reset inside the response headers", send("reset-headers"), http.StatusBadGateway)

	// Reset inside the body: the status line has gone out, so the only honest signal left is an
	// aborted connection. The client must not be handed a short body that looks complete.
	fn.Set(faultnet.Fault{Mode: faultnet.ResetAfter, After: 20_000})
	if a := send("reset-body"); a.err == nil || a.status == 200 && len(a.body) == size {
		t.Errorf("reset inside the body: got %d, %d bytes, err %v; want a read error and a short body", a.status, len(a.body), a.err)
	}

	// A stalled upstream holds the request until the client gives up; the gateway notices the
	// client leaving, counts it and lets go of the upstream connection.
	fn.Set(faultnet.Fault{Mode: faultnet.Stall})
	short := newClient(t, 300*time.Millisecond)
	sent++
	if a := fetch(short, g.proxy+"/stalled"); a.err == nil {
		t.Errorf("stalled upstream: got %d, want the client's own timeout", a.status)
	}
	eventually(t, "client cancel counted", func() bool {
		return metric(t, g.admin, `ratelimit_client_canceled_total{stage="upstream"}`) >= 1
	})

	// A slow upstream is waited for: there is no upstream response timeout (see the report).
	fn.Set(faultnet.Fault{Delay: 300 * time.Millisecond})
	if a := send("slow"); a.err != nil || a.status != 200 || a.took < 300*time.Millisecond {
		t.Errorf("slow upstream: got %d %v after %v, want 200 after at least 300ms", a.status, a.err, a.took)
	}

	fn.Set(faultnet.Fault{})
	a := send("healthy-again")
	if a.err != nil || a.status != 200 || len(a.body) != size {
		t.Fatalf("after the faults: got %d, %d bytes, %v; want 200 and the full body", a.status, len(a.body), a.err)
	}
	if got, want := remaining(t, a), faultLimit-sent; got != want {
		t.Errorf("after %d requests X-RateLimit-Remaining got %d, want %d: a fault corrupted the count", sent, got, want)
	}
	// Every 502 is counted. A header block cut short by a reset is counted as "other": the
	// transport reports the truncated header, not the reset that caused it. The reset inside the
	// body is "aborted".
	reasons := map[string]float64{}
	for _, r := range []string{"refused", "reset", "other", "timeout", "aborted"} {
		reasons[r] = metric(t, g.admin, fmt.Sprintf(`ratelimit_upstream_errors_total{reason=%q}`, r))
	}
	if reasons["refused"] != 1 || reasons["reset"]+reasons["other"] != 2 || reasons["aborted"] != 1 {
		t.Errorf("ratelimit_upstream_errors_total got %v, want refused 1, reset+other 2, aborted 1", reasons)
	}
}

// faultProxy puts a faultnet proxy in front of target (an http:// URL: an upstream or DynamoDB
// Local) and returns it with the URL that goes through it.
func faultProxy(t *testing.T, target string) (*faultnet.Proxy, string) {
	t.Helper()
	fn, err := faultnet.New(strings.TrimPrefix(target, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fn.Close() })
	return fn, "http://" + fn.Addr()
}

// TestFaultStalledUpstream504: a stalled upstream is answered 504 once upstream_timeout passes,
// instead of holding the client for as long as it is willing to wait.
func TestFaultStalledUpstream504(t *testing.T) {
	up := newUpstream(t, nil)
	fn, via := faultProxy(t, up.URL)
	rest := "upstream_timeout: 500ms\n" + countingPolicy
	g := startGateway(t, via, rest)
	fn.Set(faultnet.Fault{Mode: faultnet.Stall})
	a := fetch(newClient(t, 10*time.Second), g.proxy+"/")
	wantProblem(t, "stalled upstream", a, http.StatusGatewayTimeout)
	if a.took < 500*time.Millisecond || a.took > 2*time.Second {
		t.Errorf("504 after %v, want about the 500ms upstream_timeout", a.took)
	}
	if got := metric(t, g.admin, `ratelimit_upstream_errors_total{reason="timeout"}`); got != 1 {
		t.Errorf("upstream timeouts got %v, want 1", got)
	}
}

// TestFaultUpstreamDownUnderLoad fires bursts at a refusing upstream and checks that the gateway
// answers each with a 502 problem quickly, that its goroutines and memory stay flat across the
// bursts, that its latency on the healthy path is the same after as before, and that the count
// stays exact.
func TestFaultUpstreamDownUnderLoad(t *testing.T) {
	up := newUpstream(t, nil)
	fn, via := faultProxy(t, up.URL)
	// GOGC=100: this test watches RSS for leaks, and the gateway's default GOGC=400 lets the heap
	// (and the race detector's shadow of it) grow towards its larger target first.
	g := startGateway(t, via, countingPolicy, "GOGC=100")
	c := newClient(t, 10*time.Second)
	const n, workers = 1500, 16
	var sent int64

	healthy := func() time.Duration {
		t.Helper()
		as := burst(c, g.proxy+"/", 300, 4, nil)
		sent += int64(len(as))
		var ds []time.Duration
		for i, a := range as {
			if a.err != nil || a.status != 200 {
				t.Fatalf("healthy request %d: got %d %v", i, a.status, a.err)
			}
			ds = append(ds, a.took)
		}
		return percentile(ds, 50)
	}
	down := func() (p50, p99 time.Duration) {
		t.Helper()
		as := burst(c, g.proxy+"/", n, workers, nil)
		sent += int64(len(as))
		var ds []time.Duration
		for i, a := range as {
			if a.err != nil || a.status != http.StatusBadGateway {
				t.Fatalf("request %d to a dead upstream: got %d %v, want 502", i, a.status, a.err)
			}
			ds = append(ds, a.took)
		}
		return percentile(ds, 50), percentile(ds, 99)
	}

	before := healthy()
	fn.Refuse()
	down() // warm-up: pools, buffers and the race detector's shadow memory reach their size
	goroutines0 := metric(t, g.admin, "go_goroutines")
	rss0 := metric(t, g.admin, "process_resident_memory_bytes")
	heap0 := metric(t, g.admin, "go_memstats_heap_inuse_bytes")
	p50, p99 := down()
	down()
	rss1 := metric(t, g.admin, "process_resident_memory_bytes")
	heap1 := metric(t, g.admin, "go_memstats_heap_inuse_bytes")
	if err := fn.Listen(); err != nil {
		t.Fatal(err)
	}
	after := healthy()

	t.Logf("502 latency p50 %v p99 %v over %d requests from %d clients; healthy p50 before %v after %v; over %d failing requests RSS %.1f -> %.1f MiB, heap in use %.1f -> %.1f MiB (race build)",
		p50, p99, n, workers, before, after, 2*n, rss0/(1<<20), rss1/(1<<20), heap0/(1<<20), heap1/(1<<20))
	if growth := heap1 - heap0; growth > 8<<20 {
		t.Errorf("heap in use grew by %.1f MiB over %d failing requests, want under 8 MiB", growth/(1<<20), 2*n)
	}
	if p99 > time.Second {
		t.Errorf("502 p99 got %v, want well under 1s: a dead upstream must fail fast", p99)
	}
	if growth := rss1 - rss0; growth > 32<<20 {
		t.Errorf("RSS grew by %.1f MiB over %d failing requests, want under 32 MiB", growth/(1<<20), 2*n)
	}
	if after > 3*before+20*time.Millisecond {
		t.Errorf("healthy p50 after the outage got %v, want about the %v before it", after, before)
	}
	c.CloseIdleConnections()
	eventually(t, "goroutines back to the level before the bursts", func() bool {
		return metric(t, g.admin, "go_goroutines") <= goroutines0+4
	})
	a := fetch(c, g.proxy+"/")
	sent++
	if got, want := remaining(t, a), faultLimit-sent; got != want {
		t.Errorf("after %d requests X-RateLimit-Remaining got %d, want %d", sent, got, want)
	}
	if got := metric(t, g.admin, `ratelimit_upstream_errors_total{reason="refused"}`); got < 3*n {
		t.Errorf("refused upstream errors got %v, want at least %d", got, 3*n)
	}
}

// dialRaw opens a plain TCP connection to an http://host:port URL.
func dialRaw(t *testing.T, url string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reads from c until the peer closes it and returns how long that took from start;
// it fails the test when the peer keeps it open past limit. Anything the peer sends is returned.
func closedWithin(t *testing.T, c net.Conn, start time.Time, limit time.Duration) (time.Duration, string) {
	t.Helper()
	if err := c.SetReadDeadline(start.Add(limit)); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v, want the gateway to close it", limit)
	}
	return time.Since(start), string(b)
}

// TestFaultClientDisconnects has clients leave in the middle of their request, while the
// upstream works on it and while they upload a body. The gateway passes the cancellation on to
// the upstream, counts it, answers nobody, and frees what the request held.
func TestFaultClientDisconnects(t *testing.T) {
	arrived := make(chan string, 4)
	canceled := make(chan string, 4)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/after" {
			return
		}
		arrived <- r.URL.Path
		if r.URL.Path == "/upload" {
			_, err := io.Copy(io.Discard, r.Body)
			if err != nil {
				canceled <- "upload: " + err.Error()
				return
			}
			canceled <- "upload: complete"
			return
		}
		<-r.Context().Done()
		canceled <- "hold: " + r.Context().Err().Error()
	})
	g := startGateway(t, up.URL, countingPolicy)
	goroutines0 := metric(t, g.admin, "go_goroutines")

	// Leaves while the upstream works.
	c := dialRaw(t, g.proxy)
	fmt.Fprintf(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := <-arrived; got != "/hold" {
		t.Fatalf("upstream got %s, want /hold", got)
	}
	c.Close()
	select {
	case got := <-canceled:
		if got != "hold: context canceled" {
			t.Errorf("upstream saw %q, want its request canceled", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream's request was not canceled 5s after the client left")
	}
	eventually(t, "the cancel counted", func() bool {
		return metric(t, g.admin, `ratelimit_client_canceled_total{stage="upstream"}`) == 1
	})

	// Leaves after 1 KiB of a 1 MiB body.
	c = dialRaw(t, g.proxy)
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", 1<<20, strings.Repeat("z", 1024))
	if got := <-arrived; got != "/upload" {
		t.Fatalf("upstream got %s, want /upload", got)
	}
	c.Close()
	select {
	case got := <-canceled:
		if got == "upload: complete" {
			t.Errorf("upstream read a complete body from a client that sent 1 KiB of 1 MiB")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream was still reading the body 5s after the client left")
	}
	eventually(t, "goroutines back to the level before", func() bool {
		return metric(t, g.admin, "go_goroutines") <= goroutines0+2
	})
	if a := fetch(newClient(t, 5*time.Second), g.proxy+"/after"); a.err != nil {
		t.Errorf("request after the disconnects: %v", a.err)
	}
	if got := metric(t, g.admin, `ratelimit_decisions_total{result="allowed"}`); got != 3 {
		t.Errorf("allowed decisions got %v, want 3 (each request charged once)", got)
	}
	// Both leavers are counted as clients that went away, neither as an upstream failure.
	eventually(t, "both cancels counted", func() bool {
		return metric(t, g.admin, `ratelimit_client_canceled_total{stage="upstream"}`) == 2
	})
	for _, r := range []string{"refused", "reset", "other", "timeout", "aborted"} {
		if got := metric(t, g.admin, fmt.Sprintf(`ratelimit_upstream_errors_total{reason=%q}`, r)); got != 0 {
			t.Errorf("ratelimit_upstream_errors_total{reason=%q} got %v, want 0: a client leaving is not an upstream error", r, got)
		}
	}
}

// TestFaultSlowlorisHeaders opens many connections that send their headers a few bytes at a
// time. server.read_header_timeout cuts each off, and ordinary clients are served meanwhile.
func TestFaultSlowlorisHeaders(t *testing.T) {
	up := newUpstream(t, nil)
	const timeout = 500 * time.Millisecond
	g := startGateway(t, up.URL, "server:\n  read_header_timeout: 500ms\n"+countingPolicy)
	const n = 50
	conns := make([]net.Conn, n)
	start := time.Now()
	for i := range conns {
		conns[i] = dialRaw(t, g.proxy)
		fmt.Fprintf(conns[i], "GET / HTTP/1.1\r\nHost: x\r\n")
	}
	// Dribble a header line every 100ms on every connection, never finishing the block.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
				for _, c := range conns {
					fmt.Fprintf(c, "X-Slow-%d: x\r\n", i)
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	if a := fetch(newClient(t, 5*time.Second), g.proxy+"/"); a.err != nil || a.status != 200 || a.took > timeout {
		t.Errorf("ordinary request beside %d slowloris connections: got %d %v after %v", n, a.status, a.err, a.took)
	}
	var worst time.Duration
	for _, c := range conns {
		took, _ := closedWithin(t, c, start, timeout+2*time.Second)
		worst = max(worst, took)
	}
	if worst < timeout {
		t.Errorf("a slowloris connection was closed after %v, before the %v timeout", worst, timeout)
	}
	t.Logf("%d slowloris connections closed, the last %v after opening (read_header_timeout %v)", n, worst, timeout)
	// Counted: net/http answers them itself, and the operator must still see them.
	eventually(t, "slowloris connections counted", func() bool {
		return metric(t, g.admin, "ratelimit_proxy_connections_unserved_total") >= n
	})
	if got := metric(t, g.admin, `ratelimit_decisions_total{result="allowed"}`); got != 1 {
		t.Errorf("allowed decisions got %v, want 1: an incomplete header block must never reach the limiter", got)
	}
}

// TestFaultSlowlorisBody sends a complete header block and then the body at 10 bytes a second:
// server.read_timeout must cut the client off, so it cannot hold a connection, a handler and an
// upstream request as long as it likes.
func TestFaultSlowlorisBody(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	const timeout = time.Second
	rest := "server:\n  read_header_timeout: 500ms\n  read_timeout: 1s\n" + countingPolicy
	g := startGateway(t, up.URL, rest)
	c := dialRaw(t, g.proxy)
	start := time.Now()
	fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte("z")); err != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	took, reply := closedWithin(t, c, start, timeout+2*time.Second)
	t.Logf("slow body cut off after %v; the client read %q", took, reply)
	// The client is still there: it is owed an answer that says what happened, not an empty 200.
	if !strings.HasPrefix(reply, "HTTP/1.1 408 ") || !strings.Contains(reply, "application/problem+json") ||
		!strings.Contains(reply, `"status":408`) {
		t.Errorf("slow body: got %q, want a 408 problem+json", reply)
	}
	eventually(t, "slow body counted", func() bool {
		return metric(t, g.admin, "ratelimit_proxy_body_timeouts_total") == 1
	})
	if took < timeout/2 {
		t.Errorf("slow body cut off after %v, before the %v timeout", took, timeout)
	}
}

// TestFaultSIGTERMUnderLoad signals the gateway while clients keep firing and every client has a
// request in flight at the upstream. Every request that the gateway accepted (that reached the
// upstream) must get its complete answer; the ones it did not accept fail to connect; the
// process exits 0.
func TestFaultSIGTERMUnderLoad(t *testing.T) {
	const clients = 32
	var (
		hold     atomic.Bool
		held     atomic.Int64
		release  = make(chan struct{})
		seenMu   sync.Mutex
		seen     = map[string]bool{}
		answered atomic.Int64
	)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Req-Id")
		seenMu.Lock()
		seen[id] = true
		seenMu.Unlock()
		if hold.Load() {
			held.Add(1)
			<-release
		}
		io.WriteString(w, "done "+id)
	})
	g := startGateway(t, up.URL, "server:\n  drain_timeout: 20s\n"+countingPolicy)
	c := newClient(t, 30*time.Second)

	type outcome struct {
		id string
		a  answer
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		wg       sync.WaitGroup
	)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				id := fmt.Sprintf("%d-%d", i, n)
				a := fetch(c, g.proxy+"/", "X-Req-Id", id)
				mu.Lock()
				outcomes = append(outcomes, outcome{id, a})
				mu.Unlock()
				if a.err != nil {
					return // the listener has closed: this client is done
				}
				answered.Add(1)
			}
		}()
	}
	eventually(t, "500 answers under load", func() bool { return answered.Load() >= 500 })
	hold.Store(true)
	eventually(t, "every client in flight at the upstream", func() bool { return held.Load() >= clients })

	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	g.waitListenerClosed(t)
	select {
	case <-g.exited:
		t.Fatalf("gateway exited with %d requests in flight: %v", held.Load(), g.exitErr)
	default:
	}
	released := time.Now()
	close(release)
	wg.Wait()
	select {
	case <-g.exited:
		if g.exitErr != nil {
			t.Errorf("exit after drain: %v, want status 0", g.exitErr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("gateway did not exit after draining")
	}
	drained := time.Since(released)

	seenMu.Lock()
	defer seenMu.Unlock()
	var ok, refused int
	for _, o := range outcomes {
		switch {
		case o.a.err == nil:
			if o.a.status != 200 || o.a.body != "done "+o.id {
				t.Errorf("request %s: got %d %q, want 200 %q", o.id, o.a.status, o.a.body, "done "+o.id)
			}
			ok++
		case seen[o.id]:
			t.Errorf("request %s reached the upstream but its answer was lost: %v", o.id, o.a.err)
		case errors.Is(o.a.err, syscall.ECONNREFUSED):
			refused++
		default:
			t.Errorf("request %s (never accepted) failed with %v, want connection refused", o.id, o.a.err)
		}
	}
	if ok < 500+clients {
		t.Errorf("got %d complete answers, want at least %d", ok, 500+clients)
	}
	t.Logf("SIGTERM with %d requests in flight: %d complete answers, %d refused after the listener closed, none lost; exit %v after %v",
		held.Load(), ok, refused, g.exitErr, drained)
}

// Two policy sets whose every name and limit differ, so that one response mixing them would
// show: X-RateLimit-Limit, RateLimit and RateLimit-Policy must all come from one set.
const (
	reloadSetA = `headers:
  ietf_draft: true
policies:
  - name: a1
    key: ip
    algorithm: token_bucket
    rate: 100000/s
    burst: 100000
  - name: a2
    key: global
    algorithm: fixed_window
    limit: 200000
    window: 1s
`
	reloadSetB = `headers:
  ietf_draft: true
policies:
  - name: b1
    key: ip
    algorithm: token_bucket
    rate: 300000/s
    burst: 300000
  - name: b2
    key: global
    algorithm: fixed_window
    limit: 400000
    window: 1s
`
)

// decisionSet says which policy set produced a response ("a" or "b"), or why it cannot tell.
func decisionSet(h http.Header) (string, error) {
	var names []string
	var qs []string
	for _, p := range strings.Split(h.Get("RateLimit-Policy"), ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(p), ";")
		names = append(names, strings.Trim(name, `"`))
		for _, kv := range strings.Split(params, ";") {
			if q, ok := strings.CutPrefix(kv, "q="); ok {
				qs = append(qs, q)
			}
		}
	}
	rl, _, _ := strings.Cut(h.Get("RateLimit"), ";")
	names = append(names, strings.Trim(rl, `"`))
	set := ""
	for _, n := range names {
		if len(n) != 2 || (n[0] != 'a' && n[0] != 'b') {
			return "", fmt.Errorf("unexpected policy name %q", n)
		}
		if set == "" {
			set = n[:1]
		}
		if n[:1] != set {
			return "", fmt.Errorf("policies of both sets in one response: %v", names)
		}
	}
	if limit := h.Get("X-RateLimit-Limit"); !slices.Contains(qs, limit) {
		return "", fmt.Errorf("X-RateLimit-Limit %s is no q of this response's policies %v", limit, qs)
	}
	return set, nil
}

// TestFaultReloadUnderLoad hammers the gateway while its file is rewritten between two valid
// policy sets, an invalid file and a half-written one. No request may fail, no response may mix
// the sets, and a bad file leaves the running set in force.
func TestFaultReloadUnderLoad(t *testing.T) {
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, reloadSetA)
	pa, aa := strings.TrimPrefix(g.proxy, "http://"), strings.TrimPrefix(g.admin, "http://")
	full := func(rest string) []byte { return []byte(config(pa, aa, up.URL, rest)) }
	c := newClient(t, 10*time.Second)

	var (
		current atomic.Value // the set the last response came from
		counts  [2]atomic.Int64
		total   atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		errMu   sync.Mutex
		errs    []string
	)
	current.Store("a")
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				a := fetch(c, g.proxy+"/")
				total.Add(1)
				set, err := decisionSet(a.header)
				if a.err != nil || a.status != 200 || err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Sprintf("got %d %v %v (headers %v)", a.status, a.err, err, a.header))
					errMu.Unlock()
					continue
				}
				current.Store(set)
				counts[set[0]-'a'].Add(1)
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	errors0 := 0.0
	reloadErrors := func() float64 { return metric(t, g.admin, `ratelimit_config_reloads_total{result="error"}`) }
	inForce := func(want string) {
		t.Helper()
		eventually(t, "set "+want+" in force", func() bool {
			a := fetch(c, g.proxy+"/")
			set, err := decisionSet(a.header)
			return err == nil && set == want
		})
	}
	stays := func(want string) {
		t.Helper()
		eventually(t, "the bad file counted", func() bool { return reloadErrors() > errors0 })
		errors0 = reloadErrors()
		for i := 0; i < 20; i++ {
			a := fetch(c, g.proxy+"/")
			if set, err := decisionSet(a.header); err != nil || set != want {
				t.Fatalf("after a bad file: got set %q (%v), want the running set %q to stay", set, err, want)
			}
		}
	}
	// Cut inside "token_bucket": the first half alone is an unknown algorithm.
	halfB := full(reloadSetB)
	halfB = halfB[:strings.Index(string(halfB), "token_bucket")+5]
	invalid := full(strings.Replace(reloadSetB, "300000/s", "300000/x", 1))

	for round := 0; round < 2; round++ {
		if err := os.WriteFile(g.configPath, full(reloadSetB), 0o600); err != nil {
			t.Fatal(err)
		}
		inForce("b")
		errors0 = reloadErrors()
		if err := os.WriteFile(g.configPath, invalid, 0o600); err != nil {
			t.Fatal(err)
		}
		stays("b")

		tmp := g.configPath + ".tmp"
		if err := os.WriteFile(tmp, full(reloadSetA), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, g.configPath); err != nil {
			t.Fatal(err)
		}
		inForce("a")
		errors0 = reloadErrors()
		if err := os.WriteFile(g.configPath, halfB, 0o600); err != nil {
			t.Fatal(err)
		}
		stays("a")

		// A slow writer: the same half, a pause shorter than the reload debounce, then the rest.
		f, err := os.OpenFile(g.configPath, os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		rest := full(reloadSetB)[len(halfB):]
		if _, err := f.Write(halfB); err != nil {
			t.Fatal(err)
		}
		<-time.After(30 * time.Millisecond) // the writer's own pace, not a wait for the gateway
		if _, err := f.Write(rest); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		inForce("b")
		if err := os.WriteFile(g.configPath, full(reloadSetA), 0o600); err != nil {
			t.Fatal(err)
		}
		inForce("a")
	}

	errMu.Lock()
	defer errMu.Unlock()
	for i, e := range errs {
		if i == 10 {
			t.Errorf("... and %d more", len(errs)-10)
			break
		}
		t.Errorf("request under reload: %s", e)
	}
	ok, bad := metric(t, g.admin, `ratelimit_config_reloads_total{result="success"}`), reloadErrors()
	t.Logf("%d requests under %v reloads and %v rejected files: %d from set a, %d from set b, %d failed or mixed",
		total.Load(), ok, bad, counts[0].Load(), counts[1].Load(), len(errs))
	if ok < 8 || bad < 4 {
		t.Errorf("reloads: %v succeeded and %v failed, want at least 8 and 4", ok, bad)
	}
}

// TestBadConfigsServeRefuses runs `validate` and `serve` on every file of the broken-config
// corpus (internal/policy/testdata/bad, whose messages internal/policy's TestBadConfigs checks):
// both exit non-zero, serve without opening a listener, and serve names the same first problem.
func TestBadConfigsServeRefuses(t *testing.T) {
	dir, err := filepath.Abs(filepath.Join("..", "..", "internal", "policy"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "testdata", "bad", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 30 {
		t.Fatalf("got %d bad configs, want at least 30", len(files))
	}
	// The corpus names relative key files (testdata/keys/...) and one unset variable.
	run := func(t *testing.T, args ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "RATELIMIT_TEST_UNSET_SECRET=")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ctx.Err() != nil {
			t.Fatalf("%v still running after 10s: it accepted the file", args)
		}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), stderr.String()
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			t.Parallel()
			code, verr := run(t, "validate", "--config", f)
			if code != 1 {
				t.Fatalf("validate: exit %d, want 1\n%s", code, verr)
			}
			lines := strings.Split(strings.TrimSpace(verr), "\n")
			if len(lines) < 2 {
				t.Fatalf("validate: stderr %q, want the file and at least one problem", verr)
			}
			code, serr := run(t, "serve", "--config", f)
			if code != 1 {
				t.Fatalf("serve: exit %d, want 1\n%s", code, serr)
			}
			// serve reports what validate reports: every problem, each on a line of its own.
			for _, l := range lines[1:] {
				if !strings.Contains(serr, strings.TrimSpace(l)+"\n") {
					t.Errorf("serve stderr\n%s\ndoes not report validate's problem %q on a line of its own", serr, strings.TrimSpace(l))
				}
			}
		})
	}
}
