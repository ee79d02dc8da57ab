package dynamo_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// TestWeightedExactUnderCoalescing hammers one key with weighted charges from two Stores (Refund
// mode) on the in-memory table, whose writes interleave: the coalesced batches (m charges of cost
// c add m*c) must admit exactly floor(limit/c). With gates, every third request also charges a
// limit of its own that admits one, so groups are rejected and their applied hot charges
// refunded: then never more than floor(limit/c) (a refund still on its way can make a concurrent
// request be rejected, which is stricter). (The in-memory table has no transactions:
// TestReplicasShareExactCount covers both modes against DynamoDB Local.)
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
		for _, gated := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/gates=%v", tc.name, gated), func(t *testing.T) {
				got := hammerWeighted(t, tc.limit, tc.cost, gated)
				if !gated && got != tc.want {
					t.Errorf("300 requests of cost %d at one instant: got %d admitted, want exactly %d", tc.cost, got, tc.want)
				}
				if gated && (got > tc.want || got == 0) {
					t.Errorf("300 requests of cost %d at one instant, some groups refunded: got %d admitted, want 1 to %d", tc.cost, got, tc.want)
				}
			})
		}
	}
}

// hammerWeighted sends 300 concurrent Takes of one weighted charge through two Stores on one
// in-memory table and returns how many were admitted.
func hammerWeighted(t *testing.T, l bucket.Limit, cost int64, gated bool) int64 {
	t.Helper()
	api := newMemAPI()
	stores := []*dynamo.Store{dynamo.New(api, dynamo.Options{Table: "t"}), dynamo.New(api, dynamo.Options{Table: "t"})}
	hot := bucket.Charge{Key: newKey(t), Limit: l, Cost: cost}
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
			if gated && g%3 == 0 {
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
	return admitted.Load()
}
