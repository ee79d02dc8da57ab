package proxy

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/admin"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// BenchmarkHandlerConsole measures the operators' console's cost on the request path, side by
// side in one run: the same handler as BenchmarkHandler_Admitted and _Rejected, without and
// with a console (its heavy-hitter sketches, per-second series, exemption check and the 429s'
// exemplars). docs/benchmarks.md reports the ratio; the target is at most 5% more CPU per
// request.
func BenchmarkHandlerConsole(b *testing.B) {
	for _, tc := range []struct {
		name     string
		admitted bool
		want     int
	}{{"admitted", true, http.StatusOK}, {"rejected", false, http.StatusTooManyRequests}} {
		for _, on := range []bool{false, true} {
			name := tc.name + "/console=off"
			if on {
				name = tc.name + "/console=on"
			}
			b.Run(name, func(b *testing.B) {
				h := consoleHandler(b, tc.admitted, on)
				before := cpuTime()
				benchServeHandler(b, h, tc.want)
				// CPU per request (user+system of the process), steadier than wall time on a
				// shared machine, where other processes' load stretches ns/op.
				b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

func consoleHandler(b *testing.B, admitted, on bool) *Handler {
	b.Helper()
	pol := (&fakePolicies{}).add("per-ip", false, 1).add("per-key", false, 2).add("global", false, 3)
	res := []bucket.Result{
		{Allowed: true, Limit: 100, Remaining: 50, Reset: time.Second},
		{Allowed: admitted, Limit: 10, Remaining: 3, Reset: 2 * time.Second, RetryAfter: 1500 * time.Millisecond},
		{Allowed: true, Limit: 1000, Remaining: 500, Reset: time.Second},
	}
	o := Options{
		Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
		Policies:  func() Policies { return pol },
		Limiter:   fixedLimiter{admitted: admitted, results: res},
		Transport: staticUpstream{},
	}
	if on {
		c, err := admin.New(admin.Options{Policies: func() *policy.Set { return nil }, Pseudonyms: policy.NewPseudonyms(nil)})
		if err != nil {
			b.Fatal(err)
		}
		o.Console = c
	}
	h, err := New(o)
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	return h
}
