package bucket_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestGiveBackModel is the give-back adversary on the pure functions, comparing states rather
// than verdicts: random histories of takes (costs 1 to 3) and give-backs (random admitted
// charges, random order, random later instants) on a coarse grid of instants, for every
// algorithm that gives back. After every event, the state the give-back functions leave must
// be no roomier at any later instant than the state of the admitted charges that were not
// given back: for GCRA tat_store >= tat_ideal (as seen at now: max(tat, now)), for windows and
// quotas a count at least the ideal's in every window that can still be counted, for
// concurrency at least as many slots in flight.
func TestGiveBackModel(t *testing.T) {
	histories := 20000
	if testing.Short() {
		histories = 2000
	}
	algs := []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 4},
		{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 2},
		{Algorithm: bucket.FixedWindow, Count: 4, Window: time.Second},
		{Algorithm: bucket.SlidingWindow, Count: 4, Window: time.Second},
		{Algorithm: bucket.Quota, Count: 4, Period: bucket.Day},
		{Algorithm: bucket.Concurrency, Count: 3},
	}
	type take struct {
		at, cost, left int64
		back           bool
	}
	for h := range histories {
		rng := rand.New(rand.NewPCG(7, uint64(h)))
		l := algs[rng.IntN(len(algs))]
		grid := int64(time.Second / 4)
		if l.Algorithm == bucket.TokenBucket {
			tt, _ := bucket.GCRAParams(l)
			grid = tt / 4
		}
		if l.Algorithm == bucket.Quota {
			grid = int64(time.Hour)
		}
		start := t0.Truncate(24 * time.Hour).Add(21 * time.Hour).UnixNano()
		var (
			tat     int64
			fixed   bucket.FixedState
			sliding bucket.SlidingState
			conc    int64
			takes   []take
			now     = start
		)
		for step := range 40 {
			now += []int64{0, 0, 1, 1, 2, 3, 7}[rng.IntN(7)] * grid
			var out []int
			for i := range takes {
				if !takes[i].back {
					out = append(out, i)
				}
			}
			if len(out) > 0 && rng.IntN(5) < 2 {
				tk := &takes[out[rng.IntN(len(out))]]
				tk.back = true
				switch l.Algorithm {
				case bucket.TokenBucket:
					tat, _ = bucket.GCRAGiveBackN(tat, tk.left, l, tk.cost)
				case bucket.FixedWindow:
					fixed, _ = bucket.FixedGiveBackN(fixed, tk.at, l, tk.cost)
				case bucket.Quota:
					fixed, _ = bucket.QuotaGiveBackN(fixed, tk.at, l, tk.cost)
				case bucket.SlidingWindow:
					sliding, _ = bucket.SlidingGiveBackN(sliding, tk.at, l, tk.cost)
				case bucket.Concurrency:
					conc = bucket.ConcurrentGiveBack(conc)
				}
			} else {
				cost := 1 + rng.Int64N(3)
				var r bucket.Result
				var left int64
				switch l.Algorithm {
				case bucket.TokenBucket:
					var next int64
					if next, r = bucket.GCRAN(tat, now, l, cost); r.Allowed {
						tat, left = next, next
					}
				case bucket.FixedWindow:
					var next bucket.FixedState
					if next, r = bucket.FixedN(fixed, now, l, cost); r.Allowed {
						fixed = next
					}
				case bucket.Quota:
					var next bucket.FixedState
					if next, r = bucket.QuotaN(fixed, now, l, cost); r.Allowed {
						fixed = next
					}
				case bucket.SlidingWindow:
					var next bucket.SlidingState
					if next, r = bucket.SlidingN(sliding, now, l, cost); r.Allowed {
						sliding = next
					}
				case bucket.Concurrency:
					cost = 1
					conc, r = bucket.Concurrent(conc, l)
				}
				if r.Allowed {
					takes = append(takes, take{at: now, cost: cost, left: left})
				}
			}
			// The ideal: the same admitted takes, less those given back.
			var kept []take
			for _, tk := range takes {
				if !tk.back {
					kept = append(kept, tk)
				}
			}
			fail := func(what string, got, want int64) {
				t.Fatalf("history %d (%+v) step %d at +%v: %s: store %d, ideal %d (roomier than without the given-back charges)\ntakes: %+v",
					h, l, step, time.Duration(now-start), what, got, want, takes)
			}
			switch l.Algorithm {
			case bucket.TokenBucket:
				tt, _ := bucket.GCRAParams(l)
				var ideal int64
				for _, tk := range kept {
					ideal = max(ideal, tk.at) + tk.cost*tt
				}
				if max(tat, now) < max(ideal, now) {
					fail("tat", max(tat, now)-start, max(ideal, now)-start)
				}
			case bucket.FixedWindow, bucket.Quota:
				endOf := func(at int64) int64 {
					if l.Algorithm == bucket.Quota {
						_, end := bucket.QuotaPeriod(at, l)
						return end
					}
					return (at/int64(l.Window) + 1) * int64(l.Window)
				}
				end := endOf(now)
				var ideal, got int64
				for _, tk := range kept {
					if endOf(tk.at) == end {
						ideal += tk.cost
					}
				}
				if fixed.End == end {
					got = fixed.Count
				}
				if got < ideal {
					fail("count in the current window", got, ideal)
				}
			case bucket.SlidingWindow:
				w := bucket.SlidingWidth(l)
				cur := now / w
				count := func(j int64) int64 { // the store's count of slot j
					if sliding.Width != w || j > sliding.Slot || j <= sliding.Slot-bucket.SlidingSlots-1 {
						return 0
					}
					return int64(sliding.Counts[j%(bucket.SlidingSlots+1)])
				}
				// Every window that is still to be decided counts the slots from some oldest one
				// up to cur (and later ones, empty in both): compare every such suffix.
				for oldest := cur - bucket.SlidingSlots; oldest <= cur; oldest++ {
					var got, ideal int64
					for j := oldest; j <= cur; j++ {
						got += count(j)
					}
					for _, tk := range kept {
						if s := tk.at / w; s >= oldest && s <= cur {
							ideal += tk.cost
						}
					}
					if got < ideal {
						fail(fmt.Sprintf("count of slots %d..%d", oldest-cur, 0), got, ideal)
					}
				}
			case bucket.Concurrency:
				if conc < int64(len(kept)) {
					fail("in flight", conc, int64(len(kept)))
				}
			}
		}
	}
}
