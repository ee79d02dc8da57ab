package memstore_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// TestMemoryConcurrencyMatchesModel holds the memory store's concurrency path (takeSlot for a
// single charge, the group path for two, giveBackSlot) to the pure function Concurrent, over
// random takes and releases on 300 keys in one shard: every verdict equals the model's, field
// by field, and so does the group's admission. Keys with nothing in flight are forgotten by the
// shard's sweeps as new keys arrive (the test checks that some were), and come back from zero,
// as the model says; keys with slots in flight must survive every sweep.
func TestMemoryConcurrencyMatchesModel(t *testing.T) {
	ctx := context.Background()
	m := memstore.New(memstore.Options{Shards: 1, MaxKeys: 10_000})
	rng := rand.New(rand.NewPCG(7, 12))
	keys := randomKeys(300)
	limit := func(k int) bucket.Limit {
		return bucket.Limit{Algorithm: bucket.Concurrency, Count: int64(1 + k%3)}
	}
	inflight := make([]int64, len(keys))
	type held struct {
		k  int
		tk bucket.Taken
	}
	var holding []held
	now := t0
	minLen, seen := len(keys), map[int]bool{}
	for step := range 20_000 {
		now = now.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
		switch op := rng.IntN(10); {
		case op < 4 && len(holding) > 0: // release a slot held by an earlier request
			i := rng.IntN(len(holding))
			h := holding[i]
			holding[i] = holding[len(holding)-1]
			holding = holding[:len(holding)-1]
			if err := m.Release(ctx, now, []bucket.Taken{h.tk}); err != nil {
				t.Fatal(err)
			}
			inflight[h.k]--
		default: // a group of one or two concurrency charges (twice the same key now and then)
			ks := []int{rng.IntN(len(keys))}
			if op >= 8 {
				ks = append(ks, rng.IntN(len(keys)))
				if op == 9 {
					ks[1] = ks[0]
				}
			}
			charges := make([]bucket.Charge, len(ks))
			want := make([]bucket.Result, len(ks))
			next := map[int]int64{}
			admitted := true
			for i, k := range ks {
				charges[i] = bucket.Charge{Key: keys[k], Limit: limit(k)}
				n, ok := next[k]
				if !ok {
					n = inflight[k]
				}
				var r bucket.Result
				if n, r = bucket.Concurrent(n, limit(k)); r.Allowed {
					next[k] = n
				}
				want[i] = r
				admitted = admitted && r.Allowed
			}
			got := make([]bucket.Result, len(ks))
			ok, err := m.Take(ctx, now, charges, got)
			if err != nil {
				t.Fatal(err)
			}
			if ok != admitted {
				t.Fatalf("step %d: keys %v (in flight %v): got admitted %v, want %v", step, ks, inflightOf(inflight, ks), ok, admitted)
			}
			for i := range ks {
				g := got[i]
				g.Token = 0 // the entry's generation: what Release needs back
				if g != want[i] {
					t.Fatalf("step %d: charge %d (key %d, %d in flight, limit %d): got %+v, want %+v",
						step, i, ks[i], inflight[ks[i]], limit(ks[i]).Count, got[i], want[i])
				}
			}
			if ok {
				for i, k := range ks {
					inflight[k]++
					seen[k] = true
					holding = append(holding, held{k, bucket.Taken{Charge: charges[i], At: now, Token: got[i].Token}})
				}
			}
		}
		if len(seen) == len(keys) {
			minLen = min(minLen, m.Len())
		}
	}
	if minLen >= len(keys) {
		t.Errorf("the shard held all %d keys at every step after each was taken once: no sweep forgot an idle key", len(keys))
	}
	// Every slot given back: each key admits exactly its limit again.
	for _, h := range holding {
		if err := m.Release(ctx, now, []bucket.Taken{h.tk}); err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		c := []bucket.Charge{{Key: keys[k], Limit: limit(k)}}
		var r [1]bucket.Result
		for i := range limit(k).Count + 1 {
			ok, err := m.Take(ctx, now, c, r[:])
			if err != nil {
				t.Fatal(err)
			}
			if want := i < limit(k).Count; ok != want {
				t.Fatalf("key %d after every release, take %d: got admitted %v, want %v", k, i+1, ok, want)
			}
		}
	}
}

func inflightOf(inflight []int64, ks []int) []int64 {
	out := make([]int64, len(ks))
	for i, k := range ks {
		out[i] = inflight[k]
	}
	return out
}
