package protect

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// BenchmarkAcquireRelease is one slot taken and given back with a latency sample: the
// limiter's share of a forwarded request, when the limit is not reached.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, adaptive := range []bool{false, true} {
		name := "fixed"
		if adaptive {
			name = "adaptive"
		}
		b.Run(name, func(b *testing.B) {
			l, err := New(Options{Adaptive: adaptive, Limit: 10000, MinLimit: 2, MaxLimit: 100000})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if _, err := l.Acquire(ctx, Default); err != nil {
						b.Fatal(err)
					}
					l.Release(Default, time.Now(), time.Millisecond, true)
				}
			})
		})
	}
}

// BenchmarkClassify is the issue example's two rules (a header, a path prefix) on a request
// that matches neither.
func BenchmarkClassify(b *testing.B) {
	c := NewClassifier([]policy.PriorityConfig{
		{Name: "critical", Match: policy.PriorityMatchConfig{Headers: map[string]string{"X-Priority": "critical"}}},
		{Name: "sheddable", Match: policy.PriorityMatchConfig{PathPrefix: "/batch"}},
	})
	r := httptest.NewRequest("GET", "http://x/v1/items", nil)
	b.ReportAllocs()
	for b.Loop() {
		if c.Classify(r, nil) != Default {
			b.Fatal("not default")
		}
	}
}
