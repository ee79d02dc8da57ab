// Package exactcheck checks a history of decisions against exact bounds.
//
// It checks a recorded history of rate-limit decisions against the exact bound of
// each algorithm, over every interval of the history. It is the judge of `make check-exact`
// (scripts/check/exact): pure code, fed a history, it says by how much the limit was exceeded,
// where, and how sure it can be.
//
// # Where the truth comes from
//
// The gateways decide on their own clocks, which may disagree. The history is recorded on one
// clock that no gateway controls (the load generator's, shared with the test upstream). A
// decision's instant is not known on that clock, only an interval that contains it: from the
// moment the request was sent to the moment its outcome was seen (the upstream received it, or
// the client read the answer). So a count over [t1, t2] includes a decision only when its whole
// interval lies inside [t1, t2]: every decision counted certainly happened inside, and the bound
// is never checked against a decision that may lie outside. Wide intervals make the check weaker,
// never wrong; Width reports how wide they were.
//
// # Bounds
//
// Skew is the spread of the gateways' clocks (the largest offset less the smallest, both against
// the recording clock, in [MinOffset, MaxOffset]). A gateway decides at its clock's reading c =
// t + offset, so decisions inside a real interval of length L have readings within L + Skew.
//
//   - GCRA (token and leaky bucket): in every [t1, t2], the admitted cost is at most
//     Burst + Rate × (t2 − t1 + Skew). Admissions in any set of readings [a, b] number at most
//     burst + rate × (b − a), whatever the order the store applied them in.
//   - Fixed windows (and quotas, whose UTC days are 24 h windows): a decision whose interval lies
//     inside [kW − MinOffset, (k+1)W − MaxOffset) was counted in window k by every gateway's
//     clock; those are at most Limit per window.
//   - Sliding window: in every interval of length Window − Skew, at most Limit.
//   - Concurrency: the upstream's own enter and exit of each admitted request, on the recording
//     clock, overlap at most Limit at any instant (an upstream request lies inside the gateway's
//     slot).
//
// Each check runs in O(n log n) over n admitted decisions.
package exactcheck

import (
	"math"
	"sort"
	"time"
)

// Decision is one admitted decision of the history. Rejected decisions do not enter a bound.
type Decision struct {
	Replica int
	// Key names the bucket (policy and key value).
	Key string
	// Start and End bound the decision's instant on the recording clock: it was made within
	// [Start, End].
	Start, End time.Time
	// Cost is what the decision spent.
	Cost int64
}

// Kind is the algorithm whose bound applies.
type Kind int

// The kinds of bound.
const (
	GCRA Kind = iota
	FixedWindow
	SlidingWindow
)

// Limit is one bucket's exact bound.
type Limit struct {
	Kind Kind
	// Rate (per second) and Burst: GCRA.
	Rate, Burst float64
	// Limit and Window: fixed and sliding windows (a fixed window's windows are aligned to
	// multiples of Window since the Unix epoch).
	Limit  int64
	Window time.Duration
	// MinOffset and MaxOffset bound every gateway's clock offset against the recording clock.
	MinOffset, MaxOffset time.Duration
}

// Skew is MaxOffset − MinOffset.
func (l Limit) Skew() time.Duration { return l.MaxOffset - l.MinOffset }

// Violation is the worst interval of one check: the admitted cost inside it and the bound.
type Violation struct {
	From, To time.Time
	Admitted int64
	Bound    float64
}

// Excess is how many units were admitted beyond the bound (0 when within it).
func (v Violation) Excess() int64 {
	// A bound is an integer count of units: burst + rate x d admits floor(...) of them. The
	// epsilon absorbs float rounding of an exact bound.
	if e := v.Admitted - int64(math.Floor(v.Bound+1e-9)); e > 0 {
		return e
	}
	return 0
}

// Check returns the worst interval of ds (all of one bucket) under l: the one where the admitted
// cost exceeds the bound most, or, when none exceeds it, the one closest to it.
func Check(l Limit, ds []Decision) Violation {
	switch l.Kind {
	case FixedWindow:
		return checkFixed(l, ds)
	case SlidingWindow:
		return checkSliding(l, ds)
	default:
		return checkGCRA(l, ds)
	}
}

// prepare returns ds sorted by Start, and the distinct End instants in ascending order.
func prepare(ds []Decision) ([]Decision, []int64) {
	s := make([]Decision, len(ds))
	copy(s, ds)
	sort.Slice(s, func(i, j int) bool { return s[i].Start.Before(s[j].Start) })
	ends := make([]int64, 0, len(s))
	for _, d := range s {
		ends = append(ends, d.End.UnixNano())
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
	u := ends[:0]
	for i, e := range ends {
		if i == 0 || e != ends[i-1] {
			u = append(u, e)
		}
	}
	return s, u
}

func rank(ends []int64, e int64) int {
	return sort.Search(len(ends), func(i int) bool { return ends[i] >= e })
}

// checkGCRA: for every t1 = a Start and t2 = an End, the cost of the decisions with Start >= t1
// and End <= t2, less Rate x (t2 - t1), against Burst + Rate x Skew. Decisions are added in
// descending Start; a segment tree over the End instants holds, for each t2, the cost added so
// far with End <= t2 less Rate x t2, and answers the maximum over t2 >= t1.
func checkGCRA(l Limit, ds []Decision) Violation {
	s, ends := prepare(ds)
	if len(s) == 0 {
		return Violation{Bound: l.Burst}
	}
	rate := l.Rate / 1e9 // per ns
	base := make([]float64, len(ends))
	for i, e := range ends {
		base[i] = -rate * float64(e-ends[0])
	}
	st := newSegTree(base)
	best := Violation{Admitted: math.MinInt64}
	bestMargin := math.Inf(-1)
	for i := len(s) - 1; i >= 0; i-- {
		st.add(rank(ends, s[i].End.UnixNano()), len(ends), float64(s[i].Cost))
		if i > 0 && s[i-1].Start.Equal(s[i].Start) {
			continue // t1 = this Start once every decision starting there is in
		}
		t1 := s[i].Start.UnixNano()
		lo := rank(ends, t1)
		v, at := st.max(lo, len(ends))
		if at < 0 {
			continue
		}
		// v = cost(t1, t2) - rate x (t2 - ends[0]); the margin over the bound:
		t2 := ends[at]
		admitted := v + rate*float64(t2-ends[0])
		bound := l.Burst + rate*float64(t2-t1+int64(l.Skew()))
		if m := admitted - bound; m > bestMargin {
			bestMargin = m
			best = Violation{From: time.Unix(0, t1), To: time.Unix(0, t2), Admitted: int64(math.Round(admitted)), Bound: bound}
		}
	}
	return best
}

// checkFixed: per window k, the decisions inside [kW - MinOffset, (k+1)W - MaxOffset).
func checkFixed(l Limit, ds []Decision) Violation {
	w := int64(l.Window)
	counts := map[int64]int64{}
	for _, d := range ds {
		k := floorDiv(d.Start.UnixNano()+int64(l.MinOffset), w)
		if d.End.UnixNano() < (k+1)*w-int64(l.MaxOffset) {
			counts[k] += d.Cost
		}
	}
	best := Violation{Bound: float64(l.Limit)}
	first := true
	for k, c := range counts {
		if first || c > best.Admitted || (c == best.Admitted && k*w < best.From.UnixNano()+int64(l.MinOffset)) {
			first = false
			best = Violation{From: time.Unix(0, k*w-int64(l.MinOffset)), To: time.Unix(0, (k+1)*w-int64(l.MaxOffset)), Admitted: c, Bound: float64(l.Limit)}
		}
	}
	return best
}

// checkSliding: for every t1 = a Start, the decisions with Start >= t1 and End <= t1 + Window -
// Skew (a Fenwick tree over End instants, filled in descending Start).
func checkSliding(l Limit, ds []Decision) Violation {
	s, ends := prepare(ds)
	span := int64(l.Window - l.Skew())
	best := Violation{Bound: float64(l.Limit)}
	if span <= 0 || len(s) == 0 {
		return best
	}
	fw := make([]int64, len(ends)+1)
	add := func(i int, v int64) {
		for i++; i < len(fw); i += i & -i {
			fw[i] += v
		}
	}
	sum := func(n int) (t int64) { // leaves [0, n)
		for ; n > 0; n -= n & -n {
			t += fw[n]
		}
		return t
	}
	for i := len(s) - 1; i >= 0; i-- {
		add(rank(ends, s[i].End.UnixNano()), s[i].Cost)
		if i > 0 && s[i-1].Start.Equal(s[i].Start) {
			continue
		}
		t1 := s[i].Start.UnixNano()
		c := sum(rank(ends, t1+span+1))
		if c > best.Admitted {
			best = Violation{From: time.Unix(0, t1), To: time.Unix(0, t1+span), Admitted: c, Bound: float64(l.Limit)}
		}
	}
	return best
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// Interval is one request inside the upstream, on the recording clock.
type Interval struct {
	Enter, Exit time.Time
}

// CheckConcurrency returns the largest number of intervals open at one instant, and when. An
// exit and an enter at the same instant do not overlap.
func CheckConcurrency(limit int64, iv []Interval) Violation {
	type ev struct {
		t     int64
		delta int64
	}
	evs := make([]ev, 0, 2*len(iv))
	for _, x := range iv {
		evs = append(evs, ev{x.Enter.UnixNano(), 1}, ev{x.Exit.UnixNano(), -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].delta < evs[j].delta
	})
	best := Violation{Bound: float64(limit)}
	var open int64
	for _, e := range evs {
		open += e.delta
		if open > best.Admitted {
			best = Violation{From: time.Unix(0, e.t), To: time.Unix(0, e.t), Admitted: open, Bound: float64(limit)}
		}
	}
	return best
}

// Width summarises how wide the decisions' intervals were (End − Start).
type Width struct {
	P50, P99, Max time.Duration
}

// Widths returns the quantiles of End − Start over ds.
func Widths(ds []Decision) Width {
	if len(ds) == 0 {
		return Width{}
	}
	w := make([]time.Duration, len(ds))
	for i, d := range ds {
		w[i] = d.End.Sub(d.Start)
	}
	sort.Slice(w, func(i, j int) bool { return w[i] < w[j] })
	q := func(p float64) time.Duration { return w[min(len(w)-1, int(p*float64(len(w))))] }
	return Width{P50: q(0.5), P99: q(0.99), Max: w[len(w)-1]}
}
