package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// The upstream protection against clients that try to hold its slots or choose their own
// priority (issue 32 items 7 to 10): every test here uses real sockets and the real binary.

// rawConn dials the gateway's proxy listener.
func rawConn(t *testing.T, g *gateway) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(g.proxy, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestProtectSlowUploadsHoldNoSlot: with a fixed limit of 2 and no queue, 4 clients that send
// the headers of a small upload and then trickle its body hold no slot while they do (their
// bodies are buffered before a slot is taken), so an honest request passes; once a trickled
// body is complete its request is forwarded. On 85d8db7 the honest request was shed 503.
func TestProtectSlowUploadsHoldNoSlot(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "got %d", len(b))
	})
	g := startGateway(t, up.URL, "protect: {concurrency: {adaptive: false, limit: 2}}\n"+protectPolicy)
	conns := make([]net.Conn, 4)
	for i := range conns {
		c := rawConn(t, g)
		if _, err := fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab"); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	// Every trickler's request was judged by the policies (which happens before the body is
	// read, and before any slot is taken).
	eventually(t, "the tricklers' requests judged", func() bool {
		return metric(t, g.admin, `ratelimit_requests_total{policy="lenient",result="allowed"}`) >= 4
	})
	if got := metric(t, g.admin, "ratelimit_upstream_inflight"); got != 0 {
		t.Errorf("inflight with 4 bodies being trickled: %v, want 0", got)
	}
	if res, body := get(t, g.proxy+"/x"); res.StatusCode != http.StatusOK {
		t.Fatalf("honest request beside 4 slow uploads: got %d %s, want 200", res.StatusCode, body)
	}
	// A trickled body that completes is forwarded whole.
	if _, err := io.WriteString(conns[0], "cd"); err != nil {
		t.Fatal(err)
	}
	_ = conns[0].SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conns[0]), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(b) != "got 4" {
		t.Errorf("completed slow upload: got %d %q, want 200 \"got 4\"", res.StatusCode, b)
	}
}

// TestProtectStreamingUploadsPerClientShare: a body past protect.max_buffered_body streams,
// and one client's streaming requests hold at most its share of the limit (stream_share 0.25
// of 4: one slot); the other slots stay free for everyone else.
func TestProtectStreamingUploadsPerClientShare(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("ok"))
	})
	g := startGateway(t, up.URL, "protect: {concurrency: {adaptive: false, limit: 4}, max_buffered_body: 16, stream_share: 0.25}\n"+protectPolicy)
	head := "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("a", 32)
	first := rawConn(t, g)
	if _, err := io.WriteString(first, head); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first streaming upload holds a slot", func() bool {
		return metric(t, g.admin, "ratelimit_upstream_inflight") == 1
	})
	second := rawConn(t, g)
	if _, err := io.WriteString(second, head); err != nil {
		t.Fatal(err)
	}
	_ = second.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(second), nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("the same client's second streaming upload: got %d, want 503 (its share is 1 slot)", res.StatusCode)
	}
	for i := 0; i < 3; i++ {
		if res, body := get(t, g.proxy+"/x"); res.StatusCode != http.StatusOK {
			t.Fatalf("honest request %d beside a streaming upload: got %d %s, want 200", i, res.StatusCode, body)
		}
	}
}

// TestProtectSlowReaderReleasedWithinWriteStall: a client that asks for a large answer and never
// reads it loses its slot and its connection within server.write_stall_timeout, so the next
// request passes a limit of 1; an event stream that is read, with pauses longer than the
// timeout between events, is not cut. On 85d8db7 the field did not exist and the slot was held
// for as long as the client's connection stayed open.
func TestProtectSlowReaderReleasedWithinWriteStall(t *testing.T) {
	big := strings.Repeat("x", 32<<20)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			_, _ = io.WriteString(w, big)
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 3; i++ {
				_, _ = fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(1500 * time.Millisecond) // the upstream's pace, longer than the stall timeout
			}
		default:
			_, _ = w.Write([]byte("ok"))
		}
	})
	g := startGateway(t, up.URL, "server: {write_stall_timeout: 1s}\nprotect: {concurrency: {adaptive: false, limit: 1}}\n"+protectPolicy)
	c := rawConn(t, g)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slow reader holds the slot", func() bool { return metric(t, g.admin, "ratelimit_upstream_inflight") == 1 })
	start := time.Now()
	eventually(t, "the slow reader's slot back", func() bool { return metric(t, g.admin, "ratelimit_upstream_inflight") == 0 })
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("slot back after %v, want about write_stall_timeout (1s)", d)
	}
	// Its connection, the only one open on the proxy listener, is closed too.
	eventually(t, "the slow reader's connection closed", func() bool { return metric(t, g.admin, "ratelimit_proxy_connections") == 0 })
	if res, _ := get(t, g.proxy+"/x"); res.StatusCode != http.StatusOK {
		t.Errorf("after the slow reader: got %d, want 200", res.StatusCode)
	}

	// An event stream read as it comes, silent for longer than the timeout between events.
	res, err := http.Get(g.proxy + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || strings.Count(string(b), "data: ") != 3 {
		t.Errorf("event stream read as it comes: got %q (%v), want its 3 events", b, err)
	}
}

// TestProtectAdaptiveLimitIgnoresAbandonedRequests: ~900 requests abandoned after 3 ms beside
// honest ones, with the upstream unchanged at 40 ms, leave the adaptive limit where the honest
// traffic keeps it (it started, and stays, at 20): an abandoned request says nothing about the
// upstream's latency. On 85d8db7 they counted as 3 ms samples and took the limit to 2.
func TestProtectAdaptiveLimitIgnoresAbandonedRequests(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(40 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	g := startGateway(t, up.URL, "protect: {concurrency: {adaptive: true, limit: 20, min_limit: 2, max_limit: 20}}\n"+protectPolicy)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for i := 0; i < 8; i++ { // honest clients
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.proxy+"/honest", nil)
				if res, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			}
		}()
	}
	abandoned := make(chan struct{}, 900)
	for i := 0; i < 900; i++ {
		abandoned <- struct{}{}
	}
	close(abandoned)
	var ab sync.WaitGroup
	for i := 0; i < 10; i++ {
		ab.Add(1)
		go func() {
			defer ab.Done()
			for range abandoned {
				actx, cancel := context.WithTimeout(ctx, 3*time.Millisecond)
				req, _ := http.NewRequestWithContext(actx, http.MethodGet, g.proxy+"/abandoned", nil)
				if res, err := client.Do(req); err == nil {
					res.Body.Close()
				}
				cancel()
			}
		}()
	}
	ab.Wait()
	// The honest traffic goes on for 3 s: a baseline poisoned by the abandoned requests would
	// now shrink the limit window after window. The lowest limit over those 3 s counts.
	lowest := metric(t, g.admin, "ratelimit_upstream_concurrency_limit")
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		lowest = min(lowest, metric(t, g.admin, "ratelimit_upstream_concurrency_limit"))
	}
	stop()
	wg.Wait()
	// Poisoned, the limit falls to min_limit (2) within the 3 s; honest samples alone keep it
	// near 20, but on a loaded 2-core host the gateway's own scheduling delay is in every honest
	// sample too and has taken it to 15 (make test beside three other builds). Half the start
	// tells the two apart with room on both sides.
	if lowest < 10 {
		t.Errorf("adaptive limit after 900 abandoned requests: %v, want at least 10 (it started at 20, the upstream unchanged; poisoned, it falls to 2)", lowest)
	}
}

// TestProtectPriorityHeaderBelievedOnlyFromTrustedProxies: a priority that rests on a request
// header is believed only from trusted_proxies, and a header sent twice never matches. The
// limit is 2 with half reserved for critical requests and one default request in flight: a
// self-declared critical request from an untrusted peer is shed as the default one it is. On
// 85d8db7 any client's X-Priority: critical passed.
func TestProtectPriorityHeaderBelievedOnlyFromTrustedProxies(t *testing.T) {
	prio := `protect:
  concurrency: {adaptive: false, limit: 2}
  priorities:
    - name: critical
      match: {headers: {X-Priority: critical}}
      reserve: 0.5
`
	for _, c := range []struct {
		name, trusted string
		values        []string
		want          int
	}{
		{"untrusted peer", "", []string{"critical"}, http.StatusServiceUnavailable},
		{"trusted peer", "trusted_proxies: [127.0.0.1/32]\n", []string{"critical"}, http.StatusOK},
		{"trusted peer, two values", "trusted_proxies: [127.0.0.1/32]\n", []string{"low", "critical"}, http.StatusServiceUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, entered, release := blockingUpstream(t)
			g := startGateway(t, up.URL, c.trusted+prio+protectPolicy)
			slow := slowInBackground(t, context.Background(), g.proxy, entered)
			req, _ := http.NewRequest(http.MethodGet, g.proxy+"/x", nil)
			for _, v := range c.values {
				req.Header.Add("X-Priority", v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != c.want {
				t.Errorf("X-Priority %q: got %d, want %d", c.values, res.StatusCode, c.want)
			}
			release()
			<-slow
		})
	}
}
