package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestMemoryGiveBackAfterEviction is issue 23's memory-store case: a charge is taken on a key,
// the key is evicted (the least used of a full shard), a later charge creates it again, and
// only then does the first charge's give-back arrive. It must give nothing: the new entry never
// counted it. Before entries carried their generation, the give-back subtracted from the new
// entry's count (a window's counter, a concurrency count) or, for a token bucket whose new tat
// came back to the old one's value, gave the old charge's cost back: over-admission by up to the
// cost. Each case then asks for what the key would have left had the give-back been refused.
func TestMemoryGiveBackAfterEviction(t *testing.T) {
	const maxKeys = 16
	ctx := context.Background()
	hour := time.Hour
	cases := []struct {
		name         string
		limit        bucket.Limit
		costA, costB int64
		// probe, taken right after the give-back, must be rejected: it fits only if the
		// give-back wrongly came out of the new entry.
		probe int64
	}{
		{"fixed_window", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: hour}, 1, 1, 10},
		{"quota", bucket.Limit{Algorithm: bucket.Quota, Count: 10, Period: bucket.Day}, 1, 1, 10},
		{"sliding_window", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 10, Window: hour}, 1, 1, 10},
		// T = 1s: A's cost 2 at t0 leaves tat t0+2s; B's cost 1 at t0+1s leaves the same tat.
		{"token_bucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}, 2, 1, 10},
		{"concurrency", bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}, 1, 1, 2},
	}
	filler := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: hour}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Options{Shards: 1, MaxKeys: maxKeys})
			now := time.Unix(0, t0ns).Truncate(hour).Add(time.Minute)
			take := func(k bucket.Key, l bucket.Limit, cost int64) bucket.Result {
				t.Helper()
				var r [1]bucket.Result
				if _, err := m.Take(ctx, now, []bucket.Charge{{Key: k, Limit: l, Cost: cost, MayGiveBack: true}}, r[:]); err != nil {
					t.Fatal(err)
				}
				return r[0]
			}
			victim := bucket.Key{0xee}
			a := take(victim, tc.limit, tc.costA)
			if !a.Allowed {
				t.Fatalf("charge A: got %+v, want admitted", a)
			}
			taken := bucket.Taken{Charge: bucket.Charge{Key: victim, Limit: tc.limit, Cost: tc.costA, MayGiveBack: true}, At: now, Token: a.Token}
			// Fillers, each using half of its limit, fill the shard; the next one evicts the
			// least used key: the victim.
			for i := range maxKeys {
				if r := take(bucket.Key{1, byte(i)}, filler, 5); !r.Allowed {
					t.Fatalf("filler %d: got %+v, want admitted", i, r)
				}
			}
			sh := &m.shards[0]
			sh.mu.Lock()
			evicted := !sh.has(&bucket.Charge{Key: victim, Limit: tc.limit})
			sh.mu.Unlock()
			if !evicted {
				t.Fatalf("setup: the victim is still stored after %d fillers (%+v)", maxKeys, m.Evictions())
			}
			now = now.Add(time.Second)
			if b := take(victim, tc.limit, tc.costB); !b.Allowed {
				t.Fatalf("charge B on the key created again: got %+v, want admitted", b)
			}
			if err := m.Release(ctx, now, []bucket.Taken{taken}); err != nil {
				t.Fatal(err)
			}
			probe := tc.probe
			if tc.limit.Algorithm == bucket.Concurrency {
				// B holds one of 2 slots: one more fits, a second must not.
				if r := take(victim, tc.limit, 1); !r.Allowed {
					t.Fatalf("the one free slot: got %+v, want admitted", r)
				}
				probe = 1
			}
			if r := take(victim, tc.limit, probe); r.Allowed {
				t.Errorf("after A's give-back to the key created again: a charge of %d admitted (%+v); want rejected: the give-back took from a count it never added", probe, r)
			}
		})
	}
}
