package bucket

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestSlidingTableMatchesMap applies random puts, removes, sweeps, evictions and shrinks to a
// slidingTable and to a map. The hash multiplier is 1, so a key's home is the top bits of its
// second half: keys drawn with a few distinct top bytes (one of them all ones, whose run wraps
// past the last slot) make long runs, which deletions must keep probe-reachable.
func TestSlidingTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 9))
	tops := []uint64{0, 0x7f, 0xff, 0xfe}
	newKey := func() Key {
		var k Key
		binary.LittleEndian.PutUint64(k[:8], rng.Uint64N(64))
		binary.LittleEndian.PutUint64(k[8:], tops[rng.IntN(len(tops))]<<56|rng.Uint64N(4)<<50)
		return k
	}
	state := func() compactSliding {
		return compactSliding{slot: rng.Int64N(1000), tag: uint16(1 + rng.IntN(3)), counts: [slidingRing]uint16{uint16(rng.IntN(3))}}
	}
	tab := newSlidingTable(1)
	model := map[Key]compactSliding{}
	most := 0
	check := func(step int, op string) {
		t.Helper()
		if tab.n != len(model) {
			t.Fatalf("step %d (%s): got n %d, want %d", step, op, tab.n, len(model))
		}
		occupied := 0
		for i := range tab.slots {
			if tab.slots[i].st.tag != 0 {
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
			i, ok := tab.find(&k)
			if !ok || tab.slots[i].st != want {
				t.Fatalf("step %d (%s): key %x: got found=%v, want its state %+v", step, op, k, ok, want)
			}
		}
	}
	for step := range 20_000 {
		var op string
		switch r := rng.IntN(100); {
		case r < 60:
			op = "put"
			k, st := newKey(), state()
			tab.put(&k, &st)
			model[k] = st
		case r < 85:
			op = "remove"
			k := newKey()
			tab.remove(&k)
			delete(model, k)
		case r < 92:
			op = "sweep"
			idle := func(s *compactSliding) bool { return s.counts[0] == 0 }
			tab.deleteWhile(idle, func() bool { return false })
			for k, s := range model {
				if idle(&s) {
					delete(model, k)
				}
			}
		case r < 94:
			op = "evict"
			n, low := tab.n, tab.n/2
			tab.deleteWhile(func(*compactSliding) bool { n--; return true }, func() bool { return n <= low })
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
		check(step, op)
		most = max(most, len(tab.slots))
	}
	if most < 256 {
		t.Errorf("the table never grew past %d slots: the test exercises too little", most)
	}
}
