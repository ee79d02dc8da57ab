package memstore

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestWidthTag(t *testing.T) {
	for _, tc := range []struct {
		w  int64
		ok bool
	}{
		{1, true}, {9, true}, {10, true}, {4095, true}, {4096, false}, {40950, true}, {40960, false},
		{1e7, true},             // Window 100ms
		{6e9, true},             // 1m
		{33_300_000, true},      // 333ms
		{540_000_000_000, true}, // 1h30m
		{123_457, false},        // a Window of 1234567ns
		{123_456_780, false},    // 1.2345678s
		{bucket.MaxSpan / bucket.SlidingSlots, false},
		{4095e15, true}, // the largest exponent
		{1e16, true},    // the exponent stops at 15: m = 10
		{4096e15, false},
	} {
		tag, ok := widthTag(tc.w)
		if ok != tc.ok {
			t.Errorf("widthTag(%d): got ok=%v, want %v", tc.w, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if tag == 0 {
			t.Errorf("widthTag(%d): got tag 0, the fresh key's", tc.w)
		}
		if got := (&compactSliding{tag: tag}).width(); got != tc.w {
			t.Errorf("width of widthTag(%d) = %#x: got %d, want %d", tc.w, tag, got, tc.w)
		}
	}
	if got := (&compactSliding{}).width(); got != 0 {
		t.Errorf("width of a fresh compact state: got %d, want 0", got)
	}
}

// memSliding returns where the shard holding k keeps k's sliding state: "compact", "wide", or
// "" when neither map holds it; it fails if both do.
func memSliding(t *testing.T, m *Store, k bucket.Key) (bucket.SlidingState, string) {
	t.Helper()
	sh := &m.shards[m.shardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, inCompact := sh.sliding.find(&k)
	ws, inWide := sh.wide[k]
	switch {
	case inCompact && inWide:
		t.Fatalf("key in both the compact and the wide map")
	case inCompact:
		return sh.sliding.slots[i].st.wide(), "compact"
	case inWide:
		return ws.SlidingState, "wide"
	}
	return bucket.SlidingState{}, ""
}

// TestMemorySlidingMatchesSliding drives one memory-store key and a SlidingState kept by hand with
// the same requests, alone or in groups (next to another key, or twice in one group), while the
// Limit changes as reloads would: Counts either side of the compact form's 65535, Windows whose
// slot width has a tag and ones whose width has none, bursts that push one counter above 65535.
// Every verdict must be Sliding's, the stored state must equal the hand-kept one in whichever
// map holds it, and a key must be compact exactly when its state and Count allow it.
func TestMemorySlidingMatchesSliding(t *testing.T) {
	ctx := context.Background()
	counts := []int64{0, 1, 7, 100, 65_534, 65_535, 65_536, 70_000, 1 << 20}
	windows := []time.Duration{100 * time.Millisecond, time.Second, time.Minute, 333 * time.Millisecond,
		1_234_567, 1_234_567_800, 10} // 1234567ns and 1.2345678s have no width tag
	rng := rand.New(rand.NewPCG(7, 11))
	key, other := bucket.Key{1, 2, 3}, bucket.Key{4, 5, 6}
	roomy := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e9, Burst: 1 << 40}
	bursts := 0
	seen := map[string]int{}
	for round := range 24 {
		m := New(Options{Shards: 1 + round%2*15})
		l := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: counts[rng.IntN(len(counts))], Window: windows[rng.IntN(len(windows))]}
		var ref bucket.SlidingState
		now := t0ns + int64(round)*int64(time.Hour)
		var res [2]bucket.Result
		for i := range 400 {
			w := bucket.SlidingWidth(l)
			n := 1
			switch r := rng.IntN(100); {
			case r < 40:
				now += rng.Int64N(w/2 + 1)
			case r < 70:
				now += rng.Int64N(3*w + 1)
			case r < 75:
				now += rng.Int64N(20*w + 1)
			case r < 80:
				now -= rng.Int64N(3*w + 1)
			case r < 88:
				l.Count = counts[rng.IntN(len(counts))]
			case r < 93:
				l.Window = windows[rng.IntN(len(windows))]
			case r < 95 && l.Count > maxCompactCount && bursts < 12:
				// Enough requests at one instant to take one counter past 16 bits.
				n = maxCompactCount + 1 + rng.IntN(100)
				bursts++
			}
			for range n {
				var got bucket.Result
				switch mode := rng.IntN(4); mode {
				case 0, 1: // one charge
					if _, err := m.Take(ctx, time.Unix(0, now), []bucket.Charge{{Key: key, Limit: l}}, res[:1]); err != nil {
						t.Fatal(err)
					}
					got = noToken(res[0])
					next, r := bucket.Sliding(ref, now, l)
					if r.Allowed {
						ref = next
					}
					if got != r {
						t.Fatalf("round %d step %d (one charge, %+v at %d): got %+v, want %+v", round, i, l, now, got, r)
					}
				case 2: // a group with another key, which always conforms
					if _, err := m.Take(ctx, time.Unix(0, now), []bucket.Charge{{Key: other, Limit: roomy}, {Key: key, Limit: l}}, res[:]); err != nil {
						t.Fatal(err)
					}
					next, r := bucket.Sliding(ref, now, l)
					if r.Allowed {
						ref = next
					}
					if noToken(res[1]) != r {
						t.Fatalf("round %d step %d (group, %+v at %d): got %+v, want %+v", round, i, l, now, res[1], r)
					}
				case 3: // the key twice in one group: committed only if both conform
					admitted, err := m.Take(ctx, time.Unix(0, now), []bucket.Charge{{Key: key, Limit: l}, {Key: key, Limit: l}}, res[:])
					if err != nil {
						t.Fatal(err)
					}
					next1, r1 := bucket.Sliding(ref, now, l)
					from := ref
					if r1.Allowed {
						from = next1
					}
					next2, r2 := bucket.Sliding(from, now, l)
					if r1.Allowed && r2.Allowed {
						ref = next2
					}
					if noToken(res[0]) != r1 || noToken(res[1]) != r2 || admitted != (r1.Allowed && r2.Allowed) {
						t.Fatalf("round %d step %d (twice, %+v at %d): got %v %+v %+v, want %+v %+v", round, i, l, now, admitted, res[0], res[1], r1, r2)
					}
				}
			}
			st, where := memSliding(t, m, key)
			seen[where]++
			if st != ref {
				t.Fatalf("round %d step %d: stored state (%q) %+v, want %+v", round, i, where, st, ref)
			}
			_, fits := compactOf(&ref)
			// A key stored only under the current Limit's Count is compact iff it fits; one last
			// stored under an earlier Count may stay in the form it had.
			if where == "compact" && !fits {
				t.Fatalf("round %d step %d: state %+v in the compact map, does not fit it", round, i, ref)
			}
		}
	}
	if bursts == 0 || seen["compact"] == 0 || seen["wide"] == 0 {
		t.Errorf("%d bursts past 16 bits, steps ending compact/wide: %d/%d: the test exercises too little",
			bursts, seen["compact"], seen["wide"])
	}
	t.Logf("%d bursts; steps ending compact %d, wide %d, absent %d", bursts, seen["compact"], seen["wide"], seen[""])
}

// t0ns is an instant near t0 of the external tests, in Unix ns.
const t0ns = 1_700_000_040 * int64(time.Second)

// TestMemorySlidingConversionsKeepCounts: a reload that moves a key's Count across 65535 moves
// the key between the compact and the wide map with its counts, in both directions, and a key
// whose counter no longer fits 16 bits stays wide under a small Count.
func TestMemorySlidingConversionsKeepCounts(t *testing.T) {
	ctx := context.Background()
	m := New(Options{Shards: 1})
	key := bucket.Key{9}
	now := time.Unix(0, t0ns)
	small := bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 100, Window: 10 * time.Second}
	big := small
	big.Count = 100_000
	var r [1]bucket.Result
	take := func(l bucket.Limit, n int) {
		t.Helper()
		for range n {
			if _, err := m.Take(ctx, now, []bucket.Charge{{Key: key, Limit: l}}, r[:]); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(step string, wantRemaining int64, wantWhere string) {
		t.Helper()
		if !r[0].Allowed || r[0].Remaining != wantRemaining {
			t.Errorf("%s: got Allowed %v Remaining %d, want true %d", step, r[0].Allowed, r[0].Remaining, wantRemaining)
		}
		if _, where := memSliding(t, m, key); where != wantWhere {
			t.Errorf("%s: key in the %q map, want %q", step, where, wantWhere)
		}
	}
	take(small, 40)
	check("40 under Count 100", 60, "compact")
	take(big, 1)
	check("then 1 under Count 100000", 100_000-41, "wide")
	take(small, 1)
	check("then 1 under Count 100 again", 100-42, "compact")
	// 70000 in the newest slot: no longer fits the compact form, whatever the Count.
	take(big, 70_000-42)
	check("70000 under Count 100000", 30_000, "wide")
	take(small, 1)
	if r[0].Allowed || r[0].RetryAfter != 11*time.Second {
		t.Errorf("under Count 100 with 70000 counted: got %+v, want rejected for 11s (K+1 slots)", r[0])
	}
	if st, where := memSliding(t, m, key); where != "wide" || st.Counts[bucket.SlidingIndex(st.Slot)] != 70_000 {
		t.Errorf("after the rejection: %q map, newest counter %d, want wide, 70000", where, st.Counts[bucket.SlidingIndex(st.Slot)])
	}
	// Once the 70000 have left, the next request under Count 100 brings it back to compact.
	now = now.Add(11 * time.Second)
	take(small, 1)
	check("11s later under Count 100", 99, "compact")
}

// TestMemoryCapCountsWideKeys: keys kept wide count towards MaxKeys like the others; the store
// never exceeds it with compact and wide sliding keys mixed, and evicts only what it must.
func TestMemoryCapCountsWideKeys(t *testing.T) {
	const maxKeys, keys = 160, 1000
	m := New(Options{Shards: 1, MaxKeys: maxKeys})
	now := time.Unix(0, t0ns)
	limits := []bucket.Limit{
		{Algorithm: bucket.SlidingWindow, Count: 100_000, Window: time.Minute}, // wide: Count
		{Algorithm: bucket.SlidingWindow, Count: 10, Window: 1_234_567_800},    // wide: width
		{Algorithm: bucket.SlidingWindow, Count: 10, Window: time.Minute},      // compact
		{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Minute},        // another map
	}
	var r [1]bucket.Result
	for i := range keys {
		k := bucket.Key{byte(i), byte(i >> 8), 1}
		admitted, err := m.Take(context.Background(), now, []bucket.Charge{{Key: k, Limit: limits[i%len(limits)]}}, r[:])
		if err != nil || !admitted {
			t.Fatalf("key %d: got admitted=%v err=%v, want a fresh key admitted", i, admitted, err)
		}
		if got := m.Len(); got > maxKeys {
			t.Fatalf("after %d keys: got Len %d, want <= %d", i+1, got, maxKeys)
		}
	}
	sh := &m.shards[0]
	if len(sh.wide) == 0 || sh.sliding.n == 0 {
		t.Errorf("got %d wide and %d compact keys, want some of each", len(sh.wide), sh.sliding.n)
	}
	if got, want := m.Evicted(), uint64(keys-m.Len()); got != want {
		t.Errorf("got Evicted %d, want %d (keys - Len: every key was live)", got, want)
	}
	// Every key is idle a minute and a slot later: the next sweep forgets them all, wide or not.
	later := now.Add(time.Minute + 7*time.Second)
	before := m.Evicted()
	for i := range maxKeys / 2 {
		k := bucket.Key{byte(i), byte(i >> 8), 2}
		if _, err := m.Take(context.Background(), later, []bucket.Charge{{Key: k, Limit: limits[2]}}, r[:]); err != nil {
			t.Fatal(err)
		}
	}
	if len(sh.wide) != 0 {
		t.Errorf("idle wide keys after a sweep: got %d, want 0", len(sh.wide))
	}
	if got := m.Evicted(); got != before {
		t.Errorf("idle keys only: got %d more evicted, want 0", got-before)
	}
}

// noToken is r without its Token: the memory store's is the entry's generation (opaque), which
// the pure functions the tests compare with know nothing of.
func noToken(r bucket.Result) bucket.Result {
	r.Token = 0
	return r
}
