package memstore

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// floodVictims are keys at their limit, one per algorithm, that a flood must not reset.
var floodVictims = []struct {
	name  string
	limit bucket.Limit
	takes int // takes that bring a fresh key to its limit
}{
	{"quota", bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Day}, 5},
	{"token_bucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600, Burst: 3}, 3},
	{"fixed_window", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Hour}, 3},
	{"sliding_window", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 3, Window: time.Hour}, 3},
	{"concurrency", bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}, 2},
}

// TestMemoryFloodKeepsExhaustedKeys is issue 18's flood on the store: max_keys 2,000; victims at
// their limit on every algorithm; then 20 times max_keys random keys and 4,000 keys crafted
// against the shard choice the store had before (the low bits of the key's first 8 bytes: an
// attacker who knows the policy name computes the digest of each value), all at full speed
// (one microsecond apart), first as clients with room left, then as clients that exhaust their
// own limit with one request. Every victim must still be at its limit afterwards, and the store
// must hold at most max_keys.
func TestMemoryFloodKeepsExhaustedKeys(t *testing.T) {
	const maxKeys = 2000
	ctx := context.Background()
	m := New(Options{MaxKeys: maxKeys})
	rng := rand.New(rand.NewPCG(18, 3))
	newKey := func() bucket.Key {
		var k bucket.Key
		binary.LittleEndian.PutUint64(k[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(k[8:], rng.Uint64())
		return k
	}
	now := t0ns
	take := func(k bucket.Key, l bucket.Limit) bool {
		var r [1]bucket.Result
		ok, err := m.Take(ctx, time.Unix(0, now), []bucket.Charge{{Key: k, Limit: l}}, r[:])
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	victims := make([]bucket.Key, len(floodVictims))
	for i, v := range floodVictims {
		victims[i] = newKey()
		for j := range v.takes {
			if !take(victims[i], v.limit) {
				t.Fatalf("%s victim: take %d rejected, want admitted", v.name, j+1)
			}
		}
		if take(victims[i], v.limit) {
			t.Fatalf("%s victim: a take past its limit admitted", v.name)
		}
	}
	// Keys crafted for the quota victim's shard under the old choice.
	oldShard := binary.LittleEndian.Uint64(victims[0][:8]) & m.mask
	crafted := make([]bucket.Key, 0, 4000)
	for len(crafted) < cap(crafted) {
		if k := newKey(); binary.LittleEndian.Uint64(k[:8])&m.mask == oldShard {
			crafted = append(crafted, k)
		}
	}
	roomy := bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Day}      // one request leaves four
	exhausting := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Day} // one request is the limit
	for _, l := range []bucket.Limit{roomy, exhausting} {
		flood := append([]bucket.Key(nil), crafted...)
		for range 20 * maxKeys {
			flood = append(flood, newKey())
		}
		rng.Shuffle(len(flood), func(i, j int) { flood[i], flood[j] = flood[j], flood[i] })
		for _, k := range flood {
			now += int64(time.Microsecond)
			take(k, l)
		}
		if got := m.Len(); got > maxKeys {
			t.Errorf("after the flood: got Len %d, want at most %d", got, maxKeys)
		}
		e := m.Evictions()
		t.Logf("flood with Count %d: %+v, %d keys tracked", l.Count, e, m.Len())
		if l == roomy && e.LeastUsed == 0 || l == exhausting && m.Overflowed() == 0 {
			t.Errorf("flood with Count %d: got %+v, %d overflowed, want least-used evictions (room left) or new keys judged in the sketch (every key at its limit)",
				l.Count, e, m.Overflowed())
		}
		for i, v := range floodVictims {
			if take(victims[i], v.limit) {
				t.Errorf("%s victim after a flood of %d keys (%d crafted) with Count %d: admitted, want still at its limit",
					v.name, len(flood), len(crafted), l.Count)
			}
		}
	}
}

// TestMemoryShardChoiceIsKeyed: keys crafted to share the low bits of their first 8 bytes (the
// shard the store once picked from them) spread over the shards like random keys, and two
// stores place the same key independently.
func TestMemoryShardChoiceIsKeyed(t *testing.T) {
	m := New(Options{MaxKeys: 2000})
	shards := len(m.shards)
	rng := rand.New(rand.NewPCG(18, 4))
	const n = 4000
	var count = make([]int, shards)
	for i := 0; i < n; {
		var k bucket.Key
		binary.LittleEndian.PutUint64(k[:8], rng.Uint64())
		binary.LittleEndian.PutUint64(k[8:], rng.Uint64())
		if binary.LittleEndian.Uint64(k[:8])&m.mask != 0 {
			continue
		}
		count[m.shardOf(k)]++
		i++
	}
	// Uniform: n/shards per shard (62.5 for 64 shards), a standard deviation of about 8. Crafted
	// against the old choice, all n landed in shard 0.
	top := 0
	for _, c := range count {
		top = max(top, c)
	}
	if limit := 3 * n / shards; top > limit {
		t.Errorf("crafted keys: the fullest shard got %d of %d, want at most %d (%d shards, uniform %d)", top, n, limit, shards, n/shards)
	}
	other := New(Options{MaxKeys: 2000})
	same := 0
	for i := range 1000 {
		k := bucket.Key{byte(i), byte(i >> 8)}
		if m.shardOf(k) == other.shardOf(k) {
			same++
		}
	}
	if limit := 3 * 1000 / shards; same > limit {
		t.Errorf("two stores put %d of 1000 keys in the same shard, want about %d: the seed is not per store", same, 1000/shards)
	}
}

// TestMemoryEvictionOrder: a full shard forgets idle keys first, then the least used, never a
// key at its limit; when only keys at their limit are left, a new key is judged in the sketch
// (at its own limit), counted, until keys leave their limit and the sketch's cells empty.
func TestMemoryEvictionOrder(t *testing.T) {
	const maxKeys = 32
	ctx := context.Background()
	m := New(Options{Shards: 1, MaxKeys: maxKeys})
	sh := &m.shards[0]
	hour := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600}
	atLimit, half, light := hour, hour, hour
	atLimit.Burst, half.Burst, light.Burst = 2, 4, 16
	fast := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1000, Burst: 2} // idle a millisecond later
	now := time.Unix(0, t0ns)
	take := func(k bucket.Key, l bucket.Limit, n int) bucket.Result {
		t.Helper()
		var r [1]bucket.Result
		for range n {
			if _, err := m.Take(ctx, now, []bucket.Charge{{Key: k, Limit: l}}, r[:]); err != nil {
				t.Fatal(err)
			}
		}
		return r[0]
	}
	key := func(group, i int) bucket.Key { return bucket.Key{byte(group), byte(i)} }
	stored := func(k bucket.Key, l bucket.Limit) bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.has(&bucket.Charge{Key: k, Limit: l})
	}
	for i := range 8 {
		take(key(1, i), atLimit, 2)
		take(key(2, i), half, 2)
		take(key(3, i), fast, 1)
	}
	now = now.Add(time.Second)
	for i := range 8 {
		take(key(4, i), light, 1)
	}
	if got := m.Len(); got != maxKeys {
		t.Fatalf("setup: got Len %d, want %d", got, maxKeys)
	}
	// 40 more light keys: the idle ones go first, then light ones (the new keys themselves).
	for i := range 40 {
		take(key(5, i), light, 1)
		if got := m.Len(); got > maxKeys {
			t.Fatalf("new key %d: got Len %d, want at most %d", i, got, maxKeys)
		}
	}
	for i := range 8 {
		if stored(key(3, i), fast) {
			t.Errorf("idle key %d still stored, want forgotten first", i)
		}
		if !stored(key(1, i), atLimit) {
			t.Errorf("key %d at its limit evicted", i)
		}
		if !stored(key(2, i), half) {
			t.Errorf("half-used key %d evicted while lighter ones were left", i)
		}
	}
	e := m.Evictions()
	if e.Idle != 8 || e.LeastUsed == 0 || e.Refused != 0 {
		t.Errorf("got %+v, want 8 idle, some least used, none refused", e)
	}
	// A flood of keys that each reach their limit with one request: the shard ends full of
	// keys at their limit (the half-used ones are evicted on the way), and the rest are judged
	// in the sketch, each at its own limit.
	exhausted := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600, Burst: 1}
	for i := range 200 {
		take(key(6, i), exhausted, 1)
	}
	if e := m.Evictions(); e.Refused != 0 || m.Overflowed() == 0 {
		t.Errorf("flood of keys at their limit: got %+v, %d judged in the sketch, want none refused, some in the sketch", e, m.Overflowed())
	}
	// A shadow charge that needs a new key is judged in the sketch and not stored.
	before, overflowed := m.Evictions(), m.Overflowed()
	var sr [1]bucket.Result
	if ok, err := m.Take(ctx, now, []bucket.Charge{{Key: key(7, 1), Limit: light, Shadow: true}}, sr[:]); err != nil || !ok || !sr[0].Allowed {
		t.Errorf("shadow charge for a new key in a full shard: got admitted=%v %+v %v, want admitted by the sketch", ok, sr[0], err)
	}
	if stored(key(7, 1), light) || m.Overflowed() != overflowed {
		t.Errorf("shadow charge in the sketch: stored %v, %d judged there after %d; want not stored, not counted",
			stored(key(7, 1), light), m.Overflowed(), overflowed)
	}
	// New keys of the light limit (burst 16) are judged at their own limit, not on one shared
	// bucket (which admitted 15 of them, then refused every other for an hour a token): 20 new
	// keys are admitted. Then one of them is taken until refused: never more than its burst in
	// all, and told to come back within the hour (a token an hour).
	for i := range 20 {
		if r := take(key(8, i), light, 1); !r.Allowed || r.Token&sketchToken == 0 {
			t.Fatalf("new key %d in a full shard: got %+v, want admitted by the sketch", i, r)
		}
	}
	admitted, judged := 1, 21
	var r bucket.Result
	for r = take(key(8, 0), light, 1); r.Allowed; r = take(key(8, 0), light, 1) {
		admitted, judged = admitted+1, judged+1
		if admitted > 16 {
			t.Fatalf("a key judged in the sketch: %d admitted, past its burst of 16", admitted)
		}
	}
	if r.RetryAfter <= 0 || r.RetryAfter > time.Hour {
		t.Fatalf("a key at its limit in the sketch: got %+v, want rejected with a RetryAfter within the hour", r)
	}
	after := m.Evictions()
	if after.Refused != before.Refused || after.LeastUsed != before.LeastUsed || m.Overflowed() != overflowed+uint64(judged) {
		t.Errorf("sketch: got %+v and %d judged after %+v and %d, want no refusal, no eviction, %d more judged in the sketch",
			after, m.Overflowed(), before, overflowed, judged)
	}
	for i := range 8 {
		if !stored(key(1, i), atLimit) {
			t.Errorf("key %d at its limit evicted by the keys judged in the sketch", i)
		}
	}
	// Once every key has room again and the sketch's cells have emptied (the key taken to its
	// burst above charged its cells 16 hours ahead), a new key is stored again.
	now = now.Add(17 * time.Hour)
	if r := take(key(7, 0), light, 1); !r.Allowed || r.Token&sketchToken != 0 || !stored(key(7, 0), light) {
		t.Errorf("a new key once keys have left their limit: got %+v (stored %v), want admitted and stored", r, stored(key(7, 0), light))
	}
}
