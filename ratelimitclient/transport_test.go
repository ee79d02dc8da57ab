package ratelimitclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// body is a response body that records how much was read and whether it was closed.
type body struct {
	r      *strings.Reader
	read   atomic.Int64
	closed atomic.Bool
}

func newBody(s string) *body { return &body{r: strings.NewReader(s)} }

func (b *body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *body) Close() error { b.closed.Store(true); return nil }

// script is a Base that answers attempt i with answers[i] (the last one repeats) and records
// each request and the body it carried.
type script struct {
	answers []answer
	err     error // returned instead of a response, when set

	mu       sync.Mutex
	requests []*http.Request
	bodies   []string
	sent     []*body
}

type answer struct {
	status int
	header http.Header
}

func (s *script) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b []byte
	if req.Body != nil {
		var err error
		if b, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		_ = req.Body.Close()
	}
	s.requests = append(s.requests, req)
	s.bodies = append(s.bodies, string(b))
	if s.err != nil {
		return nil, s.err
	}
	a := s.answers[min(len(s.requests), len(s.answers))-1]
	rb := newBody(fmt.Sprintf("answer %d", len(s.requests)))
	s.sent = append(s.sent, rb)
	h := a.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: a.status, Header: h, Body: rb, Request: req}, nil
}

func (s *script) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.requests)
}

// clock is a fake clock whose Sleep records the wait and moves time forward, without sleeping.
type clock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	// cancel, when set, is called by Sleep instead of advancing: the context ends mid-wait.
	cancel context.CancelFunc
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	cancel := c.cancel
	c.now = c.now.Add(d)
	c.mu.Unlock()
	if cancel != nil {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (c *clock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// half is a Rand that always draws the middle of the window, and records the windows.
type half struct {
	mu      sync.Mutex
	windows []time.Duration
}

func (h *half) Int64N(n int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.windows = append(h.windows, time.Duration(n))
	return n / 2
}

type fixture struct {
	base  *script
	clock *clock
	rand  *half
	rt    *Transport
}

// newFixture builds a Transport over a script of answers with a fake clock at t0 and a Rand that
// draws half the window; edit adjusts the options.
func newFixture(t *testing.T, answers []answer, edit func(*Options)) *fixture {
	t.Helper()
	f := &fixture{base: &script{answers: answers}, clock: &clock{now: t0}, rand: &half{}}
	o := Options{Base: f.base, Now: f.clock.Now, Sleep: f.clock.Sleep, Rand: f.rand.Int64N}
	if edit != nil {
		edit(&o)
	}
	rt, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	return f
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func get(t *testing.T, ctx context.Context) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://gateway.test/items", nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func equalDurations(got, want []time.Duration) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// roundTrip runs the request and returns the response's status and body text.
func roundTrip(t *testing.T, rt http.RoundTripper, req *http.Request) (int, string) {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestRetryAfterIsTheFloorAndJitterIsAdded(t *testing.T) {
	f := newFixture(t, []answer{
		{status: 429, header: hdr("Retry-After", "3")},
		{status: 503, header: hdr("Retry-After", t0.Add(3*time.Second+10*time.Second).Format(http.TimeFormat))},
		{status: 200},
	}, nil)
	status, text := roundTrip(t, f.rt, get(t, context.Background()))
	if status != 200 || text != "answer 3" {
		t.Fatalf("got %d %q, want 200 %q", status, text, "answer 3")
	}
	// Retry 1: 3s + half of 1s. Retry 2 (the clock is now at t0+3.5s): the date is 9.5s away,
	// plus half of the doubled window (2s).
	want := []time.Duration{3500 * time.Millisecond, 10500 * time.Millisecond}
	if got := f.clock.waits(); !equalDurations(got, want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
	if got, want := f.rand.windows, []time.Duration{time.Second, 2 * time.Second}; !equalDurations(got, want) {
		t.Errorf("jitter windows = %v, want %v", got, want)
	}
	for i, b := range f.base.sent[:2] {
		if !b.closed.Load() || b.read.Load() != int64(len("answer 1")) {
			t.Errorf("discarded body %d: closed %v, read %d bytes; want closed after reading all %d", i+1, b.closed.Load(), b.read.Load(), len("answer 1"))
		}
	}
}

func TestRateLimitHeaderIsTheFloorWithoutRetryAfter(t *testing.T) {
	f := newFixture(t, []answer{
		{status: 429, header: hdr("RateLimit", `"per-ip";r=0;t=7, "per-key";r=3;t=60`)},
		{status: 200},
	}, nil)
	if status, _ := roundTrip(t, f.rt, get(t, context.Background())); status != 200 {
		t.Fatalf("status %d, want 200", status)
	}
	if got, want := f.clock.waits(), []time.Duration{7500 * time.Millisecond}; !equalDurations(got, want) {
		t.Errorf("waits = %v, want %v", got, want)
	}
}

func TestNoHintIsExponentialBackoffWithFullJitter(t *testing.T) {
	f := newFixture(t, []answer{{status: 503}}, func(o *Options) {
		o.MaxAttempts = 7
		o.BaseDelay = 100 * time.Millisecond
		o.MaxJitter = time.Second
	})
	status, text := roundTrip(t, f.rt, get(t, context.Background()))
	if status != 503 || text != "answer 7" {
		t.Fatalf("got %d %q, want the 7th answer (503)", status, text)
	}
	wantWindows := []time.Duration{100e6, 200e6, 400e6, 800e6, 1e9, 1e9}
	if got := f.rand.windows; !equalDurations(got, wantWindows) {
		t.Errorf("jitter windows = %v, want %v", got, wantWindows)
	}
	wantWaits := []time.Duration{50e6, 100e6, 200e6, 400e6, 500e6, 500e6}
	if got := f.clock.waits(); !equalDurations(got, wantWaits) {
		t.Errorf("waits = %v, want %v", got, wantWaits)
	}
	// Every discarded body closed; the returned one was left for the caller (and read by it).
	for i, b := range f.base.sent {
		if !b.closed.Load() {
			t.Errorf("body %d not closed", i+1)
		}
	}
}

func TestAttemptsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		max, want int
	}{{0, DefaultMaxAttempts}, {1, 1}, {2, 2}, {5, 5}} {
		f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", "1")}}, func(o *Options) { o.MaxAttempts = tc.max })
		resp, err := f.rt.RoundTrip(get(t, context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 429 {
			t.Errorf("MaxAttempts %d: status %d, want the last 429", tc.max, resp.StatusCode)
		}
		if got := f.base.attempts(); got != tc.want {
			t.Errorf("MaxAttempts %d: %d attempts, want %d", tc.max, got, tc.want)
		}
		last := f.base.sent[len(f.base.sent)-1]
		if last.closed.Load() || last.read.Load() != 0 {
			t.Errorf("MaxAttempts %d: the returned body was read or closed by the transport", tc.max)
		}
		resp.Body.Close()
	}
}

func TestOnlyTooManyRequestsAndUnavailableAreRetried(t *testing.T) {
	for _, code := range []int{200, 204, 304, 400, 401, 403, 404, 500, 502, 504} {
		f := newFixture(t, []answer{{status: code, header: hdr("Retry-After", "1")}, {status: 200}}, nil)
		if status, _ := roundTrip(t, f.rt, get(t, context.Background())); status != code {
			t.Errorf("status %d: returned %d", code, status)
		}
		if got := f.base.attempts(); got != 1 {
			t.Errorf("status %d: %d attempts, want 1", code, got)
		}
	}
}

func TestWhichRequestsAreRetried(t *testing.T) {
	type reqSpec struct {
		method string
		body   io.Reader // a *strings.Reader gets GetBody from http.NewRequest
		opaque bool      // hide the body's type so that GetBody stays nil
		header http.Header
	}
	tests := []struct {
		name          string
		req           reqSpec
		nonIdempotent bool
		wantAttempts  int
	}{
		{"GET", reqSpec{method: "GET"}, false, 2},
		{"HEAD", reqSpec{method: "HEAD"}, false, 2},
		{"OPTIONS", reqSpec{method: "OPTIONS"}, false, 2},
		{"TRACE", reqSpec{method: "TRACE"}, false, 2},
		{"DELETE", reqSpec{method: "DELETE"}, false, 2},
		{"PUT with replayable body", reqSpec{method: "PUT", body: strings.NewReader("v=1")}, false, 2},
		{"PUT with one-shot body", reqSpec{method: "PUT", body: strings.NewReader("v=1"), opaque: true}, false, 1},
		{"POST", reqSpec{method: "POST", body: strings.NewReader("v=1")}, false, 1},
		{"PATCH", reqSpec{method: "PATCH", body: strings.NewReader("v=1")}, false, 1},
		{"POST with Idempotency-Key", reqSpec{method: "POST", body: strings.NewReader("v=1"), header: hdr("Idempotency-Key", `"k1"`)}, false, 2},
		{"POST with X-Idempotency-Key", reqSpec{method: "POST", body: strings.NewReader("v=1"), header: hdr("X-Idempotency-Key", "k1")}, false, 2},
		{"POST with Idempotency-Key and one-shot body", reqSpec{method: "POST", body: strings.NewReader("v=1"), opaque: true, header: hdr("Idempotency-Key", "k1")}, false, 1},
		{"POST, RetryNonIdempotent", reqSpec{method: "POST", body: strings.NewReader("v=1")}, true, 2},
		{"POST without body, RetryNonIdempotent", reqSpec{method: "POST"}, true, 2},
		{"POST with one-shot body, RetryNonIdempotent", reqSpec{method: "POST", body: strings.NewReader("v=1"), opaque: true}, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", "1")}, {status: 201}}, func(o *Options) {
				o.RetryNonIdempotent = tc.nonIdempotent
			})
			b := tc.req.body
			if tc.req.opaque {
				b = io.MultiReader(b)
			}
			req, err := http.NewRequest(tc.req.method, "http://gateway.test/items", b)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.req.header {
				req.Header[k] = v
			}
			resp, err := f.rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := f.base.attempts(); got != tc.wantAttempts {
				t.Fatalf("%d attempts, want %d", got, tc.wantAttempts)
			}
			wantStatus := map[int]int{1: 429, 2: 201}[tc.wantAttempts]
			if resp.StatusCode != wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, wantStatus)
			}
			// Every attempt carried the whole body and the same headers.
			want := ""
			if tc.req.body != nil {
				want = "v=1"
			}
			for i, got := range f.base.bodies {
				if got != want {
					t.Errorf("attempt %d sent body %q, want %q", i+1, got, want)
				}
				if r := f.base.requests[i]; r.Method != tc.req.method || r.Header.Get("Idempotency-Key") != req.Header.Get("Idempotency-Key") {
					t.Errorf("attempt %d: %s with Idempotency-Key %q, want %s with %q", i+1, r.Method, r.Header.Get("Idempotency-Key"), tc.req.method, req.Header.Get("Idempotency-Key"))
				}
			}
			if tc.wantAttempts == 2 && f.base.requests[0] != req {
				t.Error("the first attempt was not the caller's request")
			}
		})
	}
}

func TestGetBodyFailureIsReturned(t *testing.T) {
	f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", "1")}}, nil)
	req, err := http.NewRequest(http.MethodPut, "http://gateway.test/items", strings.NewReader("v=1"))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
	resp, err := f.rt.RoundTrip(req)
	if !errors.Is(err, boom) || resp != nil {
		t.Fatalf("RoundTrip = %v, %v; want nil and an error wrapping %v", resp, err, boom)
	}
}

func TestBaseErrorIsReturnedWithoutRetry(t *testing.T) {
	f := newFixture(t, nil, nil)
	refused := errors.New("connection refused")
	f.base.err = refused
	resp, err := f.rt.RoundTrip(get(t, context.Background()))
	if !errors.Is(err, refused) || resp != nil {
		t.Fatalf("RoundTrip = %v, %v; want nil, %v", resp, err, refused)
	}
	if got := f.base.attempts(); got != 1 {
		t.Errorf("%d attempts, want 1", got)
	}
}

func TestNeverSleepsPastTheDeadline(t *testing.T) {
	tests := []struct {
		name         string
		retryAfter   string
		deadline     time.Duration // after t0
		wantAttempts int
		wantWaits    []time.Duration
	}{
		// The floor alone passes the deadline: the 429 comes back at once.
		{"floor past deadline", "5", 2 * time.Second, 1, nil},
		// The floor fits but floor + jitter (1.5s) would end at the deadline.
		{"floor plus jitter reaches deadline", "1", 1500 * time.Millisecond, 1, nil},
		{"fits", "1", 1501 * time.Millisecond, 2, []time.Duration{1500 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", tc.retryAfter)}, {status: 200}}, nil)
			// The deadline is on the fake clock's time line; t0 is far in the future, so the
			// real context never expires during the test.
			ctx, cancel := context.WithDeadline(context.Background(), t0.Add(tc.deadline))
			defer cancel()
			resp, err := f.rt.RoundTrip(get(t, ctx))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if got := f.base.attempts(); got != tc.wantAttempts {
				t.Errorf("%d attempts, want %d", got, tc.wantAttempts)
			}
			if got := f.clock.waits(); !equalDurations(got, tc.wantWaits) {
				t.Errorf("waits = %v, want %v", got, tc.wantWaits)
			}
			if tc.wantAttempts == 1 {
				if resp.StatusCode != 429 {
					t.Errorf("status %d, want the 429 at once", resp.StatusCode)
				}
				if b, _ := io.ReadAll(resp.Body); string(b) != "answer 1" {
					t.Errorf("body %q, want the 429's body intact", b)
				}
			}
		})
	}
}

func TestMaxWait(t *testing.T) {
	tests := []struct {
		name         string
		maxWait      time.Duration
		retryAfter   string
		wantAttempts int
		wantWaits    []time.Duration
	}{
		{"floor beyond MaxWait returns at once", 10 * time.Second, "11", 1, nil},
		{"floor plus jitter cut to MaxWait", 10 * time.Second, "10", 2, []time.Duration{10 * time.Second}},
		{"default MaxWait", 0, "121", 1, nil},
		{"default MaxWait fits", 0, "119", 2, []time.Duration{119500 * time.Millisecond}},
		{"no limit", -1, "86400", 2, []time.Duration{86400*time.Second + 500*time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", tc.retryAfter)}, {status: 200}},
				func(o *Options) { o.MaxWait = tc.maxWait })
			resp, err := f.rt.RoundTrip(get(t, context.Background()))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := f.base.attempts(); got != tc.wantAttempts {
				t.Errorf("%d attempts, want %d", got, tc.wantAttempts)
			}
			if got := f.clock.waits(); !equalDurations(got, tc.wantWaits) {
				t.Errorf("waits = %v, want %v", got, tc.wantWaits)
			}
		})
	}
}

func TestHugeFloorDoesNotOverflow(t *testing.T) {
	f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", "99999999999999999999")}, {status: 200}},
		func(o *Options) { o.MaxWait = -1 })
	resp, err := f.rt.RoundTrip(get(t, context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := f.clock.waits(); len(got) != 1 || got[0] <= 0 {
		t.Errorf("waits = %v, want one positive (saturated) wait", got)
	}
}

func TestContextEndingDuringTheWait(t *testing.T) {
	f := newFixture(t, []answer{{status: 429, header: hdr("Retry-After", "2")}, {status: 200}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.clock.cancel = cancel
	resp, err := f.rt.RoundTrip(get(t, ctx))
	if !errors.Is(err, context.Canceled) || resp != nil {
		t.Fatalf("RoundTrip = %v, %v; want nil and an error wrapping context.Canceled", resp, err)
	}
	if !strings.Contains(err.Error(), "attempt 2 of 3") {
		t.Errorf("error %q does not say which attempt it was waiting for", err)
	}
	if got := f.base.attempts(); got != 1 {
		t.Errorf("%d attempts, want 1", got)
	}
	if !f.base.sent[0].closed.Load() {
		t.Error("the discarded 429 body was not closed")
	}
}

// TestDefaultSleepHonoursTheContext: the real timer-based wait returns as soon as the context
// ends (here it has ended already), not after the hour the server asked for.
func TestDefaultSleepHonoursTheContext(t *testing.T) {
	base := &script{answers: []answer{{status: 503, header: hdr("Retry-After", "3600")}}}
	rt, err := New(Options{Base: base, MaxWait: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("shutting down")
	cancel(stop)
	resp, err := rt.RoundTrip(get(t, ctx))
	if !errors.Is(err, stop) || resp != nil {
		t.Fatalf("RoundTrip = %v, %v; want nil and an error wrapping the cancel cause", resp, err)
	}
}

func TestNewRejectsNegativeOptions(t *testing.T) {
	tests := []struct {
		o    Options
		want string
	}{
		{Options{MaxAttempts: -1}, `ratelimitclient: Options.MaxAttempts: -1: must not be negative`},
		{Options{BaseDelay: -time.Second}, `ratelimitclient: Options.BaseDelay: "-1s": must not be negative`},
		{Options{MaxJitter: -time.Millisecond}, `ratelimitclient: Options.MaxJitter: "-1ms": must not be negative`},
	}
	for _, tc := range tests {
		rt, err := New(tc.o)
		if err == nil || err.Error() != tc.want || rt != nil {
			t.Errorf("New(%+v) = %v, %v; want nil, %q", tc.o, rt, err, tc.want)
		}
	}
}

// TestRealSocketsReuseTheConnection: against a real server, the retried request succeeds and
// travels on the connection of the 429, because the discarded body was drained and closed.
func TestRealSocketsReuseTheConnection(t *testing.T) {
	var calls, conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.Copy(w, bytes.NewReader(bytes.Repeat([]byte("x"), 10<<10)))
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := &clock{now: time.Now()}
	rt, err := New(Options{Base: srv.Client().Transport, Now: c.Now, Sleep: c.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	status, text := roundTrip(t, rt, req)
	if status != 200 || text != "ok" {
		t.Fatalf("got %d %q, want 200 %q", status, text, "ok")
	}
	if w := c.waits(); len(w) != 1 || w[0] < time.Second || w[0] >= 2*time.Second {
		t.Errorf("waits = %v, want one in [1s, 2s)", w)
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("%d connections, want 1 (the 429's body was not drained)", got)
	}
}

// TestConcurrentUse: one Transport shared by many goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	base := &script{answers: []answer{{status: 429, header: hdr("Retry-After", "0")}, {status: 200}}}
	c := &clock{now: t0}
	rt, err := New(Options{Base: base, Now: c.Now, Sleep: c.Sleep, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			resp, err := rt.RoundTrip(get(t, context.Background()))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	// Each goroutine made one or two attempts, depending on whether its first one was the
	// script's first answer (429); exactly one of them was.
	if got := base.attempts(); got != 17 {
		t.Errorf("%d attempts, want 17 (16 plus the one retry)", got)
	}
	for _, w := range c.waits() {
		if w < 0 || w >= time.Second {
			t.Errorf("wait %v outside the first jitter window [0, 1s)", w)
		}
	}
}

type idleCloser struct {
	script
	closed atomic.Int64
}

func (c *idleCloser) CloseIdleConnections() { c.closed.Add(1) }

func TestCloseIdleConnectionsReachesBase(t *testing.T) {
	base := &idleCloser{}
	rt, err := New(Options{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	(&http.Client{Transport: rt}).CloseIdleConnections()
	if got := base.closed.Load(); got != 1 {
		t.Errorf("Base.CloseIdleConnections called %d times, want 1", got)
	}
	// A Base without the method is left alone.
	rt, err = New(Options{Base: &base.script})
	if err != nil {
		t.Fatal(err)
	}
	rt.CloseIdleConnections()
}

// TestClientTimeoutIsADeadline: http.Client.Timeout reaches the transport as the context's
// deadline, so a wait longer than the timeout returns the 429 at once instead of sleeping into
// a timeout error.
func TestClientTimeoutIsADeadline(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	c := &clock{now: time.Now()}
	rt, err := New(Options{Base: srv.Client().Transport, Now: c.Now, Sleep: c.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 429 || calls.Load() != 1 || len(c.waits()) != 0 {
		t.Errorf("status %d after %d requests and waits %v; want the first 429, no wait", resp.StatusCode, calls.Load(), c.waits())
	}
}
