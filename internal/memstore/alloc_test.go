package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// TestTakeAllocatesNothing: a decision on stored keys allocates nothing, for one charge and for
// groups up to the size Take keeps on its stack, on every algorithm, admitted or not (Take's
// steps pass its buffers down; a step that made them escape would allocate per decision).
func TestTakeAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	limits := []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 1000, Burst: 100},
		{Algorithm: bucket.LeakyBucket, Rate: 1000, Burst: 100},
		{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Second},
		{Algorithm: bucket.SlidingWindow, Count: 100, Window: time.Second},
		{Algorithm: bucket.Quota, Count: 100, Period: bucket.Day},
		{Algorithm: bucket.Concurrency, Count: 1 << 20},
	}
	for _, n := range []int{1, 3, 8} {
		m := memstore.New(memstore.Options{})
		charges := make([]bucket.Charge, n)
		for i := range charges {
			charges[i] = bucket.Charge{Key: keyN(uint64(i)), Limit: limits[i%len(limits)]}
		}
		results := make([]bucket.Result, n)
		now := t0
		take := func() {
			now = now.Add(time.Millisecond)
			if _, err := m.Take(ctx, now, charges, results); err != nil {
				t.Fatal(err)
			}
		}
		take() // stores the keys
		if a := testing.AllocsPerRun(200, take); a != 0 {
			t.Errorf("a group of %d on stored keys: %v allocations per Take, want 0", n, a)
		}
	}
}
