package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

const mUpstreamErrors = "ratelimit_upstream_errors_total"

// failAfter bounds how long a test waits for something that a broken proxy would never deliver,
// so that such a failure is reported rather than hanging the test binary.
const failAfter = 10 * time.Second

func TestSSE_FlushedAsItArrives(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release: // the client has read the first event
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "data: two\n\n")
	})
	pol := (&fakePolicies{}).add("p", false, 1)
	hs := newHarness(t, pol, newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 9, Remaining: 8}), up, nil)

	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.srv.URL+"/events", nil)
	res, err := hs.client.Do(req)
	if err != nil {
		t.Fatalf("GET /events: %v", err)
	}
	defer res.Body.Close()
	wantHeader(t, res, "X-RateLimit-Remaining", "8")
	br := bufio.NewReader(res.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "data: one\n" {
		t.Fatalf("first line = %q, %v; want %q before the upstream sends the second event", first, err, "data: one\n")
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Errorf("rest = %q, %v; want %q", rest, err, "\ndata: two\n\n")
	}
}

func TestRequestBody_Streamed(t *testing.T) {
	gotFirst := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		br := bufio.NewReader(r.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "first\n" {
			http.Error(w, "bad first line", http.StatusBadRequest)
			return
		}
		close(gotFirst)
		rest, _ := io.ReadAll(br)
		_, _ = io.WriteString(w, line+string(rest))
	})
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, nil)

	pr, pw := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.srv.URL+"/upload", pr)
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		res, err := hs.client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		done <- result{string(b), err}
	}()
	if _, err := io.WriteString(pw, "first\n"); err != nil {
		t.Fatalf("write first: %v", err)
	}
	select {
	case <-gotFirst:
	case <-ctx.Done():
		t.Fatal("the upstream did not get the first line before the body ended: the proxy buffers bodies")
	}
	_, _ = io.WriteString(pw, "second\n")
	_ = pw.Close()
	r := <-done
	if r.err != nil || r.body != "first\nsecond\n" {
		t.Errorf("response = %q, %v; want %q", r.body, r.err, "first\nsecond\n")
	}
}

func TestWebSocket_UpgradePasses(t *testing.T) {
	up := newUpstream(t, websocket.Handler(func(c *websocket.Conn) {
		_, _ = io.Copy(c, c) // echo
	}).ServeHTTP)
	pol := (&fakePolicies{}).add("p", false, 1)
	lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 9, Remaining: 8})
	hs := newHarness(t, pol, lim, up, nil)

	conn := dialWS(t, hs.srv.URL)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(failAfter))
	if err := websocket.Message.Send(conn, "hello"); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got string
	if err := websocket.Message.Receive(conn, &got); err != nil || got != "hello" {
		t.Errorf("echo = %q, %v; want hello", got, err)
	}
	if lim.calls.Load() != 1 || hs.up.hits.Load() != 1 {
		t.Errorf("limiter calls = %d, upstream hits = %d; want 1 and 1", lim.calls.Load(), hs.up.hits.Load())
	}
}

// closedPortURL returns an http URL on which nothing listens.
func closedPortURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	return "http://" + addr
}

func TestUpstreamRefused_502(t *testing.T) {
	pol := (&fakePolicies{}).add("p", false, 1)
	hs := newHarness(t, pol, newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 3, Remaining: 2}), nil,
		func(o *Options) { o.Upstream = mustURL(t, closedPortURL(t)) })

	res, body := hs.get("/")

	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status = %d, want 502", res.StatusCode)
	}
	if p := decodeProblem(t, res, body); p.Type != answer.ProblemBadGateway {
		t.Errorf("type = %q, want %q", p.Type, answer.ProblemBadGateway)
	}
	// The request was charged, so the client still learns its quota.
	wantHeader(t, res, "X-RateLimit-Remaining", "2")
	wantCounter(t, hs.reg, 1, mUpstreamErrors, "reason", "refused")
	if n := hs.logs.FilterMessage("upstream error").Len(); n != 1 {
		t.Errorf("upstream error log lines = %d, want 1", n)
	}
}

func TestUpstreamTimeout_504(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the upstream's Close
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, func(o *Options) {
		tr := NewTransport(0)
		tr.ResponseHeaderTimeout = 20 * time.Millisecond // the timeout under test, not a wait
		t.Cleanup(tr.CloseIdleConnections)
		o.Transport = tr
	})

	res, body := hs.get("/")

	if res.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status = %d, want 504", res.StatusCode)
	}
	if p := decodeProblem(t, res, body); p.Type != answer.ProblemTimeout {
		t.Errorf("type = %q, want %q", p.Type, answer.ProblemTimeout)
	}
	wantCounter(t, hs.reg, 1, mUpstreamErrors, "reason", "timeout")
}

// resetConn closes the connection of the response w with a TCP reset.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close with RST
	}
	_ = conn.Close()
}

func TestUpstreamReset_502(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { resetConn(w) })
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, nil)

	res, body := hs.get("/")

	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status = %d, want 502", res.StatusCode)
	}
	decodeProblem(t, res, body)
	wantCounter(t, hs.reg, 1, mUpstreamErrors, "reason", "reset")
}

// TestUpstreamAbortedBody_Counted: an upstream that resets its connection in the middle of a
// body cannot be answered 502 any more (the status line has gone out); the client's connection is
// aborted and the failure is counted as reason="aborted", once. A complete response is not.
func TestUpstreamAbortedBody_Counted(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/whole" {
			_, _ = io.WriteString(w, "complete")
			return
		}
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "only the first bytes")
		if err := http.NewResponseController(w).Flush(); err != nil {
			return
		}
		resetConn(w)
	})
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, nil)

	if res, body := hs.get("/whole"); res.StatusCode != http.StatusOK || body != "complete" {
		t.Fatalf("whole: got %d %q, want 200 %q", res.StatusCode, body, "complete")
	}
	wantCounter(t, hs.reg, 0, mUpstreamErrors, "reason", "aborted")

	// The client gets an aborted connection: before its headers (they were still buffered) or
	// inside its body. Never a complete-looking response. A fresh connection, because Go's client
	// retries a GET that failed on a reused one (the upstream would be asked twice).
	hs.client.CloseIdleConnections()
	res, err := hs.client.Get(hs.srv.URL + "/cut")
	if err == nil {
		b, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		if rerr == nil || len(b) >= 1000 {
			t.Fatalf("cut body: read %d bytes, err %v; want a short body and an error", len(b), rerr)
		}
	}
	hs.waitServed(2)
	wantCounter(t, hs.reg, 1, mUpstreamErrors, "reason", "aborted")
	for _, r := range []string{"refused", "timeout", "reset", "other"} {
		wantCounter(t, hs.reg, 0, mUpstreamErrors, "reason", r)
	}
}

func TestUpstream_ClientCanceled(t *testing.T) {
	entered := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // the proxy cancels its request when the client goes
	})
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, nil)
	hs.cancelWhenEntered(t, "/slow", entered)
	wantCounter(t, hs.reg, 1, "ratelimit_client_canceled_total", "stage", "upstream")
	for _, r := range upstreamReasonNames {
		wantCounter(t, hs.reg, 0, mUpstreamErrors, "reason", r)
	}
	if n := hs.logs.FilterMessage("upstream error").Len(); n != 0 {
		t.Errorf("upstream error log lines = %d, want 0 for a client that left", n)
	}
}

func TestClassifyUpstream(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{context.DeadlineExceeded, "timeout"},
		{&net.OpError{Op: "dial", Err: timeoutErr{}}, "timeout"},
		{&net.OpError{Op: "dial", Err: errors.New("x")}, "other"},
		{io.ErrUnexpectedEOF, "reset"},
		{errors.New("something else"), "other"},
	}
	for _, tt := range tests {
		if got := upstreamReasonNames[classifyUpstream(tt.err)]; got != tt.want {
			t.Errorf("classifyUpstream(%v) = %s, want %s", tt.err, got, tt.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestNewTransport_Tuned(t *testing.T) {
	tr := NewTransport(0)
	if tr.MaxIdleConns != 1024 || tr.MaxIdleConnsPerHost != 512 || tr.IdleConnTimeout != 90*time.Second {
		t.Errorf("pool = %d/%d/%v, want 1024/512/90s", tr.MaxIdleConns, tr.MaxIdleConnsPerHost, tr.IdleConnTimeout)
	}
	if tr.ResponseHeaderTimeout != 0 {
		t.Errorf("ResponseHeaderTimeout = %v, want unset", tr.ResponseHeaderTimeout)
	}
	if tr.Protocols == nil || !tr.Protocols.HTTP1() || tr.Protocols.HTTP2() || tr.Protocols.UnencryptedHTTP2() {
		t.Errorf("protocols = %v, want HTTP/1 only", tr.Protocols)
	}
	if tr.Proxy != nil {
		t.Error("Proxy is set, want direct connections")
	}
}

func TestCopyBuffers(t *testing.T) {
	var p copyBuffers
	b := p.Get()
	if len(b) != copyBufSize {
		t.Fatalf("len = %d, want %d", len(b), copyBufSize)
	}
	p.Put(b)
	p.Put(make([]byte, 10)) // a foreign size is dropped, not pooled
	if got := len(p.Get()); got != copyBufSize {
		t.Errorf("len after foreign Put = %d, want %d", got, copyBufSize)
	}
}

// dialWS opens a WebSocket to /ws through the proxy at srvURL, within failAfter.
func dialWS(t *testing.T, srvURL string) *websocket.Conn {
	t.Helper()
	cfg, err := websocket.NewConfig("ws"+strings.TrimPrefix(srvURL, "http")+"/ws", srvURL)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), failAfter)
	defer cancel()
	conn, err := cfg.DialContext(ctx)
	if err != nil {
		t.Fatalf("dial through proxy: %v", err)
	}
	return conn
}

// heldUpstream is an upstream, over HTTP/1.1 and h2c, that sends nothing, not even headers,
// until it receives from release (or the request ends); arrived receives the content-type of
// each request as it comes in. release lets every held request answer (it may be called more
// than once). It returns the upstream's URL.
func heldUpstream(t *testing.T) (url string, arrived chan string, release func()) {
	t.Helper()
	arrived, released := make(chan string, 4), make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get("Content-Type")
		select {
		case <-released:
			_, _ = io.WriteString(w, "answered")
		case <-r.Context().Done():
		}
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(release) // runs before the upstream's Close
	return srv.URL, arrived, release
}

// reply is what a client got from the gateway.
type reply struct {
	status     int
	grpcStatus string // the Grpc-Status header of a gRPC answer of the gateway's own
	body       string
	err        error
}

// send POSTs with content-type ct to the gateway of hs, on its own goroutine.
func send(t *testing.T, hs *harness, ct string) <-chan reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, hs.srv.URL+"/svc/Method", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ct)
	out := make(chan reply, 1)
	go func() {
		res, err := hs.client.Do(req)
		if err != nil {
			out <- reply{err: err}
			return
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		out <- reply{status: res.StatusCode, grpcStatus: res.Header.Get("Grpc-Status"), body: string(body), err: err}
	}()
	return out
}

func wait(t *testing.T, ch <-chan reply) reply {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("request failed: %v", a.err)
		}
		return a
	case <-time.After(failAfter):
		t.Fatal("no answer")
		return reply{}
	}
}

// heldHarness is a harness whose Handler builds its own transports with these settings, in
// front of a heldUpstream.
func heldHarness(t *testing.T, p Protocol, upstreamTimeout, grpcTimeout time.Duration) (*harness, chan string, func()) {
	t.Helper()
	url, arrived, release := heldUpstream(t)
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), nil, func(o *Options) {
		o.Upstream = mustURL(t, url)
		o.Transport = nil
		o.UpstreamProtocol = p
		o.UpstreamTimeout = upstreamTimeout
		o.GRPCUpstreamTimeout = grpcTimeout
	})
	// Cleanups run last-in first-out: the held requests must be let go before the gateway's
	// server Close, which waits for them, or a failing test would hang instead of reporting.
	t.Cleanup(release)
	return hs, arrived, release
}

// TestUpstreamTimeout_GRPCWaitsPastIt: with grpc_upstream_timeout 0 a gRPC call waits for its
// headers past the upstream_timeout that cuts a plain request. No clock is compared: the gRPC
// call is sent first and released only after the plain request, sent later with the same
// timer, has timed out, so a timer on the gRPC call would have run out too.
func TestUpstreamTimeout_GRPCWaitsPastIt(t *testing.T) {
	hs, arrived, release := heldHarness(t, HTTP1, 50*time.Millisecond, 0)

	grpcDone := send(t, hs, "application/grpc+proto")
	if ct := <-arrived; ct != "application/grpc+proto" {
		t.Fatalf("first request at the upstream: %q, want the gRPC call", ct)
	}
	plainDone := send(t, hs, "application/json")
	<-arrived
	if a := wait(t, plainDone); a.status != http.StatusGatewayTimeout {
		t.Fatalf("plain request: status %d, want 504", a.status)
	}
	release()
	if a := wait(t, grpcDone); a.status != http.StatusOK || a.grpcStatus != "" || a.body != "answered" {
		t.Errorf("gRPC call: got %+v, want the upstream's answer", a)
	}
	wantCounter(t, hs.reg, 1, mUpstreamErrors, "reason", "timeout")
}

// TestUpstreamTimeout_GRPCOwn: grpc_upstream_timeout, when set, bounds gRPC calls, answered
// DEADLINE_EXCEEDED (and only them: a plain request waits as long as upstream_timeout, here
// none). Over h2c, as gRPC upstreams are spoken to.
func TestUpstreamTimeout_GRPCOwn(t *testing.T) {
	hs, arrived, release := heldHarness(t, H2C, 0, 50*time.Millisecond)

	plainDone := send(t, hs, "text/plain")
	<-arrived
	grpcDone := send(t, hs, "application/grpc")
	<-arrived
	if a := wait(t, grpcDone); a.status != http.StatusOK || a.grpcStatus != "4" {
		t.Fatalf("gRPC call: got %+v, want grpc-status 4 (DEADLINE_EXCEEDED)", a)
	}
	release()
	if a := wait(t, plainDone); a.status != http.StatusOK || a.body != "answered" {
		t.Errorf("plain request: got %+v, want the upstream's answer", a)
	}
}

// TestNew_TransportUsedAsIs: a caller's Transport carries every request, gRPC calls included;
// the timeouts only shape the default transports, split only when they differ.
func TestNew_TransportUsedAsIs(t *testing.T) {
	for _, tc := range []struct {
		transport     http.RoundTripper
		upstream, rpc time.Duration
		split         bool
	}{
		{staticUpstream{}, time.Second, 0, false},
		{staticUpstream{}, 0, time.Second, false},
		{nil, time.Second, time.Second, false},
		{nil, time.Second, 0, true},
	} {
		h, err := New(Options{Upstream: mustURL(t, "http://127.0.0.1:1"), Policies: func() Policies { return &fakePolicies{} },
			Limiter: newFakeLimiter(true), Transport: tc.transport, UpstreamTimeout: tc.upstream, GRPCUpstreamTimeout: tc.rpc})
		if err != nil {
			t.Fatal(err)
		}
		if tc.transport != nil && h.rp.Transport.(timedTransport).next != tc.transport {
			t.Errorf("%+v: transport %T, want the caller's", tc, h.rp.Transport.(timedTransport).next)
		}
		if split := h.rpGRPC != h.rp; split != tc.split {
			t.Errorf("%+v: gRPC calls have a proxy of their own: %v, want %v", tc, split, tc.split)
		}
	}
}
