package fallback

import (
	"context"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// TestDivideLeakyBucketBurst: Divide promises that n replicas together never exceed l
// (unless a count is below n). A leaky bucket admits Burst+1 requests at one instant (the one
// in service and Burst waiting), so it is Burst+1 that must be divided: dividing Burst let 5
// replicas admit 15 at once for a queue of 10 (11 at once for one shared store).
func TestDivideLeakyBucketBurst(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 10}
	const replicas = 5
	admittedAt := func(l bucket.Limit) int {
		t.Helper()
		m := memstore.New(memstore.Options{})
		n := 0
		for range 100 {
			r := make([]bucket.Result, 1)
			ok, err := m.Take(context.Background(), t0, []bucket.Charge{{Key: bucket.Key{7}, Limit: l}}, r)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				n++
			}
		}
		return n
	}
	shared := admittedAt(l)
	total := 0
	for range replicas {
		total += admittedAt(Divide(l, replicas))
	}
	if total > shared {
		t.Errorf("got %d admitted at one instant across %d replicas in local mode, want at most %d (one shared store)", total, replicas, shared)
	}
}
