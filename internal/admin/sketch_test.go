package admin

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
