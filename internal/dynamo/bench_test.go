package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// BenchmarkTake measures one decision of a two-policy group (a token bucket and a fixed window)
// on DynamoDB Local, per mode: latency, DynamoDB calls per decision and writes per decision.
// "admitted": both charges conform. "rejected": the window is exhausted, so the group is
// rejected and, in Refund mode, the bucket's write is refunded (deny cache off, so every
// decision reaches DynamoDB).
func BenchmarkTake(b *testing.B) {
	api, table := localTable(b)
	for _, mode := range []dynamo.Mode{dynamo.Refund, dynamo.Transaction} {
		for _, rejected := range []bool{false, true} {
			name := mode.String() + "/admitted"
			if rejected {
				name = mode.String() + "/rejected"
			}
			b.Run(name, func(b *testing.B) {
				counting := &countingAPI{api: api}
				s := dynamo.New(counting, dynamo.Options{Table: table, Mode: mode})
				count := int64(1 << 40)
				if rejected {
					count = 1
				}
				charges := []bucket.Charge{
					{Key: bucket.Key{1, byte(mode)}, Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e6, Burst: 1 << 40}},
					{Key: bucket.Key{2, byte(mode)}, Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: count, Window: time.Hour}},
				}
				r := make([]bucket.Result, len(charges))
				now := time.Unix(1_800_000_000, 0)
				if rejected { // exhaust the window first
					if _, err := s.Take(context.Background(), now, charges, r); err != nil {
						b.Fatalf("Take: %v", err)
					}
				}
				counting.updates.Store(0)
				counting.transact.Store(0)
				counting.batchGets.Store(0)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if _, err := s.Take(context.Background(), now.Add(time.Duration(i)*time.Microsecond), charges, r); err != nil {
						b.Fatalf("Take: %v", err)
					}
				}
				b.StopTimer()
				n := float64(b.N)
				b.ReportMetric(float64(counting.calls())/n, "calls/op")
				b.ReportMetric(float64(counting.updates.Load())/n, "updates/op")
				b.ReportMetric(float64(counting.transact.Load())/n, "transacts/op")
			})
		}
	}
}

// BenchmarkHammerDenyCache: parallel requests at one key past its limit; with the deny cache
// the rejected requests cost (almost) no DynamoDB call.
func BenchmarkHammerDenyCache(b *testing.B) {
	api, table := localTable(b)
	for _, deny := range []bool{false, true} {
		name := "off"
		if deny {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			counting := &countingAPI{api: api}
			s := dynamo.New(counting, dynamo.Options{Table: table, DenyCache: deny})
			charges := []bucket.Charge{{Key: bucket.Key{3, byte(len(name))}, Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Hour}}}
			now := time.Unix(1_800_003_600, 0)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := make([]bucket.Result, 1)
				for pb.Next() {
					if _, err := s.Take(context.Background(), now, charges, r); err != nil {
						b.Errorf("Take: %v", err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(counting.calls())/float64(b.N), "calls/op")
		})
	}
}
