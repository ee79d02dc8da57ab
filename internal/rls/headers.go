package rls

import (
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Headers says which headers an answer carries in response_headers_to_add, which Envoy passes on
// to the client (on a 429 and, with the filter's default settings, on admitted responses too).
type Headers struct {
	// IETF adds RateLimit-Policy (every enforced limit that applied) and RateLimit (the limit
	// closest to rejecting), as draft-ietf-httpapi-ratelimit-headers writes them.
	IETF bool
	// XRateLimit adds X-RateLimit-Limit, -Remaining and -Reset of the limit closest to
	// rejecting. ResetDelta writes Reset as seconds from now, else as epoch seconds.
	XRateLimit bool
	ResetDelta bool
}

// ParseHeaders reads rls.response_headers: ietf (also ""), x-ratelimit, all or none.
func ParseHeaders(s string, resetDelta bool) Headers {
	h := Headers{ResetDelta: resetDelta}
	switch s {
	case "", "ietf":
		h.IETF = true
	case "x-ratelimit":
		h.XRateLimit = true
	case "all":
		h.IETF, h.XRateLimit = true, true
	}
	return h
}

// limitView is what the headers say about one charged descriptor.
type limitView struct {
	name      string // the rule's static label: never a descriptor value
	metric    string // the rule's metric label (values where the rule asks for them)
	limit     bucket.Limit
	shadow    bool
	result    bucket.Result
	remaining int64 // as answered in the status
	over      bool  // enforced and over its limit
}

// appendHeaders appends the configured headers for the charged descriptors vs (pick is the one
// closest to rejecting, -1 for none) to out.
func (h Headers) appendHeaders(out []*core.HeaderValue, now time.Time, vs []limitView, pick int) []*core.HeaderValue {
	if pick < 0 || (!h.IETF && !h.XRateLimit) {
		return out
	}
	p := &vs[pick]
	reset := p.result.Reset
	if p.over {
		reset = p.result.RetryAfter
	}
	if h.XRateLimit {
		out = append(out,
			&core.HeaderValue{Key: answer.HeaderLimit, Value: strconv.FormatInt(p.result.Limit, 10)},
			&core.HeaderValue{Key: answer.HeaderRemaining, Value: strconv.FormatInt(p.remaining, 10)},
			&core.HeaderValue{Key: answer.HeaderReset, Value: strconv.FormatInt(answer.ResetValue(h.ResetDelta, now, reset), 10)},
		)
	}
	if !h.IETF {
		return out
	}
	var buf []byte
	for i := range vs {
		if vs[i].shadow {
			continue
		}
		if len(buf) > 0 {
			buf = append(buf, ", "...)
		}
		buf = answer.AppendPolicyItem(buf, vs[i].name, vs[i].limit)
	}
	if len(buf) > 0 {
		out = append(out, &core.HeaderValue{Key: answer.HeaderIETFPolicy, Value: string(buf)})
	}
	buf = answer.AppendRateLimit(buf[:0], p.name, p.remaining, reset)
	return append(out, &core.HeaderValue{Key: answer.HeaderIETF, Value: string(buf)})
}
