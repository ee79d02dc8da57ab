package dynamo

import (
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The arithmetic is the bucket package's pure functions, fed with the values DynamoDB returns:
// the store never holds a key's state, it learns one number (tat or a count) from each
// conditional write, and rebuilds the state the function needs around it.

// k is the number of slots a sliding window is divided into.
const k = bucket.SlidingSlots

// gcraResult is the verdict of a GCRA request of cost c against a bucket whose tat was prior.
func gcraResult(l bucket.Limit, prior, now, c int64) bucket.Result {
	_, r := bucket.GCRAN(prior, now, l, c)
	return r
}

// fixedEnd returns the end (exclusive, Unix ns) of the fixed window, or the quota period,
// holding now.
func fixedEnd(l bucket.Limit, now int64) int64 {
	if l.Algorithm == bucket.Quota {
		_, end := bucket.QuotaPeriod(now, l)
		return end
	}
	s, _ := bucket.Fixed(bucket.FixedState{}, now, l)
	return s.End
}

// fixedResult is the verdict of a fixed-window or quota request of cost c when the window's (the
// period's) count was prior.
func fixedResult(l bucket.Limit, prior, now, c int64) bucket.Result {
	s := bucket.FixedState{End: fixedEnd(l, now), Count: prior}
	var r bucket.Result
	if l.Algorithm == bucket.Quota {
		_, r = bucket.QuotaN(s, now, l, c)
	} else {
		_, r = bucket.FixedN(s, now, l, c)
	}
	return r
}

// isCounter reports whether l keeps one counter per window or period (fixed window, quota).
func isCounter(l bucket.Limit) bool {
	return l.Algorithm == bucket.FixedWindow || l.Algorithm == bucket.Quota
}

// slotOf returns the sliding-window slot holding now.
func slotOf(l bucket.Limit, now int64) int64 {
	w := bucket.SlidingWidth(l)
	q := now / w
	if now%w < 0 {
		q--
	}
	return q
}

// leaves returns when requests counted in slot stop counting: when slot+K+1 starts.
func leaves(l bucket.Limit, slot int64) int64 {
	return (slot + k + 1) * bucket.SlidingWidth(l)
}

// slotCounts holds a sliding window's K+1 counted slots before the request, oldest first:
// [0] is slot cur-K and [K] the current slot cur.
type slotCounts [k + 1]int64

// closed returns the sum of the K closed slots (all but the current one).
func (c *slotCounts) closed() int64 {
	var n int64
	for _, v := range c[:k] {
		n += v
	}
	return n
}

// slidingResult is the verdict of a sliding-window request of cost w in slot cur against
// counts c.
func slidingResult(l bucket.Limit, cur int64, c *slotCounts, now, w int64) bucket.Result {
	s := bucket.SlidingState{Width: bucket.SlidingWidth(l), Slot: cur}
	n := int64(len(s.Counts))
	for i, v := range c {
		slot := cur - k + int64(i)
		s.Counts[((slot%n)+n)%n] = uint32(v)
	}
	_, r := bucket.SlidingN(s, now, l, w)
	return r
}

// sealedResult is the verdict of a sliding-window request in slot cur whose write found the slot
// sealed (another replica has moved past it and taken its count as final), with counts c known
// (c[K] the slot's final count). The request is rejected whatever c says: it could conform no
// earlier than when the counts allow it (as for any rejection) and not before its own slot ends,
// since every request decided in the slot writes to it.
func sealedResult(l bucket.Limit, cur int64, c *slotCounts, now, w int64) bucket.Result {
	r := slidingResult(l, cur, c, now, w)
	r.Allowed, r.Remaining, r.Wait = false, 0, 0
	end := (cur + 1) * bucket.SlidingWidth(l)
	r.RetryAfter = max(r.RetryAfter, time.Duration(end-now))
	return r
}
