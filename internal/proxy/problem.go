package proxy

import (
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Problem types (RFC 9457). They are stable identifiers, not links: clients may switch on them.
// A specific type rather than "about:blank" is used because the bodies carry extension members
// (policy, retry_after_seconds) whose meaning the type defines.
const (
	problemBase         = "https://ratelimit-proxy.dev/problems/"
	problemRateLimited  = problemBase + "rate-limited"         // 429
	problemConcurrency  = problemBase + "concurrency-limited"  // 429 of a concurrency policy
	problemUnauthorized = problemBase + "unauthorized"         // 401
	problemUnavailable  = problemBase + "limiter-unavailable"  // 503
	problemInternal     = problemBase + "internal"             // 500
	problemBadGateway   = problemBase + "upstream-unavailable" // 502
	problemTimeout      = problemBase + "upstream-timeout"     // 504
	problemBodyTimeout  = problemBase + "request-timeout"      // 408
)

const contentTypeProblem = "application/problem+json"

var (
	problemContentType = []string{contentTypeProblem}
	noStore            = []string{"no-store"}
	nosniff            = []string{"nosniff"}
)

// problem is one problem+json body. Policy and RetryAfter are extension members, written only
// when set.
type problem struct {
	Type   string
	Status int
	// Detail is the human explanation; for rate-limited problems it is generated from Policy.
	Detail string
	// Policy names the policy that decided (429).
	Policy string
	// RetryAfter in seconds; when > 0 it is also sent as the Retry-After header, with the same value.
	RetryAfter int64
	// Cost is, for a rejected request of a weighted policy (cost above 1), what it would have
	// spent, and Remaining what is left of the budget (less than Cost): the body says which cost
	// did not fit. Both are written only when Cost > 1.
	Cost, Remaining int64
}

// writeProblem writes p as the whole response, building the body in buf (which may be nil), and
// returns buf for reuse.
func writeProblem(w http.ResponseWriter, buf []byte, p problem) []byte {
	buf = appendProblem(buf, p)
	var retry []string
	if p.RetryAfter > 0 {
		retry = retryAfter(p.RetryAfter)
	}
	setProblemHeaders(w.Header(), retry)
	w.WriteHeader(p.Status)
	_, _ = w.Write(buf) // the client may be gone; there is nobody left to tell
	return buf
}

// setProblemHeaders sets the headers of a problem response, and Retry-After to retry unless it
// is nil.
func setProblemHeaders(h http.Header, retry []string) {
	h[hdrContentType] = problemContentType
	h["Cache-Control"] = noStore
	h["X-Content-Type-Options"] = nosniff
	if retry != nil {
		h[hdrRetryAfter] = retry
	}
}

// appendProblem appends p's problem+json body to buf.
func appendProblem(buf []byte, p problem) []byte {
	buf = append(buf, `{"type":`...)
	buf = appendJSONString(buf, p.Type)
	buf = append(buf, `,"title":`...)
	buf = appendJSONString(buf, http.StatusText(p.Status))
	buf = append(buf, `,"status":`...)
	buf = strconv.AppendInt(buf, int64(p.Status), 10)
	buf = append(buf, `,"detail":`...)
	if p.Type == problemRateLimited || p.Type == problemConcurrency {
		// Built here rather than with fmt: this is the hot path of an attack.
		if p.Type == problemRateLimited {
			buf = append(buf, `"Rate limit of policy \"`...)
			buf = appendJSONStringBody(buf, p.Policy)
			buf = append(buf, `\" exceeded`...)
			if p.Cost > 1 {
				buf = append(buf, `: the request costs `...)
				buf = strconv.AppendInt(buf, p.Cost, 10)
				buf = append(buf, ` and `...)
				buf = strconv.AppendInt(buf, p.Remaining, 10)
				buf = append(buf, ` remain`...)
			}
			buf = append(buf, `; retry after `...)
		} else {
			buf = append(buf, `"Concurrency limit of policy \"`...)
			buf = appendJSONStringBody(buf, p.Policy)
			buf = append(buf, `\" reached: too many requests in flight; retry after `...)
		}
		buf = strconv.AppendInt(buf, p.RetryAfter, 10)
		if p.RetryAfter == 1 {
			buf = append(buf, ` second."`...)
		} else {
			buf = append(buf, ` seconds."`...)
		}
	} else {
		buf = appendJSONString(buf, p.Detail)
	}
	if p.Policy != "" {
		buf = append(buf, `,"policy":`...)
		buf = appendJSONString(buf, p.Policy)
	}
	if p.RetryAfter > 0 {
		buf = append(buf, `,"retry_after_seconds":`...)
		buf = strconv.AppendInt(buf, p.RetryAfter, 10)
	}
	if p.Cost > 1 {
		buf = append(buf, `,"cost":`...)
		buf = strconv.AppendInt(buf, p.Cost, 10)
		buf = append(buf, `,"remaining":`...)
		buf = strconv.AppendInt(buf, p.Remaining, 10)
	}
	return append(buf, "}\n"...)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	buf = appendJSONStringBody(buf, s)
	return append(buf, '"')
}

// appendJSONStringBody appends s escaped for the inside of a JSON string. Invalid UTF-8 becomes
// U+FFFD, so the body is always valid JSON.
func appendJSONStringBody(buf []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				buf = append(buf, '\\', c)
			case c < 0x20:
				buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				buf = append(buf, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			buf = append(buf, "\ufffd"...)
		} else {
			buf = append(buf, s[i:i+size]...)
		}
		i += size
	}
	return buf
}
