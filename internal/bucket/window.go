package bucket

import (
	"math/bits"
	"time"
)

// windowSpan is a Limit's Window in nanoseconds, clamped to [1ns, 2^60ns]. It takes the Window
// rather than the Limit: an inlined call with the 40-byte Limit still copies it, and reading
// the copy back stalled on store forwarding (a fifth of Sliding's time in a profile).
func WindowSpan(window time.Duration) int64 {
	return min(max(int64(window), 1), MaxSpan)
}

// floorDiv is a/b rounded towards minus infinity (b > 0), so instants before the epoch fall into
// the right window too.
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// FixedState is a fixed window's state. The zero value is a fresh key.
type FixedState struct {
	// End is the end (exclusive, Unix ns) of the window Count belongs to. Storing the end rather
	// than the start lets a store tell an idle key without knowing its Limit.
	End   int64
	Count int64
}

// Fixed takes one request at instant now (Unix ns) from a fixed window. Windows are aligned to
// multiples of l.Window since the Unix epoch; a request is admitted while fewer than l.Count
// were admitted in its window. It returns the state to store if the request is taken, and the
// verdict: Limit is Count, Remaining is Count minus the window's count, Reset is the time until
// the window ends, and a rejection's RetryAfter is the same time.
//
// As documented for fixed windows, up to 2*Count requests can pass within a short interval
// around a window boundary (Count at the end of one window, Count at the start of the next);
// SlidingWindow does not allow that.
//
// A clock that steps back into an earlier window (or a Window made shorter by a reload) keeps
// counting in the newer stored window, which can only reject more, never admit more.
func Fixed(s FixedState, now int64, l Limit) (FixedState, Result) { return FixedN(s, now, l, 1) }

// FixedN is Fixed for a request that costs n (>= 1) requests at once: it is admitted while
// Count-n or fewer were admitted in its window, and adds n. A rejection's Remaining is what is
// left of the window's Count (less than n).
func FixedN(s FixedState, now int64, l Limit, n int64) (FixedState, Result) {
	w := WindowSpan(l.Window)
	if end := FloorDiv(now, w)*w + w; end > s.End {
		s = FixedState{End: end}
	}
	return s.take(now, l.Count, n)
}

// take counts n requests of the window or period that ends at s.End (after now) if they fit in
// count. It is Fixed's and Quota's decision once the state is in the right window.
func (s FixedState) take(now, count, n int64) (FixedState, Result) {
	r := Result{Limit: count, Reset: time.Duration(s.End - now)}
	if s.Count > count-n {
		r.RetryAfter = r.Reset
		r.Remaining = max(count-s.Count, 0)
		return s, r
	}
	s.Count += n
	r.Allowed = true
	r.Remaining = count - s.Count
	return s, r
}

// Idle reports whether the state is indistinguishable from a fresh key's at now (its window has
// ended), so a store may forget it.
func (s FixedState) Idle(now int64) bool { return s.End <= now }

// SlidingSlots is the number K of slots a sliding window is divided into.
const SlidingSlots = 10

// slidingRing is the number of counters a SlidingState keeps: the K slots of a window plus the
// one the trailing window's oldest part falls into.
const SlidingRing = SlidingSlots + 1

// SlidingState is a sliding window's state: per-slot counters for the newest slot and the K
// before it, in a ring. The zero value is a fresh key. It takes 64 bytes.
type SlidingState struct {
	// Width is the slot width S (ns) the counters were built with; 0 for a fresh key. A state
	// built with another width (the policy's Window changed) is discarded rather than
	// misread.
	Width int64
	// Slot is the newest slot number, floor(t/Width), the ring covers.
	Slot int64
	// Counts[j mod (K+1)] counts the requests taken in slot j, for Slot-K <= j <= Slot.
	Counts [SlidingRing]uint32
}

// SlidingWidth returns the slot width S of a sliding-window Limit in nanoseconds: Window/K rounded
// up, so that K*S >= Window (a Window not divisible by K widens by less than K ns, never narrows).
func SlidingWidth(l Limit) int64 { return SlotWidth(l.Window) }

// slotWidth is SlidingWidth of a Limit with this Window.
func SlotWidth(window time.Duration) int64 {
	return (WindowSpan(window) + SlidingSlots - 1) / SlidingSlots
}

// ring maps a slot number to its counter.
func SlidingIndex(slot int64) int {
	i := slot % SlidingRing
	if i < 0 {
		i += SlidingRing
	}
	return int(i)
}

// Sliding takes one request at instant now (Unix ns) from a sliding window. It is an exact upper
// bound: in any interval of length l.Window at most l.Count requests pass.
//
// Time is cut into slots of width S = SlidingWidth(l), aligned to multiples of S since the Unix
// epoch. For now in slot s, the trailing interval (now-Window, now] touches slots s-K .. s, and
// all K+1 are counted, the oldest in full although part of it is older than Window. The request is
// admitted when that sum is below l.Count. The price of being exact without a log of requests:
// a request may be rejected because of requests up to S older than Window, i.e. the effective
// window lies between Window and Window+S (plus the < K ns of rounding S up).
//
// It returns the state to store if the request is taken, and the verdict: Limit is Count,
// Remaining is Count minus the counted sum after this request, Reset is the time until every
// counted request has left (end of the newest non-empty slot plus K slots), and a rejection's
// RetryAfter is the time until enough of the oldest slots have left that the sum is below Count.
//
// A clock that steps back to an older slot counts the request in the newest stored slot, which can
// only reject more, never admit more.
func Sliding(s SlidingState, now int64, l Limit) (SlidingState, Result) {
	return SlidingN(s, now, l, 1)
}

// SlidingN is Sliding for a request that costs n (1 <= n <= l.Count) requests at once: it is
// admitted when the counted sum plus n is at most Count, and adds n to the newest slot. A
// rejection's RetryAfter is when enough has left for n to fit, and its Remaining is Count minus
// the sum (less than n).
func SlidingN(s SlidingState, now int64, l Limit, n int64) (SlidingState, Result) {
	var r Result
	s.TakeInto(now, &l, n, &r)
	return s, r
}

// TakeInto is SlidingN in place, for a store that keeps states where they lie (the memory store): it leaves in s the state to store if the
// request is taken (a caller discards it otherwise) and the verdict in r. Working through
// pointers keeps the 64-byte state and the Result from being copied in and out of the call, which
// cost a third of a decision.
func (s *SlidingState) TakeInto(now int64, l *Limit, n int64, r *Result) {
	w := SlotWidth(l.Window)
	// The common case under load is a request in the newest stored slot: a multiplication and
	// a comparison find it without the 64-bit division floorDiv needs. (start may wrap for a
	// state of another width; the width check makes the comparison irrelevant then.)
	if start := s.Slot * w; s.Width != w || now < start || now-start >= w {
		s.advance(FloorDiv(now, w), w)
	}
	SlidingDecide(&s.Counts, s.Slot, now, w, l.Count, n, r)
}

// counter is the type of a ring's counters: uint32 in a SlidingState, uint16 in the memory
// store's compact form (compactSliding).
type SlidingCounter interface{ ~uint16 | ~uint32 }

// decide is the sliding-window decision on a ring whose newest slot is slot (of width w, with
// now inside it, or before it after a clock stepped back): it counts the request's n in the
// newest slot if the ring's sum plus n is at most count, and sets r. n <= count keeps a
// counter within count, so a compact ring's 16 bits hold it.
func SlidingDecide[C SlidingCounter](counts *[SlidingRing]C, slot, now, w, count, n int64, r *Result) {
	// One pass over the ring, oldest slot (slot-K, whose counter is slot+1's) first, sums the
	// counters and notes which slots are non-empty, so that a rejection finds its Reset and
	// RetryAfter slots without walking the empty ones. The two loops wrap the ring without a
	// modulo per step.
	newest := SlidingIndex(slot)
	var (
		sum  int64  // int64: K+1 counters of up to 1e9 overflow uint32
		live uint32 // bit k is set when slot slot-K+k is non-empty
		k    uint   // shifted by k&31 (k <= K): no code for shift counts of 32 or more
	)
	for i := newest + 1; i < SlidingRing; i++ {
		c := uint32(counts[i])
		sum += int64(c)
		live |= (c | -c) >> 31 << (k & 31) // branch-free c != 0
		k++
	}
	for i := 0; i <= newest; i++ {
		c := uint32(counts[i])
		sum += int64(c)
		live |= (c | -c) >> 31 << (k & 31)
		k++
	}
	// A request in slot slot-back stops being counted when slot slot-back+K+1 starts, end-back*w
	// from now.
	end := (slot+SlidingRing)*w - now
	*r = Result{Limit: count, Remaining: max(count-sum, 0)}
	if sum <= count-n {
		counts[newest] += C(n)
		r.Allowed = true
		r.Remaining = count - sum - n
		r.Reset = time.Duration(end)
		return
	}
	// Reset: when the newest non-empty slot leaves. There is none only if Count <= 0 (invalid).
	if live != 0 {
		r.Reset = time.Duration(end - int64(SlidingSlots+1-bits.Len32(live))*w)
	}
	// RetryAfter: when enough of the oldest slots have left that n fits beside the rest. Empty
	// slots change nothing, so only the non-empty ones are visited. If none is enough (n above
	// Count, invalid) no wait helps: say "a window".
	r.RetryAfter = time.Duration(end)
	rest := sum
	for m := live; m != 0; m &= m - 1 {
		k := bits.TrailingZeros32(m)
		i := newest + 1 + k
		if i >= SlidingRing {
			i -= SlidingRing
		}
		rest -= int64(counts[i])
		if rest <= count-n {
			r.RetryAfter = time.Duration(end - int64(SlidingSlots-k)*w)
			break
		}
	}
}

// rotate moves a ring of the same width to slot cur: the slots that left it are cleared, and a
// cur older than *slot (a clock that stepped back) leaves it as it is, so the request counts in
// the newest slot.
func SlidingRotate[C SlidingCounter](counts *[SlidingRing]C, slot *int64, cur int64) {
	switch {
	case cur-*slot >= SlidingRing:
		*counts = [SlidingRing]C{}
		*slot = cur
	case cur > *slot:
		for i, j := SlidingIndex(*slot), *slot; j < cur; j++ {
			if i++; i == SlidingRing {
				i = 0
			}
			counts[i] = 0
		}
		*slot = cur
	}
}

// idleRing reports whether every request counted in the ring has left at now.
func idleRing[C SlidingCounter](counts *[SlidingRing]C, slot, w, now int64) bool {
	for j := slot; j > slot-SlidingRing; j-- {
		if counts[SlidingIndex(j)] != 0 {
			return (j+SlidingRing)*w <= now
		}
	}
	return true
}

// advance moves the state to slot cur of width w: a state of another width (or a fresh one)
// starts over, the slots that left the ring are cleared, and a cur older than Slot (a clock
// that stepped back) leaves the state as it is, so the request counts in the newest slot.
func (s *SlidingState) advance(cur, w int64) {
	if s.Width != w {
		*s = SlidingState{Width: w, Slot: cur}
		return
	}
	SlidingRotate(&s.Counts, &s.Slot, cur)
}

// Idle reports whether the state is indistinguishable from a fresh key's at now (every counted
// request has left), so a store may forget it.
func (s *SlidingState) Idle(now int64) bool { return idleRing(&s.Counts, s.Slot, s.Width, now) }
