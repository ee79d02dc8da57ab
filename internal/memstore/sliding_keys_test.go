package memstore

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestMemorySlidingManyKeys drives many sliding-window keys of one shard (compact and wide,
// Limits changing as reloads would) through sweeps that forget idle keys, table growth and
// shrinks, alone and in groups, against a SlidingState per key kept by hand. MaxKeys is never
// reached, so forgetting only ever drops idle (fresh-equivalent) keys: every verdict must be
// Sliding's and no key may be in both the compact table and the wide map.
func TestMemorySlidingManyKeys(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 5))
	counts := []int64{1, 3, 50, 65_535, 65_536, 1 << 20}
	windows := []time.Duration{time.Second, 100 * time.Millisecond, 1_234_567_800}
	m := New(Options{Shards: 1, MaxKeys: 1 << 24})
	sh := &m.shards[0]
	const nkeys = 4000
	keys := make([]bucket.Key, nkeys)
	limits := make([]bucket.Limit, nkeys)
	for i := range keys {
		binary.LittleEndian.PutUint64(keys[i][:8], rng.Uint64())
		binary.LittleEndian.PutUint64(keys[i][8:], rng.Uint64())
		limits[i] = bucket.Limit{Algorithm: bucket.SlidingWindow, Count: counts[rng.IntN(len(counts))], Window: windows[rng.IntN(len(windows))]}
	}
	ref := map[bucket.Key]bucket.SlidingState{}
	now := t0ns
	var res [2]bucket.Result
	maxSlots := 0
	shrinks := 0
	for step := range 200_000 {
		switch r := rng.IntN(1000); {
		case r < 3:
			now += int64(2 * time.Second) // everything idle
		case r < 200:
			now += rng.Int64N(int64(20 * time.Millisecond))
		case r < 205:
			i := rng.IntN(nkeys)
			limits[i].Count = counts[rng.IntN(len(counts))]
		case r < 208:
			i := rng.IntN(nkeys)
			limits[i].Window = windows[rng.IntN(len(windows))]
		}
		// Hot keys (the first 64) get most of the requests, so some counters grow.
		i := rng.IntN(nkeys)
		if rng.IntN(2) == 0 {
			i = rng.IntN(64)
		}
		k, l := keys[i], limits[i]
		if rng.IntN(4) == 0 {
			j := rng.IntN(nkeys)
			if keys[j] == k {
				continue
			}
			k2, l2 := keys[j], limits[j]
			admitted, err := m.Take(ctx, time.Unix(0, now), []bucket.Charge{{Key: k, Limit: l}, {Key: k2, Limit: l2}}, res[:])
			if err != nil {
				t.Fatal(err)
			}
			n1, r1 := bucket.Sliding(ref[k], now, l)
			n2, r2 := bucket.Sliding(ref[k2], now, l2)
			if noToken(res[0]) != r1 || noToken(res[1]) != r2 || admitted != (r1.Allowed && r2.Allowed) {
				t.Fatalf("step %d group: got %v %+v %+v, want %+v %+v", step, admitted, res[0], res[1], r1, r2)
			}
			if admitted {
				ref[k], ref[k2] = n1, n2
			}
		} else {
			if _, err := m.Take(ctx, time.Unix(0, now), []bucket.Charge{{Key: k, Limit: l}}, res[:1]); err != nil {
				t.Fatal(err)
			}
			next, r := bucket.Sliding(ref[k], now, l)
			if noToken(res[0]) != r {
				t.Fatalf("step %d key %d (%+v at %d): got %+v, want %+v", step, i, l, now, res[0], r)
			}
			if r.Allowed {
				ref[k] = next
			}
		}
		if len(sh.sliding.slots) < maxSlots {
			shrinks++
		}
		maxSlots = len(sh.sliding.slots)
		if step%5000 == 0 {
			for kk := range sh.wide {
				if _, ok := sh.sliding.find(&kk); ok {
					t.Fatalf("step %d: a key in both the compact table and the wide map", step)
				}
			}
		}
	}
	if shrinks == 0 {
		t.Errorf("the table never shrank: the test exercises too little")
	}
	t.Logf("shrinks %d, final slots %d, keys %d (wide %d)", shrinks, len(sh.sliding.slots), sh.sliding.n, len(sh.wide))
}
