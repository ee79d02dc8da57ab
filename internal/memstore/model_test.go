package memstore_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// refModel is a reference for the memory store: plain maps of the pure functions' states and the
// Store contract's group semantics written out naively.
type refModel struct {
	gcra    map[bucket.Key]int64
	fixed   map[bucket.Key]bucket.FixedState
	sliding map[bucket.Key]bucket.SlidingState
}

type reviewPending struct {
	tat     int64
	fixed   bucket.FixedState
	sliding bucket.SlidingState
}

func reviewKind(a bucket.Algorithm) int {
	switch a {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return 0
	case bucket.FixedWindow, bucket.Quota:
		return 1
	}
	return 2
}

func (m *refModel) take(now int64, cs []bucket.Charge) (bool, []bucket.Result) {
	rs := make([]bucket.Result, len(cs))
	ps := make([]reviewPending, len(cs))
	admitted := true
	for i, c := range cs {
		prev := -1
		for j := i - 1; j >= 0; j-- {
			if rs[j].Allowed && cs[j].Key == c.Key && reviewKind(cs[j].Limit.Algorithm) == reviewKind(c.Limit.Algorithm) {
				prev = j
				break
			}
		}
		switch reviewKind(c.Limit.Algorithm) {
		case 0:
			tat := m.gcra[c.Key]
			if prev >= 0 {
				tat = ps[prev].tat
			}
			ps[i].tat, rs[i] = bucket.GCRAN(tat, now, c.Limit, c.N())
		case 1:
			s := m.fixed[c.Key]
			if prev >= 0 {
				s = ps[prev].fixed
			}
			if c.Limit.Algorithm == bucket.Quota {
				ps[i].fixed, rs[i] = bucket.QuotaN(s, now, c.Limit, c.N())
			} else {
				ps[i].fixed, rs[i] = bucket.FixedN(s, now, c.Limit, c.N())
			}
		case 2:
			s := m.sliding[c.Key]
			if prev >= 0 {
				s = ps[prev].sliding
			}
			ps[i].sliding, rs[i] = bucket.SlidingN(s, now, c.Limit, c.N())
		}
		admitted = admitted && (rs[i].Allowed || c.Shadow)
	}
	if admitted {
		for i, c := range cs {
			if !rs[i].Allowed {
				continue
			}
			switch reviewKind(c.Limit.Algorithm) {
			case 0:
				m.gcra[c.Key] = ps[i].tat
			case 1:
				m.fixed[c.Key] = ps[i].fixed
			case 2:
				m.sliding[c.Key] = ps[i].sliding
			}
		}
	}
	return admitted, rs
}

// TestMemoryMatchesModel drives the memory store and the reference with random groups (one to five
// charges, the same key twice, shadow charges, costs of 1 to 3, limits that change between
// calls on one key: sliding Counts on both sides of 65535 and Windows with and without a width
// tag; quotas, one of whose Berlin days ends during the run) at a clock
// that only moves forward, on one shard so that sweeps run often. With no cap reached, a sweep
// forgets only fresh-equivalent keys, so every verdict must match the reference exactly.
func TestMemoryMatchesModel(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	limits := [4][]bucket.Limit{
		{
			{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 3},
			{Algorithm: bucket.TokenBucket, Rate: 0.5, Burst: 2},
			{Algorithm: bucket.LeakyBucket, Rate: 20, Burst: 2},
			{Algorithm: bucket.TokenBucket, Rate: 1e6, Burst: 1000},
		},
		{
			{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Second},
			{Algorithm: bucket.FixedWindow, Count: 5, Window: 100 * time.Millisecond},
		},
		{
			{Algorithm: bucket.SlidingWindow, Count: 4, Window: time.Second},
			{Algorithm: bucket.SlidingWindow, Count: 3, Window: 1234567 * time.Nanosecond}, // no tag
			{Algorithm: bucket.SlidingWindow, Count: 70000, Window: time.Second},           // wide
			{Algorithm: bucket.SlidingWindow, Count: 6, Window: 300 * time.Millisecond},
		},
		{
			// The run (about 38 minutes) starts 16m40s before midnight in Berlin.
			{Algorithm: bucket.Quota, Count: 40, Period: bucket.Day, Zone: berlin},
			{Algorithm: bucket.Quota, Count: 7, Period: bucket.Week, Offset: 1},
			{Algorithm: bucket.Quota, Count: 9, Period: bucket.Month, Offset: 13, Zone: berlin},
		},
	}
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			mem := memstore.New(memstore.Options{Shards: 1})
			model := &refModel{gcra: map[bucket.Key]int64{}, fixed: map[bucket.Key]bucket.FixedState{}, sliding: map[bucket.Key]bucket.SlidingState{}}
			keys := make([]bucket.Key, 400)
			for i := range keys {
				binary.LittleEndian.PutUint64(keys[i][:8], rng.Uint64())
				binary.LittleEndian.PutUint64(keys[i][8:], rng.Uint64())
			}
			now := time.Unix(1_700_001_800, 0).UnixNano() // 2023-11-14 22:43:20 UTC
			for step := range 30_000 {
				switch r := rng.IntN(100); {
				case r < 60:
					now += rng.Int64N(int64(5 * time.Millisecond))
				case r < 95:
				default:
					now += rng.Int64N(int64(3 * time.Second))
				}
				n := 1 + rng.IntN(5)
				if rng.IntN(3) > 0 {
					n = 1
				}
				cs := make([]bucket.Charge, n)
				for i := range cs {
					ki := rng.IntN(len(keys))
					if i > 0 && rng.IntN(4) == 0 {
						ki = -1 // the same key as an earlier charge
					}
					var k bucket.Key
					if ki < 0 {
						k = cs[rng.IntN(i)].Key
					} else {
						k = keys[ki]
					}
					// A key's kind is fixed by its index, so one key keeps one kind of state
					// (as policy keys do); its limit within the kind may change.
					kind := int(binary.LittleEndian.Uint64(k[:8]) % uint64(len(limits)))
					ls := limits[kind]
					var l bucket.Limit
					if rng.IntN(10) == 0 {
						l = ls[rng.IntN(len(ls))]
					} else {
						l = ls[int(binary.LittleEndian.Uint64(k[8:])%uint64(len(ls)))]
					}
					cs[i] = bucket.Charge{Key: k, Limit: l, Shadow: rng.IntN(6) == 0}
					if rng.IntN(4) == 0 {
						cs[i].Cost = 1 + rng.Int64N(3)
					}
				}
				rs := make([]bucket.Result, n)
				got, err := mem.Take(context.Background(), time.Unix(0, now), cs, rs)
				if err != nil {
					t.Fatalf("step %d: Take: %v", step, err)
				}
				want, wantRs := model.take(now, cs)
				if got != want {
					t.Fatalf("step %d: admitted got %v, want %v (charges %+v)", step, got, want, cs)
				}
				for i := range rs {
					rs[i].Token = 0 // the store's own (a GCRA write's tat, for give-backs)
					if rs[i] != wantRs[i] {
						t.Fatalf("step %d charge %d (%+v): got %+v, want %+v", step, i, cs[i], rs[i], wantRs[i])
					}
				}
			}
			if mem.Evicted() != 0 {
				t.Fatalf("got %d evictions, want 0 (the cap was not meant to be reached)", mem.Evicted())
			}
		})
	}
}

// TestMemoryCapNeverExceeded hammers a small capped store with random groups of new and
// repeated keys of all kinds and checks Len after every call.
func TestMemoryCapNeverExceeded(t *testing.T) {
	for _, maxKeys := range []int{1, 7, 16, 100, 1000} {
		t.Run(fmt.Sprint(maxKeys), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(maxKeys), 5))
			mem := memstore.New(memstore.Options{MaxKeys: maxKeys, Shards: 4})
			ls := []bucket.Limit{
				{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 5},
				{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Hour},
				{Algorithm: bucket.SlidingWindow, Count: 5, Window: time.Hour},
				{Algorithm: bucket.SlidingWindow, Count: 70000, Window: time.Hour},
				{Algorithm: bucket.SlidingWindow, Count: 5, Window: 1234567 * time.Nanosecond},
			}
			now := time.Unix(1_700_000_000, 0)
			for step := range 20_000 {
				now = now.Add(time.Duration(rng.Int64N(int64(time.Millisecond))))
				cs := make([]bucket.Charge, 1+rng.IntN(4))
				for i := range cs {
					var k bucket.Key
					binary.LittleEndian.PutUint64(k[:8], rng.Uint64N(uint64(4*maxKeys+8)))
					binary.LittleEndian.PutUint64(k[8:], rng.Uint64())
					cs[i] = bucket.Charge{Key: k, Limit: ls[rng.IntN(len(ls))]}
				}
				rs := make([]bucket.Result, len(cs))
				if _, err := mem.Take(context.Background(), now, cs, rs); err != nil {
					t.Fatal(err)
				}
				if n := mem.Len(); n > maxKeys {
					t.Fatalf("step %d: got %d keys, want at most %d", step, n, maxKeys)
				}
			}
		})
	}
}
