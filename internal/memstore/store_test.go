package memstore_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

func TestMemoryConformance(t *testing.T) {
	buckettest.Run(t, func(*testing.T) bucket.Store { return memstore.New(memstore.Options{}) })
}

// TestMemoryConformanceOneShard runs the suite with every key in one shard, so groups lock one
// shard once.
func TestMemoryConformanceOneShard(t *testing.T) {
	buckettest.Run(t, func(*testing.T) bucket.Store { return memstore.New(memstore.Options{Shards: 1}) })
}

// t0 is the tests' first instant (a Unix second in 2023, so that no test starts at the epoch).
var t0 = time.Unix(1_700_000_040, 0)

func ms(n int) time.Duration  { return time.Duration(n) * time.Millisecond }
func sec(n int) time.Duration { return time.Duration(n) * time.Second }

// keyN returns a deterministic key whose first 8 bytes (the shard selector) are n.
func keyN(n uint64) bucket.Key {
	var k bucket.Key
	binary.LittleEndian.PutUint64(k[:8], n)
	binary.LittleEndian.PutUint64(k[8:], n*0x9e3779b97f4a7c15)
	return k
}

func takeAt(t *testing.T, m *memstore.Store, now time.Time, cs ...bucket.Charge) (bool, []bucket.Result) {
	t.Helper()
	r := make([]bucket.Result, len(cs))
	ok, err := m.Take(context.Background(), now, cs, r)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	return ok, r
}

var tokenOne = bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}

func TestMemoryTakeErrors(t *testing.T) {
	m := memstore.New(memstore.Options{})
	ok := bucket.Charge{Key: keyN(1), Limit: tokenOne}
	for _, tc := range []struct {
		name    string
		charges []bucket.Charge
		results int
	}{
		{"unknown algorithm", []bucket.Charge{ok, {Key: keyN(2)}}, 2},
		{"too few results", []bucket.Charge{ok, ok}, 1},
	} {
		admitted, err := m.Take(context.Background(), t0, tc.charges, make([]bucket.Result, tc.results))
		if err == nil || admitted {
			t.Errorf("%s: got admitted=%v err=%v, want false and an error", tc.name, admitted, err)
		}
	}
	if m.Len() != 0 {
		t.Errorf("after failed takes: got Len %d, want 0", m.Len())
	}
}

// TestMemorySameKeyTwiceInGroup: two charges on one key in a group spend two requests.
func TestMemorySameKeyTwiceInGroup(t *testing.T) {
	m := memstore.New(memstore.Options{})
	two := bucket.Charge{Key: keyN(1), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}}
	admitted, r := takeAt(t, m, t0, two, two)
	if !admitted || r[0].Remaining != 1 || r[1].Remaining != 0 {
		t.Fatalf("Burst 2, same key twice: got admitted=%v Remaining %d, %d, want true 1, 0", admitted, r[0].Remaining, r[1].Remaining)
	}
	if admitted, _ := takeAt(t, m, t0, two); admitted {
		t.Errorf("third request at the same instant: got admitted, want rejected")
	}
	one := bucket.Charge{Key: keyN(2), Limit: tokenOne}
	if admitted, _ := takeAt(t, m, t0, one, one); admitted {
		t.Errorf("Burst 1, same key twice: got admitted, want rejected")
	}
	if admitted, _ := takeAt(t, m, t0, one); !admitted {
		t.Errorf("Burst 1 after the rejected pair: got rejected, want admitted (nothing committed)")
	}
}

// TestMemoryLargeGroup covers groups beyond the stack buffers.
func TestMemoryLargeGroup(t *testing.T) {
	m := memstore.New(memstore.Options{Shards: 4})
	group := make([]bucket.Charge, 20)
	for i := range group {
		group[i] = bucket.Charge{Key: keyN(uint64(i)), Limit: bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 2, Window: time.Second}}
	}
	if admitted, _ := takeAt(t, m, t0, group...); !admitted {
		t.Fatalf("first group of 20: got rejected, want admitted")
	}
	takeAt(t, m, t0, group[7]) // exhaust one key
	if admitted, r := takeAt(t, m, t0, group...); admitted || r[7].Allowed || !r[6].Allowed {
		t.Fatalf("group with key 7 exhausted: got admitted=%v, charge 7 Allowed=%v, charge 6 Allowed=%v, want false false true",
			admitted, r[7].Allowed, r[6].Allowed)
	}
	if _, r := takeAt(t, m, t0, group[6]); r[0].Remaining != 0 {
		t.Errorf("key 6 after the rejected group: got Remaining %d, want 0", r[0].Remaining)
	}
}

// TestMemoryForgetsIdleKeys: keys whose state equals a fresh key's are swept as new keys arrive,
// and the cap evicts none of them.
func TestMemoryForgetsIdleKeys(t *testing.T) {
	m := memstore.New(memstore.Options{Shards: 1, MaxKeys: 1000})
	limits := []bucket.Limit{
		tokenOne,
		{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 3},
		{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Second},
		{Algorithm: bucket.SlidingWindow, Count: 1, Window: time.Second},
	}
	var n uint64
	for round := range 50 {
		now := t0.Add(time.Duration(round) * 2 * time.Second) // every earlier key is idle by now
		for range 100 {
			n++
			takeAt(t, m, now, bucket.Charge{Key: keyN(n), Limit: limits[n%4]})
		}
		if got := m.Len(); got > 400 {
			t.Fatalf("round %d: got Len %d, want <= 400 (100 live keys, sweeps at twice the size)", round, got)
		}
	}
	if got := m.Evicted(); got != 0 {
		t.Errorf("only idle keys were forgotten: got Evicted %d, want 0", got)
	}
}

// TestMemoryCapEvictsLiveKeys: with more live keys than MaxKeys, the store stays at the cap,
// counts what it evicted, and an evicted key is treated as fresh (lenient, never stricter).
// TestMemoryCapHoldsWithinAGroup: a sweep made room for one charge of a group and forgot an idle
// key that a later charge of the same group stores again. That charge must make room too, or the
// shard ends one key over its cap.
func TestMemoryCapHoldsWithinAGroup(t *testing.T) {
	const maxKeys = 16
	m := memstore.New(memstore.Options{Shards: 1, MaxKeys: maxKeys})
	slow := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e-6, Burst: 2} // live for days, not at its limit
	fast := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1000, Burst: 1} // idle after 1ms
	idle := keyN(1000)
	takeAt(t, m, t0, bucket.Charge{Key: idle, Limit: fast})
	for i := range uint64(maxKeys - 1) {
		takeAt(t, m, t0, bucket.Charge{Key: keyN(i), Limit: slow})
	}
	if got := m.Len(); got != maxKeys {
		t.Fatalf("setup: got Len %d, want %d", got, maxKeys)
	}
	// A new key first (its sweep forgets the idle key), then the idle key again.
	admitted, _ := takeAt(t, m, t0.Add(time.Second),
		bucket.Charge{Key: keyN(500), Limit: slow}, bucket.Charge{Key: idle, Limit: fast})
	if !admitted {
		t.Fatal("group: got rejected, want admitted")
	}
	if got := m.Len(); got > maxKeys {
		t.Errorf("after the group: got Len %d, want <= %d", got, maxKeys)
	}
}

func TestMemoryCapEvictsLiveKeys(t *testing.T) {
	const maxKeys, keys = 160, 1000
	m := memstore.New(memstore.Options{Shards: 1, MaxKeys: maxKeys})
	two := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2} // one request leaves room for one more
	for i := range uint64(keys) {
		if admitted, _ := takeAt(t, m, t0, bucket.Charge{Key: keyN(i), Limit: two}); !admitted {
			t.Fatalf("key %d: got rejected, want admitted (fresh)", i)
		}
		if got := m.Len(); got > maxKeys {
			t.Fatalf("after %d keys: got Len %d, want <= %d", i+1, got, maxKeys)
		}
	}
	if got, want := m.Evicted(), uint64(keys-m.Len()); got != want {
		t.Errorf("got Evicted %d, want %d (keys - Len: every key was live)", got, want)
	}
	// The newest key was inserted after any eviction: it is tracked, one of its two spent.
	for i, want := range []bool{true, false} {
		if admitted, _ := takeAt(t, m, t0, bucket.Charge{Key: keyN(keys - 1), Limit: two}); admitted != want {
			t.Errorf("newest key, request %d: got admitted=%v, want %v", i+2, admitted, want)
		}
	}
}

// TestMemoryGroupsDoNotDeadlock runs groups over overlapping keys in random orders from many
// goroutines at one instant, then checks the outcome is exact: each key's quota was spent by
// exactly the admitted groups that charged it.
func TestMemoryGroupsDoNotDeadlock(t *testing.T) {
	const keys, burst, goroutines, each = 6, 40, 8, 200
	m := memstore.New(memstore.Options{Shards: 4})
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: burst}
	var (
		mu   sync.Mutex
		used [keys]int64
		wg   sync.WaitGroup
	)
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			charges := make([]bucket.Charge, 3)
			results := make([]bucket.Result, 3)
			for range each {
				picked := rng.Perm(keys)[:3]
				for i, k := range picked {
					charges[i] = bucket.Charge{Key: keyN(uint64(k)), Limit: limit}
				}
				admitted, err := m.Take(context.Background(), t0, charges, results)
				if err != nil {
					t.Errorf("Take: %v", err)
					return
				}
				if admitted {
					mu.Lock()
					for _, k := range picked {
						used[k]++
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for k := range keys {
		admitted, rs := takeAt(t, m, t0, bucket.Charge{Key: keyN(uint64(k)), Limit: limit})
		r := rs[0]
		if used[k] > burst {
			t.Errorf("key %d: spent by %d admitted groups, want <= Burst %d", k, used[k], burst)
		}
		wantAdmitted, wantRemaining := used[k] < burst, max(burst-used[k]-1, 0)
		if admitted != wantAdmitted || r.Remaining != wantRemaining {
			t.Errorf("key %d after %d admitted groups: got admitted=%v Remaining %d, want %v %d",
				k, used[k], admitted, r.Remaining, wantAdmitted, wantRemaining)
		}
	}
}

// bytesPerKeyLimits are the limits heapBytesPerKey measures with: one request leaves each key
// live at t0.
var (
	tokenTen   = bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}
	slidingTen = bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 10, Window: time.Minute}
)

// insertKeys takes one request of l for each key at one instant, so all stay live.
func insertKeys(tb testing.TB, m *memstore.Store, keys []bucket.Key, l bucket.Limit) {
	charge := []bucket.Charge{{Limit: l}}
	var r [1]bucket.Result
	for _, k := range keys {
		charge[0].Key = k
		if _, err := m.Take(context.Background(), t0, charge, r[:]); err != nil {
			tb.Fatalf("Take: %v", err)
		}
	}
}

func randomKeys(n int) []bucket.Key {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]bucket.Key, n)
	for i := range keys {
		binary.LittleEndian.PutUint64(keys[i][:8], rng.Uint64())
		binary.LittleEndian.PutUint64(keys[i][8:], rng.Uint64())
	}
	return keys
}

// heapBytesPerKey measures the heap a Memory holding len(keys) live keys of l uses, per key. MaxKeys is set above len(keys): with keys spread unevenly over shards, the default per-shard
// cap would start evicting slightly below it.
func heapBytesPerKey(tb testing.TB, keys []bucket.Key, l bucket.Limit) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := memstore.New(memstore.Options{MaxKeys: 2 * len(keys)})
	insertKeys(tb, m, keys, l)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if got := m.Len(); got != len(keys) {
		tb.Fatalf("got Len %d, want %d", got, len(keys))
	}
	runtime.KeepAlive(m)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(len(keys))
}

func TestMemoryBytesPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 1M keys")
	}
	const limit = 128
	if got := heapBytesPerKey(t, randomKeys(1_000_000), tokenTen); got > limit {
		t.Errorf("got %.1f B per token-bucket key at 1M keys, want <= %d", got, limit)
	} else {
		t.Logf("%.1f B per token-bucket key at 1M keys", got)
	}
}

// TestMemoryDecidesPastTheDeadline: an overloaded process may reach Take after the decision's
// deadline; the memory store still decides (and spends), so overload never means "no limits".
func TestMemoryDecidesPastTheDeadline(t *testing.T) {
	m := memstore.New(memstore.Options{})
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	c := []bucket.Charge{{Key: buckettest.NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}}}
	var r [1]bucket.Result
	for i, want := range []bool{true, false} {
		admitted, err := m.Take(ctx, t0, c, r[:])
		if err != nil || admitted != want {
			t.Fatalf("take %d past the deadline: got admitted=%v err=%v, want %v and no error", i, admitted, err, want)
		}
	}
}

func TestMemoryReleaseConformance(t *testing.T) {
	buckettest.RunRelease(t, func(*testing.T) bucket.Releaser { return memstore.New(memstore.Options{}) })
}
