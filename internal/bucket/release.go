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
	if concurrentTo(inflight, l.Count, &r) {
		inflight++
	}
	return inflight, r
}

// concurrentTo is Concurrent writing the verdict to *r and reporting whether the slot is
// taken (the new state is then inflight+1). The memory store calls it with r pointing at the
// caller's result: returning a Result by value made the compiler build it on the stack and
// copy it, a measurable part of a take-and-release that is otherwise two short critical
// sections.
func concurrentTo(inflight, count int64, r *Result) bool {
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

// GCRARefund undoes one token-bucket charge taken at instant at (Unix ns) on a bucket whose
// state is now tat, at instant now. It reports false, and changes nothing, when it cannot be
// sure that the charge still weighs on tat: once now reaches at+T the bucket may have been
// idle in between (every charge before now-T refilled) and a later request may have started
// it afresh, so taking T off then could admit one request more than the limit. Before at+T the
// charge keeps tat >= at+T (exact refunds of other charges cannot take away what this one
// added), so the bucket cannot have been idle since at, and tat-T is exactly the state without
// the charge. Leaky-bucket charges are never refunded: their request was held for its turn.
func GCRARefund(tat, at, now int64, l Limit) (int64, bool) { return GCRARefundN(tat, at, now, l, 1) }

// GCRARefundN is GCRARefund for a charge of cost n, which added n*T: the same reasoning holds
// until at+n*T.
func GCRARefundN(tat, at, now int64, l Limit, n int64) (int64, bool) {
	if l.Algorithm != TokenBucket {
		return tat, false
	}
	t, _ := GCRAParams(l)
	nt := spend(t, n)
	if now-at >= nt || tat-nt < at {
		return tat, false
	}
	return tat - nt, true
}

// FixedRefund undoes one fixed-window charge taken at instant at, if its window is still the
// state's window and counted it; a closed window's count no longer matters.
func FixedRefund(s FixedState, at int64, l Limit) (FixedState, bool) {
	return FixedRefundN(s, at, l, 1)
}

// FixedRefundN is FixedRefund for a charge of cost n.
func FixedRefundN(s FixedState, at int64, l Limit, n int64) (FixedState, bool) {
	w := windowSpan(l.Window)
	if end := floorDiv(at, w)*w + w; end != s.End || s.Count < n {
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
	w := slotWidth(l.Window)
	slot := floorDiv(at, w)
	if s.Width != w || slot > s.Slot || slot <= s.Slot-slidingRing {
		return false
	}
	i := ring(slot)
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
