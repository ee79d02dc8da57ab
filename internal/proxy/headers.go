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

// valueArena hands out the X-RateLimit header values (their digits and the one-string slices
// the header map holds) from blocks that are only ever appended to, never written twice: a
// full block is dropped, and the responses whose headers point into it keep it alive as long
// as they need it (net/http writes the headers after the handler returned). One allocation of
// each block serves dozens of responses, instead of one allocation per response.
type valueArena struct {
	digits []byte
	vals   []string
}

const (
	arenaDigits = 2048 // bytes per digit block: at least 34 responses of three int64s
	arenaVals   = 96   // strings per value block: 32 responses
)

// three returns x, y and z formatted, each as its own one-element slice of capacity 1 (so
// that Header.Add copies instead of writing into the block).
func (a *valueArena) three(x, y, z int64) (vx, vy, vz []string) {
	if cap(a.digits)-len(a.digits) < 3*20 { // an int64 has at most 20 characters
		a.digits = make([]byte, 0, arenaDigits)
	}
	if cap(a.vals)-len(a.vals) < 3 {
		a.vals = make([]string, 0, arenaVals)
	}
	start := len(a.digits)
	d := strconv.AppendInt(a.digits, x, 10)
	e1 := len(d)
	d = strconv.AppendInt(d, y, 10)
	e2 := len(d)
	d = strconv.AppendInt(d, z, 10)
	a.digits = d // within the block's capacity: nothing before len(d) is written again
	n := len(a.vals)
	a.vals = append(a.vals, unsafe.String(&d[start], e1-start), unsafe.String(&d[e1], e2-e1), unsafe.String(&d[e2], len(d)-e2))
	return a.vals[n : n+1 : n+1], a.vals[n+1 : n+2 : n+2], a.vals[n+2 : n+3 : n+3]
}

// setRateLimitHeaders writes X-RateLimit-Limit/-Remaining/-Reset (and with IETF, RateLimit-Policy
// and RateLimit) for charge pick with verdict res. The three numbers come from st's arena
// (valueArena); buf is returned for reuse.
func setRateLimitHeaders(h http.Header, buf []byte, hc policy.Headers, st *reqState, pick int, res bucket.Result) []byte {
	h[answer.HeaderLimit], h[answer.HeaderRemaining], h[answer.HeaderReset] = st.values.three(
		res.Limit, res.Remaining, answer.ResetValue(hc.Reset == policy.ResetDelta, st.now, res.Reset))
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
