package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// staticUpstream answers every request 200 with an empty body, without a network.
type staticUpstream struct{}

func (staticUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{
		StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, ContentLength: 0, Request: r,
	}, nil
}

// fixedLimiter copies fixed results; unlike fakeLimiter it records nothing, so parallel
// benchmarks measure the handler and not a test mutex.
type fixedLimiter struct {
	admitted bool
	results  []bucket.Result
}

func (f fixedLimiter) Take(_ context.Context, _ time.Time, _ []bucket.Charge, results []bucket.Result) (bool, error) {
	copy(results, f.results)
	return f.admitted, nil
}

func benchHandler(b *testing.B, admitted bool) *Handler {
	b.Helper()
	return benchHandlerRetry(b, admitted, 1500*time.Millisecond)
}

// benchHandlerRetry is benchHandler with the rejecting charge's RetryAfter; load (d) of
// scripts/bench rejects a hot key limited to 1/h, so its Retry-After is up to 3600 s.
func benchHandlerRetry(b *testing.B, admitted bool, retry time.Duration) *Handler {
	b.Helper()
	pol := (&fakePolicies{}).add("per-ip", false, 1).add("per-key", false, 2).add("global", false, 3)
	res := []bucket.Result{
		{Allowed: true, Limit: 100, Remaining: 50, Reset: time.Second},
		{Allowed: admitted, Limit: 10, Remaining: 3, Reset: 2 * time.Second, RetryAfter: retry},
		{Allowed: true, Limit: 1000, Remaining: 500, Reset: time.Second},
	}
	h, err := New(Options{
		Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
		Policies:  func() Policies { return pol },
		Limiter:   fixedLimiter{admitted: admitted, results: res},
		Transport: staticUpstream{},
	})
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	return h
}

func benchServe(b *testing.B, admitted bool, want int) {
	benchServeHandler(b, benchHandler(b, admitted), want)
}

func benchServeHandler(b *testing.B, h *Handler, want int) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest(http.MethodGet, "http://proxy.local/v1/items", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		for pb.Next() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != want {
				b.Fatalf("status = %d, want %d", rec.Code, want)
			}
		}
	})
}

func BenchmarkHandler_Admitted(b *testing.B) { benchServe(b, true, http.StatusOK) }

func BenchmarkHandler_Rejected(b *testing.B) { benchServe(b, false, http.StatusTooManyRequests) }

// BenchmarkHandler_RejectedHot is the 429 path of load (d): the same hot key rejected with a
// Retry-After of about an hour on every request.
func BenchmarkHandler_RejectedHot(b *testing.B) {
	benchServeHandler(b, benchHandlerRetry(b, false, 3599*time.Second+time.Millisecond), http.StatusTooManyRequests)
}

// discardWriter is a ResponseWriter that keeps only the status, reusing one header map, so the
// *Own benchmarks measure the handler's own work without httptest.ResponseRecorder's allocations
// (which are most of BenchmarkHandler_Rejected's).
type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(code int)        { d.code = code }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func benchServeOwn(b *testing.B, h *Handler, want int) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest(http.MethodGet, "http://proxy.local/v1/items", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		w := &discardWriter{h: make(http.Header)}
		for pb.Next() {
			clear(w.h)
			w.code = 0
			h.ServeHTTP(w, req)
			if w.code != want {
				b.Fatalf("status = %d, want %d", w.code, want)
			}
		}
	})
}

func BenchmarkHandlerOwn_Rejected(b *testing.B) {
	benchServeOwn(b, benchHandler(b, false), http.StatusTooManyRequests)
}

func BenchmarkHandlerOwn_RejectedHot(b *testing.B) {
	benchServeOwn(b, benchHandlerRetry(b, false, 3599*time.Second+time.Millisecond), http.StatusTooManyRequests)
}

// seqLimiter rejects with results[i] on the i-th call (the last one repeats).
type seqLimiter struct {
	results []bucket.Result
	calls   int
}

func (s *seqLimiter) Take(_ context.Context, _ time.Time, _ []bucket.Charge, results []bucket.Result) (bool, error) {
	results[0] = s.results[min(s.calls, len(s.results)-1)]
	s.calls++
	return false, nil
}

// BenchmarkHandler_PlainReverseProxy is configuration (b) of `make bench` in process: a plain
// httputil.ReverseProxy (SetURL, SetXForwarded, a pooled copy buffer) over the same in-memory
// upstream as BenchmarkHandler_Admitted, so that the two differ only by the gateway's own work
// (plan, limiter call, headers, metrics, forwarding rules) and not by sockets or machine drift.
func BenchmarkHandler_PlainReverseProxy(b *testing.B) {
	u := &url.URL{Scheme: "http", Host: "upstream.invalid"}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport:  staticUpstream{},
		BufferPool: copyBuffers{},
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest(http.MethodGet, "http://proxy.local/v1/items", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		for pb.Next() {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("status = %d, want 200", rec.Code)
			}
		}
	})
}

// BenchmarkHandlerOwn_UnauthorizedLimited is a flood of garbage bearer tokens from one address:
// Plan fails verification and leaves the ip charge, which is over its limit (429).
func BenchmarkHandlerOwn_UnauthorizedLimited(b *testing.B) {
	pol := (&fakePolicies{err: fmt.Errorf("jwt: malformed: %w", policy.ErrUnauthorized)}).add("per-ip", false, 1)
	h, err := New(Options{
		Upstream: &url.URL{Scheme: "http", Host: "upstream.invalid"},
		Policies: func() Policies { return pol },
		Limiter: fixedLimiter{results: []bucket.Result{
			{Allowed: false, Limit: 10, Reset: 2 * time.Second, RetryAfter: 1500 * time.Millisecond}}},
		Transport: staticUpstream{},
	})
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	benchServeOwn(b, h, http.StatusTooManyRequests)
}
