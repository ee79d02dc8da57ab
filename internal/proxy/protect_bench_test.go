package proxy

import (
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/protect"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandler_Protect is BenchmarkHandler_Admitted's path (three policies admitted, the
// in-memory upstream) with the upstream protection off, at a fixed limit, and adaptive, side by
// side in one run (`make bench` runs every BenchmarkHandler): the protection's own cost per
// request is the difference. The limit is never reached, so every request takes and gives back
// a slot; the classifier has the two rules of the example (a header, a path prefix).
func BenchmarkHandler_Protect(b *testing.B) {
	prios := []policy.PriorityConfig{
		{Name: "critical", Match: policy.PriorityMatchConfig{Headers: map[string]string{"X-Priority": "critical"}}, Reserve: 0.2},
		{Name: "sheddable", Match: policy.PriorityMatchConfig{PathPrefix: "/batch"}},
	}
	for _, mode := range []string{"off", "fixed", "adaptive"} {
		b.Run(mode, func(b *testing.B) {
			pol := (&fakePolicies{}).add("per-ip", false, 1).add("per-key", false, 2).add("global", false, 3)
			res := []bucket.Result{
				{Allowed: true, Limit: 100, Remaining: 50, Reset: time.Second},
				{Allowed: true, Limit: 10, Remaining: 3, Reset: 2 * time.Second},
				{Allowed: true, Limit: 1000, Remaining: 500, Reset: time.Second},
			}
			o := Options{
				Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
				Policies:  func() Policies { return pol },
				Limiter:   fixedLimiter{admitted: true, results: res},
				Transport: staticUpstream{},
			}
			if mode != "off" {
				l, c, err := protect.FromConfig(&policy.ProtectConfig{
					Concurrency: policy.ProtectConcurrencyConfig{Adaptive: mode == "adaptive", Limit: 10000, MinLimit: 2, MaxLimit: 100000},
					Priorities:  prios,
				}, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				o.Protect = &Protection{Slots: l, Classify: c.Classify}
			}
			h, err := New(o)
			if err != nil {
				b.Fatal(err)
			}
			// CPU time as well as wall time: on a shared machine the wall time per request
			// swings with the neighbours' load, the process's CPU time much less.
			before := cpuTime()
			benchServeOwn(b, h, http.StatusOK)
			b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
		})
	}
}
