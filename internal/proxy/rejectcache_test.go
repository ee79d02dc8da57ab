package proxy

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// TestRejectionCache_FollowsNumbers guards the pre-rendered 429 that BenchmarkHandlerOwn_* rely
// on: the rendering is reused only while retry, limit and reset stay the same.
func TestRejectionCache_FollowsNumbers(t *testing.T) {
	steps := []struct {
		res                       bucket.Result
		retry, limit, reset, body string
	}{
		{bucket.Result{Limit: 5, Reset: 10 * time.Second, RetryAfter: 3599 * time.Second}, "3599", "5", "10", `retry after 3599 seconds.`},
		{bucket.Result{Limit: 5, Reset: 10 * time.Second, RetryAfter: 3599 * time.Second}, "3599", "5", "10", `retry after 3599 seconds.`},
		{bucket.Result{Limit: 5, Reset: 10 * time.Second, RetryAfter: 3598 * time.Second}, "3598", "5", "10", `retry after 3598 seconds.`},
		{bucket.Result{Limit: 7, Reset: 10 * time.Second, RetryAfter: 3598 * time.Second}, "3598", "7", "10", `retry after 3598 seconds.`},
		{bucket.Result{Limit: 7, Reset: 9 * time.Second, RetryAfter: 3598 * time.Second}, "3598", "7", "9", `retry after 3598 seconds.`},
		{bucket.Result{Limit: 7, Reset: 9 * time.Second, RetryAfter: time.Second}, "1", "7", "9", `retry after 1 second.`},
	}
	lim := &seqLimiter{}
	for _, s := range steps {
		lim.results = append(lim.results, s.res)
	}
	pol := (&fakePolicies{headers: policy.Headers{Reset: policy.ResetDelta}}).add("per-key", false, 2)
	h, err := New(Options{
		Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
		Policies:  func() Policies { return pol },
		Limiter:   lim,
		Transport: staticUpstream{},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for i, s := range steps {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://proxy.local/", nil))
		if rec.Code != http.StatusTooManyRequests {
			t.Fatalf("step %d: status got %d, want 429", i, rec.Code)
		}
		for _, hv := range []struct{ name, want string }{
			{"Retry-After", s.retry}, {"X-Ratelimit-Limit", s.limit}, {"X-Ratelimit-Remaining", "0"},
			{"X-Ratelimit-Reset", s.reset}, {"Content-Type", "application/problem+json"},
		} {
			if got := rec.Header().Values(hv.name); len(got) != 1 || got[0] != hv.want {
				t.Errorf("step %d: %s got %q, want [%s]", i, hv.name, got, hv.want)
			}
		}
		want := `"detail":"Rate limit of policy \"per-key\" exceeded; ` + s.body + `","policy":"per-key","retry_after_seconds":` + s.retry + "}\n"
		if body := rec.Body.String(); !strings.HasSuffix(body, want) {
			t.Errorf("step %d: body got %s, want suffix %s", i, body, want)
		}
	}
}
