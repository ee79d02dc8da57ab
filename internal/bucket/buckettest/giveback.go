package buckettest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// GiveBackOptions sizes the give-back adversary. The zero value selects every default.
type GiveBackOptions struct {
	// Seed seeds the histories; a failure names it with the history's number, so that a run
	// can be repeated. (Optional) default 1.
	Seed uint64
	// Histories is how many random histories to play, each on a fresh key. (Optional) default
	// 3000: about a second on the memory store; a store that does I/O per call may ask for
	// fewer.
	Histories int
	// Steps is how many takes and give-backs each history holds. (Optional) default 40.
	Steps int
}

// RunGiveBack is the give-back adversary of bucket.Releaser: it plays random histories of
// takes (multiple costs) and give-backs (of random admitted charges, in random order, at random
// later instants) on every algorithm through the Store's public API, and checks each verdict
// against the ideal: the same algorithm applied to the admitted charges that were not given back,
// at their instants. A store that admits what the ideal rejects gave back more than it may
// (roomier than if the charge had never been made), and the test fails with the history. At the
// end of each history, the admitted charges that were not given back must also satisfy the
// algorithm's bound over every interval (token bucket: at most Burst + Rate*(t2-t1) in [t1, t2];
// windows and quotas per window or period; concurrency at every instant).
//
// Instants lie on a coarse grid (a quarter of an emission interval, a tenth of a window), so
// that takes and give-backs share instants and states repeat, which is where give-back rules
// that compare states go wrong. A store that gives back less than the ideal (stricter) passes;
// the share of takes it rejected where the ideal admitted is logged.
//
// It runs issue 17's example first ("IssueExample"), then the random histories ("Random").
// newStore is called once; every history uses a fresh random key, so a shared store (one table)
// is fine. Charges are single (no groups) and never leased.
func RunGiveBack(t *testing.T, newStore func(t *testing.T) bucket.Releaser, o GiveBackOptions) {
	t.Helper()
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Histories <= 0 {
		o.Histories = 3000
	}
	if o.Steps <= 0 {
		o.Steps = 40
	}
	s := newStore(t)
	t.Run("IssueExample", func(t *testing.T) { testGiveBackExample(t, s) })
	t.Run("Random", func(t *testing.T) { runGiveBackRandom(t, s, o) })
}

// testGiveBackExample is issue 17's example: burst 2 at 1/s; A at 0 s (later given back), B at
// 0.5 s, A given back at 0.501 s, then C at 0.501 s and E at 1 s. A bucket that never saw A
// admits two of B, C and E (B leaves tat 1.5 s, C 2.5 s, E would need 3.5 s within a 2 s
// tolerance at 1 s); giving A's whole second back after B hands back the half second of refill
// that B's write had already lost to the cap.
func testGiveBackExample(t *testing.T, s bucket.Releaser) {
	c := bucket.Charge{Key: NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}, MayGiveBack: true}
	okA, _, a := takeToken(t, s, base, c)
	if !okA {
		t.Fatalf("A at 0 s: rejected, want admitted")
	}
	okB, _ := take(t, s, base.Add(500*time.Millisecond), c)
	release(t, s, base.Add(501*time.Millisecond), a)
	okC, _ := take(t, s, base.Add(501*time.Millisecond), c)
	okE, _ := take(t, s, base.Add(time.Second), c)
	n := 0
	for _, ok := range []bool{okB, okC, okE} {
		if ok {
			n++
		}
	}
	if n > 2 {
		t.Errorf("B, C, E: got %v %v %v admitted, want at most two (a bucket that never saw A admits two)", okB, okC, okE)
	}
}

// runGiveBackRandom plays RunGiveBack's random histories on s.
func runGiveBackRandom(t *testing.T, s bucket.Releaser, o GiveBackOptions) {
	var stricter, takes int
	for h := range o.Histories {
		rng := rand.New(rand.NewPCG(o.Seed, uint64(h)))
		st, tk, err := playGiveBack(s, NewKey(t), rng, o.Steps)
		stricter += st
		takes += tk
		if err != nil {
			t.Fatalf("give-back adversary, seed %d history %d: %v", o.Seed, h, err)
		}
	}
	t.Logf("give-back adversary: %d histories, %d takes, %d (%.1f%%) rejected where the ideal admitted (stricter)",
		o.Histories, takes, stricter, 100*float64(stricter)/float64(max(takes, 1)))
}

// gbEvent is one take or give-back of a history.
type gbEvent struct {
	take     bool
	at       int64 // ns after the history's start
	cost     int64
	admitted bool
	of       int // a give-back: the index of the take it gives back
}

// gbHistory is one history being played: its limit, grid and events.
type gbHistory struct {
	l      bucket.Limit
	start  time.Time
	events []gbEvent
	back   map[int]bool // takes given back
}

func (h *gbHistory) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "limit %+v, start %v\n", h.l, h.start.UTC())
	for i, e := range h.events {
		if e.take {
			fmt.Fprintf(&b, "  %2d take      at +%v cost %d: admitted=%v", i, time.Duration(e.at), e.cost, e.admitted)
			if h.back[i] {
				b.WriteString(" (given back later)")
			}
		} else {
			fmt.Fprintf(&b, "  %2d give back at +%v take %d", i, time.Duration(e.at), e.of)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// playGiveBack plays one random history on key k and returns how many takes the store rejected
// where the ideal admitted, how many takes it made, and the first violation.
func playGiveBack(s bucket.Releaser, k bucket.Key, rng *rand.Rand, steps int) (stricter, takes int, _ error) {
	h := &gbHistory{back: map[int]bool{}}
	var grid int64
	maxCost := int64(3)
	switch rng.IntN(6) {
	case 0, 1: // token buckets twice as often: they are where give-backs are hard
		h.l = bucket.Limit{Algorithm: bucket.TokenBucket, Rate: []float64{1, 10}[rng.IntN(2)], Burst: 2 + rng.Int64N(4)}
	case 2:
		h.l = bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 10, Burst: 1 + rng.Int64N(3)}
	case 3:
		h.l = bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2 + rng.Int64N(4), Window: time.Second}
	case 4:
		h.l = bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 2 + rng.Int64N(4), Window: time.Second}
	default:
		if rng.IntN(2) == 0 {
			h.l = bucket.Limit{Algorithm: bucket.Quota, Count: 2 + rng.Int64N(4), Period: bucket.Day}
		} else {
			h.l = bucket.Limit{Algorithm: bucket.Concurrency, Count: 1 + rng.Int64N(3)}
			maxCost = 1
		}
	}
	switch h.l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		t, _ := bucket.GCRAParams(h.l)
		grid = t / 4
		maxCost = min(maxCost, h.l.Burst)
	case bucket.Quota:
		grid = int64(time.Hour)
	default:
		grid = int64(h.l.Window) / 10
	}
	if grid <= 0 {
		grid = int64(100 * time.Millisecond)
	}
	// A quota's histories start three hours before a UTC midnight, so that they cross periods.
	day := base.Truncate(24 * time.Hour)
	h.start = base
	if h.l.Algorithm == bucket.Quota {
		h.start = day.Add(21 * time.Hour)
	}
	gaps := []int64{0, 0, 0, 1, 1, 2, 3, 5, 9}
	var now int64
	var outstanding []int // admitted takes not yet given back
	ctx := context.Background()
	var r [1]bucket.Result
	tokens := map[int]uint64{}
	for range steps {
		now += gaps[rng.IntN(len(gaps))] * grid
		at := h.start.Add(time.Duration(now))
		if len(outstanding) > 0 && rng.IntN(5) < 2 {
			j := rng.IntN(len(outstanding))
			i := outstanding[j]
			outstanding = append(outstanding[:j], outstanding[j+1:]...)
			e := h.events[i]
			c := bucket.Charge{Key: k, Limit: h.l, Cost: e.cost, MayGiveBack: true}
			tk := bucket.Taken{Charge: c, At: h.start.Add(time.Duration(e.at)), Token: tokens[i]}
			if err := s.Release(ctx, at, []bucket.Taken{tk}); err != nil {
				return stricter, takes, fmt.Errorf("release: %w", err)
			}
			h.back[i] = true
			h.events = append(h.events, gbEvent{at: now, of: i})
			continue
		}
		cost := 1 + rng.Int64N(maxCost)
		c := bucket.Charge{Key: k, Limit: h.l, Cost: cost, MayGiveBack: true}
		ideal := h.conforms(now, cost)
		admitted, err := s.Take(ctx, at, []bucket.Charge{c}, r[:])
		if err != nil {
			return stricter, takes, fmt.Errorf("take: %w", err)
		}
		takes++
		h.events = append(h.events, gbEvent{take: true, at: now, cost: cost, admitted: admitted})
		if admitted && !ideal {
			return stricter, takes, fmt.Errorf("take %d at +%v cost %d: admitted, but the history without the given-back charges rejects it (a give-back gave back too much):\n%v",
				len(h.events)-1, time.Duration(now), cost, h)
		}
		if !admitted && ideal {
			stricter++
		}
		if admitted {
			outstanding = append(outstanding, len(h.events)-1)
			tokens[len(h.events)-1] = r[0].Token
		}
	}
	if err := h.checkBound(); err != nil {
		return stricter, takes, fmt.Errorf("%w:\n%v", err, h)
	}
	return stricter, takes, nil
}

// kept returns the admitted takes not given back, in order.
func (h *gbHistory) kept() []gbEvent {
	var k []gbEvent
	for i, e := range h.events {
		if e.take && e.admitted && !h.back[i] {
			k = append(k, e)
		}
	}
	return k
}

// conforms reports whether the ideal, the algorithm applied to the kept takes at their
// instants, admits a take of cost at now (ns after start).
func (h *gbHistory) conforms(now, cost int64) bool {
	kept := h.kept()
	l := h.l
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		t, tau := bucket.GCRAParams(l)
		var tat int64
		for _, e := range kept {
			tat = max(tat, e.at) + e.cost*t
		}
		return max(tat, now)+cost*t-now <= tau
	case bucket.FixedWindow:
		w := int64(l.Window)
		n := cost
		for _, e := range kept {
			if h.abs(e.at)/w == h.abs(now)/w {
				n += e.cost
			}
		}
		return n <= l.Count
	case bucket.Quota:
		_, end := bucket.QuotaPeriod(h.abs(now), l)
		n := cost
		for _, e := range kept {
			if _, e2 := bucket.QuotaPeriod(h.abs(e.at), l); e2 == end {
				n += e.cost
			}
		}
		return n <= l.Count
	case bucket.SlidingWindow:
		w := bucket.SlidingWidth(l)
		cur := h.abs(now) / w
		n := cost
		for _, e := range kept {
			if cur-h.abs(e.at)/w <= bucket.SlidingSlots {
				n += e.cost
			}
		}
		return n <= l.Count
	default: // Concurrency: the kept takes are the slots in flight
		return int64(len(kept))+1 <= l.Count
	}
}

// abs is a history instant as Unix ns.
func (h *gbHistory) abs(at int64) int64 { return h.start.UnixNano() + at }

// checkBound checks the algorithm's bound over every interval of the kept takes.
func (h *gbHistory) checkBound() error {
	kept := h.kept()
	l := h.l
	for j := range kept {
		var sum int64
		for i := j; i >= 0; i-- {
			sum += kept[i].cost
			d := kept[j].at - kept[i].at
			var bound int64
			switch l.Algorithm {
			case bucket.TokenBucket, bucket.LeakyBucket:
				t, _ := bucket.GCRAParams(l)
				bound = l.Burst + d/t
				if l.Algorithm == bucket.LeakyBucket {
					bound++
				}
			case bucket.FixedWindow:
				if h.abs(kept[i].at)/int64(l.Window) != h.abs(kept[j].at)/int64(l.Window) {
					continue
				}
				bound = l.Count
			case bucket.Quota:
				_, e1 := bucket.QuotaPeriod(h.abs(kept[i].at), l)
				_, e2 := bucket.QuotaPeriod(h.abs(kept[j].at), l)
				if e1 != e2 {
					continue
				}
				bound = l.Count
			case bucket.SlidingWindow:
				if d >= int64(l.Window) {
					continue
				}
				bound = l.Count
			default:
				bound = l.Count // every kept slot is in flight at the end
			}
			if sum > bound {
				return fmt.Errorf("kept takes %v..%v (+%v..+%v) hold %d, over the bound %d",
					i, j, time.Duration(kept[i].at), time.Duration(kept[j].at), sum, bound)
			}
		}
	}
	return nil
}
