package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
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
	pol := (&fakePolicies{}).add("per-ip", false, 1).add("per-key", false, 2)
	res := []bucket.Result{
		{Allowed: true, Limit: 100, Remaining: 50, Reset: time.Second},
		{Allowed: admitted, Limit: 10, Remaining: 3, Reset: 2 * time.Second, RetryAfter: 1500 * time.Millisecond},
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
	h := benchHandler(b, admitted)
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
