package proxy

import (
	"math"
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Canonical header keys, written into the map directly to skip canonicalisation on the hot path.
const (
	hdrLimit       = "X-Ratelimit-Limit"
	hdrRemaining   = "X-Ratelimit-Remaining"
	hdrReset       = "X-Ratelimit-Reset"
	hdrIETFPolicy  = "Ratelimit-Policy"
	hdrIETF        = "Ratelimit"
	hdrRetryAfter  = "Retry-After"
	hdrContentType = "Content-Type"
)

var wwwAuthenticate = []string{`Bearer error="invalid_token"`}

// retryAfterValues are the Retry-After header values for 0 to 300 seconds, shared read-only (a
// one-element slice with capacity 1, so Header.Add copies instead of writing into it).
var retryAfterValues = func() (v [301][]string) {
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}[:1:1]
	}
	return v
}()

// retryAfter is the Retry-After value for secs, without allocating for the common values.
func retryAfter(secs int64) []string {
	if secs >= 0 && secs < int64(len(retryAfterValues)) {
		return retryAfterValues[secs]
	}
	return []string{strconv.FormatInt(secs, 10)}
}

// ceilSeconds rounds d up to whole seconds; negative durations count as zero.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// resetValue is X-RateLimit-Reset for a reset that is d after now.
func resetValue(format policy.ResetFormat, now time.Time, d time.Duration) int64 {
	if format == policy.ResetDelta {
		return ceilSeconds(d)
	}
	// ResetUnix, also for the zero ResetFormat: it is the configuration's default.
	if d < 0 {
		d = 0
	}
	t := now.Add(d)
	secs := t.Unix()
	if t.Nanosecond() > 0 {
		secs++
	}
	return secs
}

// rlValues holds the three X-RateLimit values and the digits they point into, so that the three
// headers cost one allocation. It is never reused: the header map keeps referring to it.
type rlValues struct {
	vals   [3]string
	digits [3 * 20]byte // an int64 has at most 20 characters
}

// setRateLimitHeaders writes X-RateLimit-Limit/-Remaining/-Reset (and with IETF, RateLimit-Policy
// and RateLimit) for charge pick with verdict res. The three numbers are formatted into one
// rlValues, which costs one allocation; buf is returned for reuse.
func setRateLimitHeaders(h http.Header, buf []byte, hc policy.Headers, st *reqState, pick int, res bucket.Result) []byte {
	v := new(rlValues)
	d := strconv.AppendInt(v.digits[:0], res.Limit, 10)
	e1 := len(d)
	d = strconv.AppendInt(d, res.Remaining, 10)
	e2 := len(d)
	d = strconv.AppendInt(d, resetValue(hc.Reset, st.now, res.Reset), 10)
	// d stays within v.digits (60 bytes for three int64s), and v.digits is never written again,
	// so the strings are immutable as strings must be.
	v.vals[0] = unsafe.String(&v.digits[0], e1)
	v.vals[1] = unsafe.String(&v.digits[e1], e2-e1)
	v.vals[2] = unsafe.String(&v.digits[e2], len(d)-e2)
	h[hdrLimit] = v.vals[0:1:1]
	h[hdrRemaining] = v.vals[1:2:2]
	h[hdrReset] = v.vals[2:3:3]
	if !hc.IETF {
		return buf
	}

	// RateLimit-Policy lists every enforced policy that matched, in evaluation order.
	buf = buf[:0]
	for i, c := range st.plan.Charges {
		if c.Shadow {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ", "...)
		}
		p := st.plan.Policies[i]
		if c.Limit == p.Limit && p.IETFPolicy != "" {
			buf = append(buf, p.IETFPolicy...)
		} else {
			// An override changed the limit: the precomputed item would advertise the wrong quota.
			buf = appendIETFItem(buf, p.Name, c.Limit)
		}
	}
	if len(buf) > 0 {
		h[hdrIETFPolicy] = []string{string(buf)}
	}
	buf = buf[:0]
	buf = appendSFString(buf, st.plan.Policies[pick].Name)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, ceilSeconds(res.Reset), 10)
	h[hdrIETF] = []string{string(buf)}
	return buf
}

// appendIETFItem appends a RateLimit-Policy item `"name";q=<quota>;w=<window seconds>`. Windows
// advertise Count per Window; buckets advertise Burst per the time a full bucket takes to
// refill (Burst/Rate), which is the window over which Burst requests are sustainable.
func appendIETFItem(buf []byte, name string, l bucket.Limit) []byte {
	if l.Algorithm == bucket.Concurrency {
		buf = appendSFString(buf, name)
		buf = append(buf, ";q="...)
		buf = strconv.AppendInt(buf, l.Count, 10)
		return append(buf, `;qu="concurrent-requests"`...)
	}
	var q, w int64
	switch l.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow:
		q, w = l.Count, ceilSeconds(l.Window)
	case bucket.Quota:
		// The period's nominal length (a month as 30 days): the item describes the policy; the
		// RateLimit field's t says exactly when the current period ends.
		q, w = l.Count, ceilSeconds(l.Period.Nominal())
	default:
		q = l.Burst
		if l.Rate > 0 {
			w = int64(math.Ceil(float64(l.Burst) / l.Rate))
		}
	}
	if w < 1 {
		w = 1
	}
	buf = appendSFString(buf, name)
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, q, 10)
	buf = append(buf, ";w="...)
	return strconv.AppendInt(buf, w, 10)
}

// appendSFString appends s as a structured-field string (RFC 8941): quoted, with '"' and '\'
// escaped. Policy names are restricted to [A-Za-z0-9._-], so this is belt and braces.
func appendSFString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20 || c > 0x7e:
			// Not representable in an sf-string; policy validation never lets one through.
			buf = append(buf, '_')
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}
