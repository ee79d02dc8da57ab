package bucket

import "time"

// ConcurrencyRetry is the Retry-After of a rejected concurrency charge, and the Reset every
// concurrency verdict reports: a slot comes back when some request in flight ends, which no
// store can predict, so clients are told to try again in a second.
const ConcurrencyRetry = time.Second

// Concurrent takes one slot of a concurrency limit whose state is inflight, the number of
// requests of the key in flight (0 for a fresh key). It returns the state to store if the
// request is taken, and the verdict: admitted while inflight < l.Count; Limit is Count,
// Remaining the slots still free after this request, Reset and a rejection's RetryAfter are
// ConcurrencyRetry. It reads no clock: the state changes only when requests start and end.
func Concurrent(inflight int64, l Limit) (int64, Result) {
	var r Result
	if ConcurrentInto(inflight, l.Count, &r) {
		inflight++
	}
	return inflight, r
}

// concurrentTo is Concurrent writing the verdict to *r and reporting whether the slot is
// taken (the new state is then inflight+1). The memory store calls it with r pointing at the
// caller's result: returning a Result by value made the compiler build it on the stack and
// copy it, a measurable part of a take-and-release that is otherwise two short critical
// sections.
func ConcurrentInto(inflight, count int64, r *Result) bool {
	*r = Result{Limit: count, Reset: ConcurrencyRetry}
	if inflight >= count {
		r.RetryAfter = ConcurrencyRetry
		return false
	}
	r.Allowed = true
	r.Remaining = count - inflight - 1
	return true
}

// ConcurrentRelease frees one slot: the new in-flight count, never below zero (a key that the
// memory store evicted while its requests were in flight starts again from zero, and their
// releases must not push it below).
func ConcurrentRelease(inflight int64) int64 { return max(inflight-1, 0) }

// GCRARefund gives back one token-bucket charge (see GCRARefundN).
func GCRARefund(tat, left int64, l Limit) (int64, bool) { return GCRARefundN(tat, left, l, 1) }

// GCRARefundN gives back a token-bucket charge of cost n to a bucket whose state is now tat. left is the state the charge's own write left (the tat it set: the memory
// store hands it out as Result.Token), 0 when unknown. It returns the new state and whether the
// charge was given back: exactly when tat still equals left, i.e. nothing wrote to the bucket
// since the charge (or everything that wrote since was given back the same way), and then
// tat-n*T is the state the bucket would have had without the charge.
//
// Otherwise nothing is given back. A token bucket forgets idle time (every write sets
// tat = max(tat, t)+c*T), so a later write that found the bucket without the charge idle, or
// nearly so, has already absorbed part of it: what is still owed shrinks with every such write
// (d = min(d, max(0, tat_before-t)) from d = n*T), and the state does not record the writes'
// instants. A partial give-back computed from left and now looked safe for one give-back but is
// not once give-backs of earlier charges interleave (the give-back adversary of buckettest found
// histories where it admitted one request too many), so this gives back all or nothing.
// docs/algorithms.md ("Give-backs") has the proof. Leaky-bucket charges are never given back:
// their request was held for its turn.
//
// It needs no instant: an exact give-back is exact whenever it comes (once the bucket is idle
// it changes nothing that matters).
func GCRARefundN(tat, left int64, l Limit, n int64) (int64, bool) {
	if l.Algorithm != TokenBucket || left <= 0 || tat != left {
		return tat, false
	}
	t, _ := GCRAParams(l)
	return tat - spend(t, n), true
}

// FixedRefund undoes one fixed-window charge taken at instant at, if its window is still the
// state's window and counted it; a closed window's count no longer matters.
func FixedRefund(s FixedState, at int64, l Limit) (FixedState, bool) {
	return FixedRefundN(s, at, l, 1)
}

// FixedRefundN is FixedRefund for a charge of cost n.
func FixedRefundN(s FixedState, at int64, l Limit, n int64) (FixedState, bool) {
	w := WindowSpan(l.Window)
	if end := FloorDiv(at, w)*w + w; end != s.End || s.Count < n {
		return s, false
	}
	s.Count -= n
	return s, true
}

// QuotaRefundN undoes a quota charge of cost n taken at instant at, if the period it was
// counted in is still the state's period and counted it; a past period's count no longer
// matters.
func QuotaRefundN(s FixedState, at int64, l Limit, n int64) (FixedState, bool) {
	if _, end := QuotaPeriod(at, l); end != s.End || s.Count < n {
		return s, false
	}
	s.Count -= n
	return s, true
}

// refund undoes a sliding-window charge of cost n taken at instant at, if the slot it was
// counted in is still in the ring (of the same width) and counted it.
func (s *SlidingState) refund(at int64, l *Limit, n int64) bool {
	w := SlotWidth(l.Window)
	slot := FloorDiv(at, w)
	if s.Width != w || slot > s.Slot || slot <= s.Slot-SlidingRing {
		return false
	}
	i := SlidingIndex(slot)
	if int64(s.Counts[i]) < n {
		return false
	}
	s.Counts[i] -= uint32(n)
	return true
}

// SlidingRefund undoes one sliding-window charge taken at instant at (see Releaser).
func SlidingRefund(s SlidingState, at int64, l Limit) (SlidingState, bool) {
	return SlidingRefundN(s, at, l, 1)
}

// SlidingRefundN is SlidingRefund for a charge of cost n.
func SlidingRefundN(s SlidingState, at int64, l Limit, n int64) (SlidingState, bool) {
	ok := s.refund(at, &l, n)
	return s, ok
}
