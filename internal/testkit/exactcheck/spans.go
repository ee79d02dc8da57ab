package exactcheck

import (
	"math"
	"sort"
	"time"
)

// Console writes change a bucket's bound while the history runs: a reset makes the key full at
// the instant it lands, and an exemption replaces the key's limit while it is live. Neither
// instant is known exactly on the recording clock, only a window that contains it (the reset's
// writes between being forwarded and answered; an exemption's creation until every replica
// applies it, its expiry within the gateways' clock offsets, its deletion until every replica
// has dropped it). So a history is cut into spans: the stretches between those windows, each
// under the one limit every gateway applied all along it. A span is judged by the same bound
// as a whole history (that bound holds from any state a bucket may start in, and a bucket is
// never fuller than full), on the decisions whose whole interval lies inside the span; a
// decision that may lie in a window is judged by no span. Wide windows make the check weaker,
// never wrong.

// Window is a stretch of the recording clock in which a change of the bound may have landed.
type Window struct {
	From, To time.Time
}

// Span is a stretch of one bucket's history under one limit.
type Span struct {
	From, To time.Time
	Limit    Limit
}

// Spans cuts [from, to] at every window (merged where they overlap) and gives each piece the
// limit that limitAt says applies inside it (limitAt is asked once per piece, with its
// bounds). Pieces shorter than min are left out.
func Spans(from, to time.Time, windows []Window, limitAt func(from, to time.Time) (Limit, bool), minLen time.Duration) []Span {
	ws := Merge(windows)
	var out []Span
	cur := from
	add := func(a, b time.Time) {
		if b.Sub(a) < minLen || !b.After(a) {
			return
		}
		if l, ok := limitAt(a, b); ok {
			out = append(out, Span{From: a, To: b, Limit: l})
		}
	}
	for _, w := range ws {
		if !w.To.After(cur) {
			continue
		}
		if w.From.After(to) {
			break
		}
		add(cur, w.From)
		cur = w.To
	}
	add(cur, to)
	return out
}

// Merge returns windows sorted by From, overlapping ones joined.
func Merge(windows []Window) []Window {
	ws := append([]Window(nil), windows...)
	sort.Slice(ws, func(i, j int) bool { return ws[i].From.Before(ws[j].From) })
	out := ws[:0]
	for _, w := range ws {
		if n := len(out); n > 0 && !w.From.After(out[n-1].To) {
			if w.To.After(out[n-1].To) {
				out[n-1].To = w.To
			}
			continue
		}
		out = append(out, w)
	}
	return out
}

// CheckSpans judges ds (all of one bucket) span by span: each span on the decisions whose whole
// interval lies inside it, under its limit. It returns the worst span's violation (the largest
// excess, or, when none exceeds, the one closest to its bound) and how many decisions some
// span judged.
func CheckSpans(spans []Span, ds []Decision) (Violation, int) {
	s := append([]Decision(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i].Start.Before(s[j].Start) })
	best := Violation{}
	bestMargin := math.Inf(-1)
	judged := 0
	for _, sp := range spans {
		lo := sort.Search(len(s), func(i int) bool { return !s[i].Start.Before(sp.From) })
		var in []Decision
		for _, d := range s[lo:] {
			if d.Start.After(sp.To) {
				break
			}
			if !d.End.After(sp.To) {
				in = append(in, d)
			}
		}
		judged += len(in)
		v := Check(sp.Limit, in)
		if len(in) == 0 {
			continue
		}
		if m := float64(v.Admitted) - math.Floor(v.Bound+1e-9); m > bestMargin {
			best, bestMargin = v, m
		}
	}
	if math.IsInf(bestMargin, -1) && len(spans) > 0 {
		best = Check(spans[0].Limit, nil)
	}
	return best, judged
}

// Admission is one admitted request of a concurrency limit: when it was sent (its admission
// came after), and when it entered and left the upstream.
type Admission struct {
	Sent, Enter, Exit time.Time
}

// CheckConcurrencyResets is CheckConcurrency for a key that resets empty (windows: where a
// reset may have landed). A reset frees every slot at once, so at an instant t the bound holds
// the requests admitted after the last reset that may have landed by t: at t, with W the last
// window starting at or before t, the requests sent at or after W's end and inside the upstream
// at t number at most limit (none when t lies inside W). Requests admitted before the reset may
// still be inside the upstream: the reset gave their slots away.
func CheckConcurrencyResets(limit int64, as []Admission, windows []Window) Violation {
	ws := Merge(windows)
	best := Violation{Bound: float64(limit)}
	// Epoch k runs from window k's start to window k+1's (epoch -1: before the first window).
	for k := -1; k < len(ws); k++ {
		var from, to, after time.Time
		if k >= 0 {
			from, after = ws[k].From, ws[k].To
		}
		if k+1 < len(ws) {
			to = ws[k+1].From
		}
		var iv []Interval
		for _, a := range as {
			if a.Sent.Before(after) || (!to.IsZero() && !a.Enter.Before(to)) || (!from.IsZero() && !a.Exit.After(from)) {
				continue
			}
			x := Interval{Enter: a.Enter, Exit: a.Exit}
			if !to.IsZero() && x.Exit.After(to) {
				x.Exit = to
			}
			iv = append(iv, x)
		}
		if v := CheckConcurrency(limit, iv); v.Admitted > best.Admitted {
			best = v
		}
	}
	return best
}
