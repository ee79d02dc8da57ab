package memstore

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestMemoryPoolFloodLeavesOtherPools is issue 26 item 7 on the store: a flood of 20 times
// max_keys new keys in one pool, each at its limit after one request, used to fill every shard
// and refuse the new keys of every policy. Now the flood fills its pool's share: every new key
// of another pool is stored (alone, in a group with another new key, or beside the flooding
// pool's), the flood's later keys are judged in the sketch (each at its own limit of 1 a day;
// 38,000 of them saturate its cells, so that the later ones are refused early, and counted), no
// key at its limit is reset, and the store never holds more than max_keys.
func TestMemoryPoolFloodLeavesOtherPools(t *testing.T) {
	const maxKeys = 2000
	ctx := context.Background()
	m := New(Options{MaxKeys: maxKeys})
	m.SetPools("flood", "victim")
	// The sketch's seed is random in production; whether a new flood key finds all four of its
	// cells charged is then a matter of chance (rarely one is still empty, and the group is
	// admitted). A fixed seed makes the run repeatable.
	m.sk.seed = [3]uint64{0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb}
	rng := rand.New(rand.NewPCG(26, 7))
	newKey := func() bucket.Key {
		var k bucket.Key
		binary.LittleEndian.PutUint64(k[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(k[8:], rng.Uint64())
		return k
	}
	now := time.Unix(0, t0ns)
	once := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Day}
	perIP := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 5, Burst: 5}
	take := func(cs ...bucket.Charge) (bool, []bucket.Result) {
		t.Helper()
		r := make([]bucket.Result, len(cs))
		now = now.Add(time.Microsecond)
		ok, err := m.Take(ctx, now, cs, r)
		if err != nil {
			t.Fatal(err)
		}
		return ok, r
	}
	stored := func(c bucket.Charge) bool {
		sh := &m.shards[m.shardOf(c.Key)]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.has(&c)
	}
	var flooded []bucket.Key
	for range 20 * maxKeys {
		k := newKey()
		if _, r := take(bucket.Charge{Key: k, Limit: once, Pool: "flood"}); r[0].Allowed && r[0].Token&sketchToken == 0 {
			flooded = append(flooded, k)
		}
	}
	if n := m.Len(); n > maxKeys/2+len(m.shards) {
		t.Errorf("after the flood: %d keys, want the flood's share, about %d", n, maxKeys/2)
	}
	if got := m.Overflowed(); got < 20*maxKeys-maxKeys {
		t.Errorf("overflowed: got %d, want the flood's keys beyond its share (at least %d)", got, 20*maxKeys-maxKeys)
	}
	if e := m.Evictions(); e.Refused != 0 {
		t.Errorf("refused: got %d, want 0 (the sketch decides)", e.Refused)
	}
	// Another pool's new keys: alone, two in a group, and beside a new key of the flood.
	for i := range 300 {
		c := bucket.Charge{Key: newKey(), Limit: perIP, Pool: "victim"}
		switch i % 3 {
		case 0:
			if ok, r := take(c); !ok || r[0].Token&sketchToken != 0 || !stored(c) {
				t.Fatalf("victim key %d after the flood: got %v %+v (stored %v), want admitted and stored", i, ok, r[0], stored(c))
			}
		case 1:
			d := bucket.Charge{Key: newKey(), Limit: perIP, Pool: "victim"}
			if ok, _ := take(c, d); !ok || !stored(c) || !stored(d) {
				t.Fatalf("a group of two new victim keys after the flood: got %v (stored %v %v), want admitted and stored", ok, stored(c), stored(d))
			}
		case 2:
			// The flood has saturated the sketch (38,000 keys at their limit in 4 rows of 4,096
			// cells): a new flood key is refused early, the group is rejected, and commits nothing.
			f := bucket.Charge{Key: newKey(), Limit: once, Pool: "flood"}
			if ok, r := take(c, f); ok || !r[0].Allowed || r[1].Allowed || stored(c) {
				t.Fatalf("a victim key beside a flood key: got %v %+v, want rejected by the saturated sketch alone, nothing stored", ok, r)
			}
		}
	}
	// No key at its limit was reset.
	for i, k := range flooded {
		if ok, r := take(bucket.Charge{Key: k, Limit: once, Pool: "flood"}); ok {
			t.Fatalf("flooded key %d of %d: admitted again (%+v), want still at its limit", i, len(flooded), r[0])
		}
	}
	if n := m.Len(); n > maxKeys {
		t.Errorf("Len: got %d, want at most %d", n, maxKeys)
	}
}

// TestMemoryPoolShare: a pool of a store that knows n pools holds at most maxKeys/n keys of a
// shard; past it, the pool's least used keys go first (idle ones before), never another pool's.
func TestMemoryPoolShare(t *testing.T) {
	ctx := context.Background()
	m := New(Options{Shards: 1, MaxKeys: 64})
	m.SetPools("a", "b")
	now := time.Unix(0, t0ns)
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Hour}
	take := func(k bucket.Key, pool string) bucket.Result {
		t.Helper()
		var r [1]bucket.Result
		if _, err := m.Take(ctx, now, []bucket.Charge{{Key: k, Limit: l, Pool: pool}}, r[:]); err != nil {
			t.Fatal(err)
		}
		return r[0]
	}
	for i := range 32 {
		take(bucket.Key{'b', byte(i)}, "b")
	}
	for i := range 200 {
		if r := take(bucket.Key{'a', byte(i)}, "a"); !r.Allowed {
			t.Fatalf("pool a key %d: got %+v, want admitted (its own least used make room)", i, r)
		}
	}
	sh := &m.shards[0]
	sh.mu.Lock()
	a, b := sh.poolKeys(m.poolIndex("a")), sh.poolKeys(m.poolIndex("b"))
	sh.mu.Unlock()
	if a > 32 || b != 32 {
		t.Errorf("keys per pool: a %d, b %d; want a within its share of 32 and b's 32 untouched", a, b)
	}
	for i := range 32 {
		sh.mu.Lock()
		ok := sh.has(&bucket.Charge{Key: bucket.Key{'b', byte(i)}, Limit: l})
		sh.mu.Unlock()
		if !ok {
			t.Errorf("pool b key %d evicted by pool a's keys", i)
		}
	}
}
