package proxy

import (
	"net/http"
	"strconv"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// hdrContentType is a canonical header key, written into the map directly to skip
// canonicalisation on the hot path (as answer's Header* names are).
const hdrContentType = "Content-Type"

var wwwAuthenticate = []string{`Bearer error="invalid_token"`}

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
	d = strconv.AppendInt(d, answer.ResetValue(hc.Reset == policy.ResetDelta, st.now, res.Reset), 10)
	// d stays within v.digits (60 bytes for three int64s), and v.digits is never written again,
	// so the strings are immutable as strings must be.
	v.vals[0] = unsafe.String(&v.digits[0], e1)
	v.vals[1] = unsafe.String(&v.digits[e1], e2-e1)
	v.vals[2] = unsafe.String(&v.digits[e2], len(d)-e2)
	h[answer.HeaderLimit] = v.vals[0:1:1]
	h[answer.HeaderRemaining] = v.vals[1:2:2]
	h[answer.HeaderReset] = v.vals[2:3:3]
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
			buf = answer.AppendPolicyItem(buf, p.Name, c.Limit)
		}
	}
	if len(buf) > 0 {
		h[answer.HeaderIETFPolicy] = []string{string(buf)}
	}
	buf = answer.AppendRateLimit(buf[:0], st.plan.Policies[pick].Name, res.Remaining, res.Reset)
	h[answer.HeaderIETF] = []string{string(buf)}
	return buf
}
