package console

import (
	"math/rand/v2"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestTopSketchErrorBound feeds a skewed stream of many keys into a small sketch and checks
// Space-Saving's guarantees: every key seen more than N/k times is tracked, each tracked count
// overstates its true count by at most its error, and every error is at most N/k.
func TestTopSketchErrorBound(t *testing.T) {
	const k = 50
	s := newTopSketch(k)
	r := rand.New(rand.NewPCG(1, 2))
	truth := map[bucket.Key]uint64{}
	lim := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1}
	var n uint64
	for range 200000 {
		var key bucket.Key
		if r.IntN(4) == 0 { // a quarter of the traffic from 5 heavy keys
			key[0], key[1] = 1, byte(r.IntN(5))
		} else {
			key[0] = 2
			v := r.IntN(20000)
			key[1], key[2] = byte(v), byte(v>>8)
		}
		truth[key]++
		n++
		if e, fresh := s.add(key, false, &lim); fresh {
			e.label = key.String()
		}
	}
	bound := n / k
	tracked := map[bucket.Key]topEntry{}
	for _, e := range s.entries {
		tracked[e.key] = e
		if e.err > bound {
			t.Errorf("key %s: error %d above N/k = %d", e.label, e.err, bound)
		}
		if tr := truth[e.key]; e.requests < tr || e.requests-e.err > tr {
			t.Errorf("key %s: count %d error %d, true count %d: want count-error <= true <= count", e.label, e.requests, e.err, tr)
		}
	}
	heavy := 0
	for key, c := range truth {
		if c > bound {
			heavy++
			if _, ok := tracked[key]; !ok {
				t.Errorf("key %s seen %d > N/k = %d times is not tracked", key, c, bound)
			}
		}
	}
	if heavy != 5 {
		t.Fatalf("%d keys above N/k, want the 5 heavy ones (test stream broken)", heavy)
	}
	top := mergeTop(5, s.list())
	for _, tk := range top {
		if tk.Key[:2] != "01" {
			t.Errorf("top 5 holds %s, want only the heavy keys", tk.Key)
		}
	}
}

// TestMergeTop adds a key's counts over lists and orders heaviest first.
func TestMergeTop(t *testing.T) {
	got := MergeTop(2, []TopKey{{Key: "a", Requests: 5, Limited: 1, Error: 1}, {Key: "b", Requests: 7}},
		[]TopKey{{Key: "a", Requests: 4, Limited: 2, Error: 2}, {Key: "c", Requests: 1}})
	want := []TopKey{{Key: "a", Requests: 9, Limited: 3, Error: 3}, {Key: "b", Requests: 7}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

// TestTopSketchIndexModel checks the sketch's own key index (open addressing on the key's
// bytes, entries moved by the heap and taken over when full) against a plain map of what the
// sketch holds, over a stream that forces takeovers, and with keys that differ only in their
// last bytes (a key is a digest in production, but the index must not depend on it).
func TestTopSketchIndexModel(t *testing.T) {
	for _, k := range []int{1, 2, 7, 64} {
		s := newTopSketch(k)
		r := rand.New(rand.NewPCG(3, uint64(k)))
		lim := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: 1}
		for i := range 20000 {
			var key bucket.Key
			v := r.IntN(3 * k)
			if r.IntN(3) == 0 {
				v = r.IntN(2) // two heavy keys
			}
			key[15], key[14] = byte(v), byte(v>>8)
			e, fresh := s.add(key, false, &lim)
			if e.key != key {
				t.Fatalf("k=%d step %d: add returned the entry of %x, want %x", k, i, e.key, key)
			}
			if fresh {
				e.label = key.String()
			}
			if i%97 == 0 || i < 50 {
				checkSketchIndex(t, s)
			}
		}
		checkSketchIndex(t, s)
	}
}

// checkSketchIndex checks that every entry is found at its slot, that the index holds nothing
// else, and that the entries form a min-heap by count.
func checkSketchIndex(t *testing.T, s *topSketch) {
	t.Helper()
	used := 0
	for _, v := range s.slots {
		if v != 0 {
			used++
		}
	}
	if used != len(s.entries) || len(s.entries) > s.k {
		t.Fatalf("index holds %d keys, sketch %d entries (k %d)", used, len(s.entries), s.k)
	}
	for i, e := range s.entries {
		if got := s.find(&e.key); got != i {
			t.Fatalf("entry %d (%x): found at %d", i, e.key, got)
		}
		if s.slots[e.slot] != int32(i+1) {
			t.Fatalf("entry %d: its slot %d holds %d", i, e.slot, s.slots[e.slot])
		}
		if c := 2*i + 1; c < len(s.entries) && s.entries[c].requests < e.requests {
			t.Fatalf("heap order broken at %d", i)
		}
	}
	var absent bucket.Key
	absent[0] = 0xff
	if got := s.find(&absent); got != -1 {
		t.Fatalf("an absent key found at %d", got)
	}
}
