package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The memory store's side of issue 32 item 1: a reset with 120 slots in flight at limit 150,
// then their releases, leaves the key admitting exactly 150 at once: the old slots' releases
// carry the generation of the entry the reset removed, and change nothing.
func TestMemoryResetWithSlotsInFlight(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	ctx := context.Background()
	m := New(Options{})
	c := bucket.Charge{Key: bucket.Key{4, 5, 6}, Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 150}}
	fill := func(most int) []bucket.Taken {
		var taken []bucket.Taken
		res := make([]bucket.Result, 1)
		for range most {
			ok, err := m.Take(ctx, t0, []bucket.Charge{c}, res)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			taken = append(taken, bucket.Taken{Charge: c, At: t0, Token: res[0].Token})
		}
		return taken
	}
	before := fill(120)
	if len(before) != 120 {
		t.Fatalf("took %d before the reset, want 120", len(before))
	}
	if err := m.Reset(ctx, t0, c); err != nil {
		t.Fatal(err)
	}
	after := fill(10) // requests admitted after the reset, before the old ones end
	if err := m.Release(ctx, t0, before); err != nil {
		t.Fatal(err)
	}
	if got := len(after) + len(fill(200)); got != 150 {
		t.Fatalf("after the reset and the old slots' releases: %d in flight at once, want 150", got)
	}
}
