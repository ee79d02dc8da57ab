// Package verdict says what a decided group of charges answers, for every front end.
//
// The proxy and the rate limit service both describe one limit in their rate-limit headers
// (Of), say how much of a charge is left (Remaining), and give back what an admitted group
// must not keep (AppendTaken). The package sits below both front ends and above
// internal/bucket; it renders nothing (that is internal/answer's) and allocates nothing.
package verdict

import (
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Of returns the index of the charge an answer describes, given each charge's result: among
// the enforced (non-shadow) charges that were refused, the one with the longest wait
// (RetryAfter); when none was refused, the enforced charge with the least Remaining; the
// first of equals either way, and -1 when every charge is a shadow one. A refused group
// therefore names the limit the client must wait for longest, and an admitted one the limit
// closest to refusing. len(results) >= len(charges).
func Of(charges []bucket.Charge, results []bucket.Result) int {
	refused, least := -1, -1
	for i := range charges {
		if charges[i].Shadow {
			continue
		}
		r := &results[i]
		if !r.Allowed {
			if refused < 0 || r.RetryAfter > results[refused].RetryAfter {
				refused = i
			}
			continue
		}
		if least < 0 || r.Remaining < results[least].Remaining {
			least = i
		}
	}
	if refused >= 0 {
		return refused
	}
	return least
}

// Remaining is what an answer says is left of charge c with result r. A refused charge has
// between 0 and its cost less one left: a request of cost 1 was refused because nothing is
// left, one of a higher cost may have been refused with some left (less than its cost), and
// the answer says how much, so the client sees which cost did not fit. An allowed charge that
// is not kept (kept false: its group was refused and committed nothing, or it is a check that
// is given back) has its cost back, up to the limit. Otherwise it is r.Remaining.
func Remaining(c *bucket.Charge, r *bucket.Result, kept bool) int64 {
	switch {
	case !r.Allowed:
		return min(max(r.Remaining, 0), c.N()-1)
	case !kept:
		return min(r.Remaining+c.N(), r.Limit)
	}
	return r.Remaining
}

// AppendTaken appends to dst, for every allowed charge i for which give(i) is true (every
// allowed one when give is nil), what bucket.Releaser.Release needs to give it back: the
// charge, the instant it was taken at and its result's token.
func AppendTaken(dst []bucket.Taken, charges []bucket.Charge, results []bucket.Result, at time.Time, give func(i int) bool) []bucket.Taken {
	for i := range charges {
		if results[i].Allowed && (give == nil || give(i)) {
			dst = append(dst, bucket.Taken{Charge: charges[i], At: at, Token: results[i].Token})
		}
	}
	return dst
}
