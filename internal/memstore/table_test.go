package memstore

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestShardTablesInOneLinePair: a decision touches the shard's mutex and one table header;
// keeping both in the shard's first 128 bytes (a pair of cache lines the adjacent-line
// prefetcher moves together) saves a line transfer per decision on a contended hot key.
func TestShardTablesInOneLinePair(t *testing.T) {
	var sh shard
	for _, f := range []struct {
		name      string
		off, size uintptr
	}{
		{"mu", unsafe.Offsetof(sh.mu), unsafe.Sizeof(sh.mu)},
		{"gcra", unsafe.Offsetof(sh.gcra), unsafe.Sizeof(sh.gcra)},
		{"fixed", unsafe.Offsetof(sh.fixed), unsafe.Sizeof(sh.fixed)},
		{"sliding", unsafe.Offsetof(sh.sliding), unsafe.Sizeof(sh.sliding)},
	} {
		if end := f.off + f.size; end > 128 {
			t.Errorf("shard.%s ends at byte %d, want <= 128", f.name, end)
		}
	}
}

// TestTableMatchesMap applies random puts, removes, sweeps, evictions and shrinks to a table of
// each state kind the memory store keeps and to a map. The hash multiplier is 1, so a key's home
// is the top bits of its second half: keys drawn with a few distinct top bytes (one of them all
// ones, whose run wraps past the last slot) make long runs, which deletions must keep
// probe-reachable.
func TestTableMatchesMap(t *testing.T) {
	t.Run("compactSliding", func(t *testing.T) {
		testTableMatchesMap(t,
			func(rng *rand.Rand) compactSliding {
				return compactSliding{slot: rng.Int64N(1000), tag: uint16(1 + rng.IntN(3)), counts: [bucket.SlidingRing]uint16{uint16(rng.IntN(3))}}
			},
			func(s *compactSliding) bool { return s.counts[0] == 0 })
	})
	t.Run("gcra", func(t *testing.T) {
		testTableMatchesMap(t,
			func(rng *rand.Rand) int64 { return 1 + rng.Int64N(6) },
			func(tat *int64) bool { return bucket.GCRAIdle(*tat, 2) })
	})
	t.Run("fixed", func(t *testing.T) {
		testTableMatchesMap(t,
			func(rng *rand.Rand) bucket.FixedState {
				return bucket.FixedState{End: 1 + rng.Int64N(3), Count: 1 + rng.Int64N(2)}
			},
			func(s *bucket.FixedState) bool { return s.Idle(1) })
	})
}

// testTableMatchesMap runs TestTableMatchesMap for states of type S drawn by state (never the
// zero S), with idle choosing the states a sweep deletes (about a third of them).
func testTableMatchesMap[S comparable](t *testing.T, state func(*rand.Rand) S, idle func(*S) bool) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 9))
	tops := []uint64{0, 0x7f, 0xff, 0xfe}
	newKey := func() bucket.Key {
		var k bucket.Key
		binary.LittleEndian.PutUint64(k[:8], rng.Uint64N(64))
		binary.LittleEndian.PutUint64(k[8:], tops[rng.IntN(len(tops))]<<56|rng.Uint64N(4)<<50)
		return k
	}
	tab := newTable[S](1)
	model := map[bucket.Key]S{}
	var zero S
	most := 0
	check := func(step int, op string) {
		t.Helper()
		if tab.n != len(model) {
			t.Fatalf("step %d (%s): got n %d, want %d", step, op, tab.n, len(model))
		}
		occupied := 0
		for i := range tab.slots {
			if tab.slots[i].st != zero {
				occupied++
			}
		}
		if occupied != tab.n {
			t.Fatalf("step %d (%s): %d occupied slots, n %d", step, op, occupied, tab.n)
		}
		if 4*tab.n > 3*len(tab.slots) {
			t.Fatalf("step %d (%s): %d keys in %d slots, want at most 3/4 full", step, op, tab.n, len(tab.slots))
		}
		for k, want := range model {
			got, ok := tab.get(&k)
			if !ok || got != want {
				t.Fatalf("step %d (%s): key %x: got %+v, found=%v, want %+v", step, op, k, got, ok, want)
			}
		}
	}
	for step := range 20_000 {
		var op string
		switch r := rng.IntN(100); {
		case r < 60:
			op = "put"
			k, st := newKey(), state(rng)
			tab.put(&k, &st)
			model[k] = st
		case r < 85:
			op = "remove"
			k := newKey()
			tab.remove(&k)
			delete(model, k)
		case r < 92:
			op = "sweep"
			tab.deleteWhile(idle, func() bool { return false })
			for k, s := range model {
				if idle(&s) {
					delete(model, k)
				}
			}
		case r < 94:
			op = "evict"
			n, low := tab.n, tab.n/2
			tab.deleteWhile(func(*S) bool { n--; return true }, func() bool { return n <= low })
			if tab.n != low || n != low {
				t.Fatalf("step %d: evicted down to %d (counted %d), want %d", step, tab.n, n, low)
			}
			for k := range model {
				if _, ok := tab.find(&k); !ok {
					delete(model, k)
				}
			}
		default:
			op = "shrink"
			tab.shrink()
		}
		// A full check reads every key; after every deletion (where a probe run can break) and
		// every fourth insertion is enough, and keeps the test quick under -race.
		if op != "put" || step%4 == 0 {
			check(step, op)
		}
		most = max(most, len(tab.slots))
	}
	if most < 256 {
		t.Errorf("the table never grew past %d slots: the test exercises too little", most)
	}
}
