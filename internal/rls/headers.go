package rls

import (
	"math"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

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

// Header names, as the proxy writes them.
const (
	hdrIETF       = "RateLimit"
	hdrIETFPolicy = "RateLimit-Policy"
	hdrLimit      = "X-RateLimit-Limit"
	hdrRemaining  = "X-RateLimit-Remaining"
	hdrReset      = "X-RateLimit-Reset"
)

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
			&core.HeaderValue{Key: hdrLimit, Value: strconv.FormatInt(p.result.Limit, 10)},
			&core.HeaderValue{Key: hdrRemaining, Value: strconv.FormatInt(p.remaining, 10)},
			&core.HeaderValue{Key: hdrReset, Value: strconv.FormatInt(resetValue(h.ResetDelta, now, reset), 10)},
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
		buf = appendIETFItem(buf, vs[i].name, vs[i].limit)
	}
	if len(buf) > 0 {
		out = append(out, &core.HeaderValue{Key: hdrIETFPolicy, Value: string(buf)})
	}
	buf = appendSFString(buf[:0], p.name)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, p.remaining, 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, ceilSeconds(reset), 10)
	return append(out, &core.HeaderValue{Key: hdrIETF, Value: string(buf)})
}

// ceilSeconds rounds d up to whole seconds; negative durations count as zero.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// resetValue is X-RateLimit-Reset for a reset d after now.
func resetValue(delta bool, now time.Time, d time.Duration) int64 {
	if delta {
		return ceilSeconds(d)
	}
	t := now.Add(max(d, 0))
	secs := t.Unix()
	if t.Nanosecond() > 0 {
		secs++
	}
	return secs
}

// appendIETFItem appends a RateLimit-Policy item `"name";q=<quota>;w=<window seconds>`: a
// window's count per window, a quota's count per its nominal period, a bucket's burst per the
// time it takes to refill.
func appendIETFItem(buf []byte, name string, l bucket.Limit) []byte {
	var q, w int64
	switch l.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow:
		q, w = l.Count, ceilSeconds(l.Window)
	case bucket.Quota:
		q, w = l.Count, ceilSeconds(l.Period.Nominal())
	default:
		q = l.Burst
		if l.Rate > 0 {
			w = int64(math.Ceil(float64(l.Burst) / l.Rate))
		}
	}
	buf = appendSFString(buf, name)
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, q, 10)
	buf = append(buf, ";w="...)
	return strconv.AppendInt(buf, max(w, 1), 10)
}

// appendSFString appends s as a structured-field string (RFC 8941): quoted, '"' and '\'
// escaped, bytes outside printable ASCII (which an sf-string cannot hold) as '_'. Rule labels
// come from the configuration files, which may hold any text.
func appendSFString(buf []byte, s string) []byte {
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
