// Package answer is what both front ends answer with.
//
// It is what both front ends (the proxy and Envoy's rate limit service) answer
// with: the rate-limit header values, problem details (RFC 9457) and the per-policy counters
// they share. It sits below both and above bucket, so that a header, a problem or a series is
// written one way whichever front end decided: a client, a dashboard or an alert sees the same
// thing from either.
//
// Everything here is on the hot path of a flood of rejections: the Append functions write into
// a caller's buffer and allocate nothing (measured in BenchmarkAppend*).
package answer

import (
	"math"
	"strconv"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Header names in net/http's canonical form, so that a front end writing into an http.Header
// map skips canonicalisation; the RLS sends the same spellings to Envoy (header names are
// case-insensitive, HTTP/2 lower-cases them).
const (
	HeaderLimit      = "X-Ratelimit-Limit"
	HeaderRemaining  = "X-Ratelimit-Remaining"
	HeaderReset      = "X-Ratelimit-Reset"
	HeaderIETFPolicy = "Ratelimit-Policy"
	HeaderIETF       = "Ratelimit"
	HeaderRetryAfter = "Retry-After"
)

// retryAfterValues are the Retry-After values for 0 to 300 seconds, shared read-only: each is a
// one-element slice with capacity 1, so Header.Add copies it instead of writing into it.
var retryAfterValues = func() (v [301][]string) {
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}[:1:1]
	}
	return v
}()

// RetryAfter is the Retry-After header value for secs, without allocating for the common values.
// The slice is shared: never write into it.
func RetryAfter(secs int64) []string {
	if secs >= 0 && secs < int64(len(retryAfterValues)) {
		return retryAfterValues[secs]
	}
	return []string{strconv.FormatInt(secs, 10)}
}

// CeilSeconds rounds d up to whole seconds; a negative duration counts as zero. Every number of
// seconds a client reads (Retry-After, RateLimit's t, a delta reset) is rounded up, so that a
// client that waits as long as it is told never arrives early.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// ResetValue is X-RateLimit-Reset for a reset d after now: seconds from now when delta, else
// the Unix time, rounded up.
func ResetValue(delta bool, now time.Time, d time.Duration) int64 {
	if delta {
		return CeilSeconds(d)
	}
	t := now.Add(max(d, 0))
	secs := t.Unix()
	if t.Nanosecond() > 0 {
		secs++
	}
	return secs
}

// PolicyWindow is the quota and window in seconds that a RateLimit-Policy item advertises for
// l: a window's count per window, a quota's count per its nominal period (a month as 30 days:
// the item describes the policy; RateLimit's t says when the current period ends), a bucket's
// burst per the time a full bucket takes to refill (the window over which the burst is
// sustainable). The window is at least one second, as the field's w must be a positive integer.
func PolicyWindow(l bucket.Limit) (q, w int64) {
	switch l.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow:
		q, w = l.Count, CeilSeconds(l.Window)
	case bucket.Quota:
		q, w = l.Count, CeilSeconds(l.Period.Nominal())
	case bucket.Concurrency:
		q = l.Count
	default:
		q = l.Burst
		if l.Rate > 0 {
			w = int64(math.Ceil(float64(l.Burst) / l.Rate))
		}
	}
	return q, max(w, 1)
}

// AppendPolicyItem appends the RateLimit-Policy item of policy name with limit l:
// `"name";q=<quota>;w=<seconds>`, or for a concurrency limit `"name";q=<slots>;qu="concurrent-requests"`.
func AppendPolicyItem(buf []byte, name string, l bucket.Limit) []byte {
	q, w := PolicyWindow(l)
	buf = AppendSFString(buf, name)
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, q, 10)
	if l.Algorithm == bucket.Concurrency {
		return append(buf, `;qu="concurrent-requests"`...)
	}
	buf = append(buf, ";w="...)
	return strconv.AppendInt(buf, w, 10)
}

// AppendRateLimit appends the RateLimit field of the limit closest to rejecting:
// `"name";r=<remaining>;t=<seconds until reset>`.
func AppendRateLimit(buf []byte, name string, remaining int64, reset time.Duration) []byte {
	buf = AppendSFString(buf, name)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, remaining, 10)
	buf = append(buf, ";t="...)
	return strconv.AppendInt(buf, CeilSeconds(reset), 10)
}

// AppendSFString appends s as a structured-field string (RFC 8941 section 3.3.3): quoted, with
// '"' and '\' escaped, and each byte an sf-string cannot hold (outside printable ASCII) as '_'.
// Proxy policy names are restricted to [A-Za-z0-9._-]; RLS rule labels come from files that may
// hold any text. Hand-written rather than httpsfv.Marshal, which allocates a builder per call;
// the tests parse every output with httpsfv.
func AppendSFString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20 || c > 0x7e:
			buf = append(buf, '_')
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}
