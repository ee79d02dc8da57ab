package redisstore_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
	gen "github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/buckettest"
)

// TestSameVerdictsAsMemory plays random histories of groups (mixed algorithms, costs, shadow
// charges) on the Redis store and on the memory store and wants the same admission and the same
// Result, field by field, for every charge: the Lua scripts decide as package bucket does, and
// nothing of the store's own (markers, generations, slot ids) leaks into a verdict's numbers.
// Token is the store's own business and is compared only for being set exactly on committed
// charges.
func TestSameVerdictsAsMemory(t *testing.T) {
	for _, l := range []string{"single", "cluster"} {
		t.Run(l, func(t *testing.T) {
			lazy := &single
			if l == "cluster" {
				lazy = &cluster
			}
			rs := newStore(t, lazy)
			mem := memstore.New(memstore.Options{})
			rng := rand.New(rand.NewPCG(35, 1))
			limits := []bucket.Limit{
				{Algorithm: bucket.TokenBucket, Rate: 3, Burst: 4},
				{Algorithm: bucket.TokenBucket, Rate: 0.7, Burst: 2},
				{Algorithm: bucket.LeakyBucket, Rate: 5, Burst: 3},
				{Algorithm: bucket.FixedWindow, Count: 5, Window: 2 * time.Second},
				{Algorithm: bucket.SlidingWindow, Count: 6, Window: 3 * time.Second},
				{Algorithm: bucket.Quota, Count: 7, Period: bucket.Day},
				{Algorithm: bucket.Concurrency, Count: 3},
			}
			for h := range 40 {
				keys := make([]bucket.Charge, 4)
				for i := range keys {
					keys[i] = bucket.Charge{Key: buckettest.NewKey(t), Limit: limits[rng.IntN(len(limits))]}
				}
				now := time.Unix(1_700_000_000, 0).Add(time.Duration(rng.IntN(86400)) * time.Second)
				for step := range 30 {
					now = now.Add(time.Duration(rng.IntN(8)) * 125 * time.Millisecond)
					group := gen.Group(rng, keys, 6)
					want := make([]bucket.Result, len(group))
					got := make([]bucket.Result, len(group))
					wa, err := mem.Take(context.Background(), now, group, want)
					if err != nil {
						t.Fatal(err)
					}
					ga, err := rs.Take(context.Background(), now, group, got)
					if err != nil {
						t.Fatalf("history %d step %d: %v", h, step, err)
					}
					if ga != wa {
						t.Fatalf("history %d step %d: admitted %v, memory %v", h, step, ga, wa)
					}
					for i := range group {
						tok := got[i].Token
						got[i].Token, want[i].Token = 0, 0
						if got[i] != want[i] {
							t.Fatalf("history %d step %d charge %d (%v cost %d): got %+v, memory %+v",
								h, step, i, group[i].Limit.Algorithm, group[i].Cost, got[i], want[i])
						}
						committed := ga && got[i].Allowed
						if committed != (tok != 0) {
							t.Errorf("history %d step %d charge %d: token %d on a charge committed=%v", h, step, i, tok, committed)
						}
					}
				}
			}
		})
	}
}

// TestRefusedCrossSlotGroupGivesBack: in a cluster, a group whose keys live in different slots
// is decided per slot; when one part is refused, what the others committed is given back, so
// the group consumes nothing, as on one node.
func TestRefusedCrossSlotGroupGivesBack(t *testing.T) {
	rs := newStore(t, &cluster)
	now := time.Unix(1_700_000_000, 0)
	limits := []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2},
		{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Minute},
		{Algorithm: bucket.SlidingWindow, Count: 2, Window: time.Minute},
		{Algorithm: bucket.Quota, Count: 2, Period: bucket.Day},
		{Algorithm: bucket.Concurrency, Count: 2},
		{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 1},
	}
	for _, l := range limits {
		a, b := buckettest.NewKey(t), buckettest.NewKey(t)
		for redisSlot(a) == redisSlot(b) {
			b = buckettest.NewKey(t)
		}
		full := bucket.Charge{Key: b, Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Minute}}
		r := make([]bucket.Result, 2)
		if ok, err := rs.Take(context.Background(), now, []bucket.Charge{full}, r); err != nil || !ok {
			t.Fatalf("filling b: %v %v", ok, err)
		}
		c := bucket.Charge{Key: a, Limit: l}
		for range 3 {
			ok, err := rs.Take(context.Background(), now, []bucket.Charge{c, full}, r)
			if err != nil {
				t.Fatal(err)
			}
			if ok || !r[0].Allowed || r[1].Allowed {
				t.Fatalf("%v: got admitted=%v %+v, want refused by b alone", l.Algorithm, ok, r)
			}
		}
		p, err := rs.Peek(context.Background(), now, c)
		if err != nil {
			t.Fatal(err)
		}
		want := max(l.Burst, l.Count)
		if l.Algorithm == bucket.LeakyBucket {
			want = l.Burst + 1
		}
		if p.Remaining != want {
			t.Errorf("%v: after three refused groups a peeks %d remaining, want %d (all given back)", l.Algorithm, p.Remaining, want)
		}
	}
}

func redisSlot(k bucket.Key) uint16 { return redisstore.Slot(k.String()) }

// TestSlotMatchesKnownValues pins the CRC16 of the cluster's slots against values Redis gives
// (CLUSTER KEYSLOT).
func TestSlotMatchesKnownValues(t *testing.T) {
	c, _ := newClient(t, &cluster)
	defer c.Close()
	for _, tag := range []string{"foo", "bar", "123456789", strings.Repeat("ab", 16)} {
		want, err := c.Do(context.Background(), c.B().ClusterKeyslot().Key(tag).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if got := redisstore.Slot(tag); int64(got) != want {
			t.Errorf("Slot(%q) = %d, CLUSTER KEYSLOT says %d", tag, got, want)
		}
	}
}
