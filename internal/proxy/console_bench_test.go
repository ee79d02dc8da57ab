package proxy

import (
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/console"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// BenchmarkHandlerConsole measures the operators' console's cost on the request path, side by
// side in one run: the same handler as BenchmarkHandler_Admitted and _Rejected, without and
// with a console (its heavy-hitter sketches, per-second series, exemption check and the 429s'
// exemplars). docs/benchmarks.md reports the ratio; the target is at most 5% more CPU per
// request.
//
// The console's sketch counts every charge of a policy's first 1,000 in a second and samples
// past them (admin's exactPerSecond), so the handler runs on two clocks: under "load" the
// clock stands still and every request falls in one second, past its first 1,000 (where a
// gateway under load runs); under "light" each request is one millisecond after the last, so
// that every charge is counted (at most 1,000 a second). Neither depends on how fast the
// machine (or valgrind, in scripts/bench/console-instr.sh) runs the loop.
func BenchmarkHandlerConsole(b *testing.B) {
	for _, tc := range []struct {
		name     string
		admitted bool
		want     int
	}{{"admitted", true, http.StatusOK}, {"rejected", false, http.StatusTooManyRequests}} {
		for _, light := range []bool{false, true} {
			for _, on := range []bool{false, true} {
				name := tc.name + "/load"
				if light {
					name = tc.name + "/light"
				}
				name += map[bool]string{false: "/console=off", true: "/console=on"}[on]
				b.Run(name, func(b *testing.B) {
					h := consoleHandler(b, tc.admitted, on, light)
					before := cpuTime()
					benchServeHandler(b, h, tc.want)
					// CPU per request (user+system of the process), steadier than wall time on a
					// shared machine, where other processes' load stretches ns/op.
					b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}

// consoleBenchNow is the benchmark's clock under load, standing still.
var consoleBenchNow = time.Unix(1_700_000_000, 0)

func consoleHandler(b *testing.B, admitted, on, light bool) *Handler {
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
		Now:       func() time.Time { return consoleBenchNow },
	}
	if light {
		var ms atomic.Int64
		o.Now = func() time.Time { return consoleBenchNow.Add(time.Duration(ms.Add(1)) * time.Millisecond) }
	}
	if on {
		c, err := console.New(console.Options{Policies: func() *policy.Set { return nil }, Pseudonyms: policy.NewPseudonyms(nil)})
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
