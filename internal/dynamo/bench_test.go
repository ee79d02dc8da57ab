package dynamo_test

import (
	"context"
	"sync/atomic"
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

// BenchmarkTakeLayered is load (e) of scripts/bench in miniature: many concurrent decisions of
// three token buckets (one hot "ip" key, an api_key rotating over 10k keys, one hot global key),
// rates far above what is reached, on the wall clock. It reports DynamoDB writes per admitted
// request per policy, whose target is 1.
func BenchmarkTakeLayered(b *testing.B) {
	api, table := localTable(b)
	counting := &countingAPI{api: api}
	s := dynamo.New(counting, dynamo.Options{Table: table, DenyCache: true})
	big := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e7, Burst: 1e7}
	perKey := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e5, Burst: 1e5}
	run := time.Now().UnixNano()
	var next atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 cores, like the 64 connections of load (e)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := make([]bucket.Result, 3)
		charges := []bucket.Charge{
			{Key: bucket.Key{4, 1, byte(run), byte(run >> 8)}, Limit: big},
			{Limit: perKey},
			{Key: bucket.Key{4, 3, byte(run), byte(run >> 8)}, Limit: big},
		}
		for pb.Next() {
			i := next.Add(1) % 10000
			charges[1].Key = bucket.Key{4, 2, byte(run), byte(run >> 8), byte(i), byte(i >> 8)}
			ok, err := s.Take(context.Background(), time.Now(), charges, r)
			if err != nil || !ok {
				b.Errorf("Take: admitted %v, err %v; want admitted", ok, err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(counting.updates.Load())/float64(b.N)/3, "updates/policy")
}
