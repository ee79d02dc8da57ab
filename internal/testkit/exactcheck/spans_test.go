package exactcheck

import (
	"testing"
	"time"
)

func win(from, to float64) Window { return Window{From: at(from), To: at(to)} }

// TestResetSpansJudgeEachSideOfAReset: a fixed window of 10 reset mid-window admits 10 before
// the reset and 10 after: within its bound span by span, while the same history judged as one
// span is 10 over. Ten more after the reset (a reset that leaves the count as it was, as a
// store whose reset never landed would) is caught.
func TestResetSpansJudgeEachSideOfAReset(t *testing.T) {
	l := Limit{Kind: FixedWindow, Limit: 10, Window: 10 * time.Second}
	var ds []Decision
	for i := range 10 {
		ds = append(ds, point(1+0.1*float64(i)), point(6+0.1*float64(i)))
	}
	one := func(a, b time.Time) (Limit, bool) { return l, true }
	spans := Spans(at(0), at(9.9), []Window{win(4, 4.2)}, one, 0)
	if len(spans) != 2 {
		t.Fatalf("spans got %+v, want 2", spans)
	}
	v, judged := CheckSpans(spans, ds)
	wantExcess(t, "10 and 10 around a reset", v, 0)
	if judged != 20 {
		t.Errorf("judged got %d, want 20", judged)
	}
	wantExcess(t, "the same without the reset", Check(l, ds), 10)
	for i := range 5 {
		ds = append(ds, point(7+0.1*float64(i)))
	}
	v, _ = CheckSpans(spans, ds)
	wantExcess(t, "15 after the reset", v, 5)
	// A decision that may lie inside the reset's window is judged by neither span.
	ds = append(ds, Decision{Start: at(3.9), End: at(4.1), Cost: 1})
	if _, judged := CheckSpans(spans, ds); judged != 25 {
		t.Errorf("judged with one straddling got %d, want 25", judged)
	}
}

// TestSpansTakeTheLimitInForce: an exemption raising a window to 15 while live; past its expiry
// the policy's 10 applies again, and an exemption that outlives its expiry shows there.
func TestSpansTakeTheLimitInForce(t *testing.T) {
	base := Limit{Kind: FixedWindow, Limit: 10, Window: 2 * time.Second}
	ex := base
	ex.Limit = 15
	live := win(2, 6) // all replicas apply it from 2 s; its expiry may land in [6, 6.2]
	limitAt := func(a, b time.Time) (Limit, bool) {
		if !a.Before(live.From) && !b.After(live.To) {
			return ex, true
		}
		return base, true
	}
	spans := Spans(at(0), at(12), []Window{win(1.9, 2), win(6, 6.2)}, limitAt, 0)
	if len(spans) != 3 || spans[1].Limit.Limit != 15 || spans[2].Limit.Limit != 10 {
		t.Fatalf("spans got %+v, want 10, 15, 10", spans)
	}
	var ds []Decision
	for i := range 15 { // 15 in the window [4, 6): the exemption's limit
		ds = append(ds, point(4+0.1*float64(i)))
	}
	v, _ := CheckSpans(spans, ds)
	wantExcess(t, "15 under the exemption", v, 0)
	for i := range 15 { // 15 in [8, 10): past the expiry
		ds = append(ds, point(8+0.1*float64(i)))
	}
	v, _ = CheckSpans(spans, ds)
	wantExcess(t, "15 past the expiry", v, 5)
}

// TestConcurrencyAfterAReset: limit 3, three requests inside the upstream at a reset that frees
// their slots; three more admitted after it are within the bound though six are inside at once.
// A fourth admitted after the reset (a slot left behind released into the emptied count) is
// over it; a request admitted while the reset may be landing counts in no epoch.
func TestConcurrencyAfterAReset(t *testing.T) {
	adm := func(sent, enter, exit float64) Admission {
		return Admission{Sent: at(sent), Enter: at(enter), Exit: at(exit)}
	}
	as := []Admission{adm(0, 0.1, 5), adm(0, 0.1, 5), adm(0, 0.1, 5)}
	reset := []Window{win(1, 1.1)}
	after := append(as, adm(2, 2.1, 4), adm(2, 2.1, 4), adm(2, 2.1, 4))
	wantExcess(t, "3 before and 3 after", CheckConcurrencyResets(3, after, reset), 0)
	wantExcess(t, "the same without the reset", CheckConcurrencyResets(3, after, nil), 3)
	wantExcess(t, "4 after", CheckConcurrencyResets(3, append(after, adm(2.5, 2.6, 3)), reset), 1)
	wantExcess(t, "one sent inside the reset's window", CheckConcurrencyResets(3, append(after, adm(1.05, 2.6, 3)), reset), 0)
	// Two resets: the epoch of the second counts only what came after it.
	two := []Window{win(1, 1.1), win(3, 3.1)}
	late := append(after, adm(3.5, 3.6, 4.5), adm(3.5, 3.6, 4.5), adm(3.5, 3.6, 4.5))
	wantExcess(t, "3 after each of two resets", CheckConcurrencyResets(3, late, two), 0)
	wantExcess(t, "4 after the second", CheckConcurrencyResets(3, append(late, adm(3.5, 3.6, 4.5)), two), 1)
}
