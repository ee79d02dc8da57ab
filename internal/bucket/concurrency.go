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

// ConcurrentGiveBack frees one slot: the new in-flight count, never below zero (a key that the
// memory store evicted while its requests were in flight starts again from zero, and their
// releases must not push it below).
func ConcurrentGiveBack(inflight int64) int64 { return max(inflight-1, 0) }
