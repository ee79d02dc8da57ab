package dynamo_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// TestWeightedExactUnderCoalescing hammers one key with weighted charges from two Stores (Refund
// mode) on the in-memory table, whose writes interleave: the coalesced batches (m charges of cost
// c add m*c) and the refunds of groups that a tiny second limit rejects must leave exactly
// floor(limit/c) admitted. (The in-memory table has no transactions: TestReplicasShareExactCount
// covers both modes against DynamoDB Local.)
func TestWeightedExactUnderCoalescing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit bucket.Limit
		cost  int64
		want  int64
	}{
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e-3, Burst: 50}, 3, 16},
		{"LeakyBucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1e-3, Burst: 50}, 3, 17},
		{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 50, Window: time.Hour}, 4, 12},
		{"SlidingWindow", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 50, Window: time.Hour}, 3, 16},
		{"Quota", bucket.Limit{Algorithm: bucket.Quota, Count: 52, Period: bucket.Month}, 5, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newMemAPI()
			stores := []*dynamo.Store{dynamo.New(api, dynamo.Options{Table: "t"}), dynamo.New(api, dynamo.Options{Table: "t"})}
			hot := bucket.Charge{Key: newKey(t), Limit: tc.limit, Cost: tc.cost}
			// Every third request also charges a gate of its own that admits one request:
			// the second request of each gate is rejected and its hot charge refunded.
			gates := make([]bucket.Key, 20)
			for i := range gates {
				gates[i] = newKey(t)
			}
			gate := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
			var admitted atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 300)
			for g := range 300 {
				wg.Go(func() {
					charges := []bucket.Charge{hot}
					if g%3 == 0 {
						charges = append(charges, bucket.Charge{Key: gates[g%len(gates)], Limit: gate})
					}
					r := make([]bucket.Result, len(charges))
					ok, err := stores[g%2].Take(context.Background(), t0, charges, r)
					if err != nil {
						errs <- err
						return
					}
					if ok {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("Take: %v", err)
			}
			if got := admitted.Load(); got != tc.want {
				t.Errorf("300 requests of cost %d at one instant: got %d admitted, want %d", tc.cost, got, tc.want)
			}
		})
	}
}
