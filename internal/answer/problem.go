package answer

import (
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Problem types (RFC 9457) of the gateway's own answers. They are stable identifiers, not
// links: clients may switch on them. A specific type rather than "about:blank" because the
// bodies carry extension members (policy, retry_after_seconds) whose meaning the type defines.
// docs/configuration.md lists them with their statuses; a test keeps that list true.
const (
	ProblemBase         = "https://ratelimit-proxy.dev/problems/"
	ProblemRateLimited  = ProblemBase + "rate-limited"         // 429
	ProblemConcurrency  = ProblemBase + "concurrency-limited"  // 429 of a concurrency policy
	ProblemOverloaded   = ProblemBase + "overloaded"           // 503 or 429: shed to protect the upstream
	ProblemUnauthorized = ProblemBase + "unauthorized"         // 401: a bearer token failed verification
	ProblemAmbiguous    = ProblemBase + "ambiguous-request"    // 400: cannot be judged unambiguously
	ProblemBadBody      = ProblemBase + "malformed-body"       // 400: the body broke its framing
	ProblemBodyTimeout  = ProblemBase + "request-timeout"      // 408
	ProblemUnavailable  = ProblemBase + "limiter-unavailable"  // 503: the store failed (on_error deny)
	ProblemInternal     = ProblemBase + "internal"             // 500
	ProblemBadGateway   = ProblemBase + "upstream-unavailable" // 502
	ProblemTimeout      = ProblemBase + "upstream-timeout"     // 504
)

// ContentTypeProblem is the media type of a problem body.
const ContentTypeProblem = "application/problem+json"

var (
	problemContentType = []string{ContentTypeProblem}
	noStore            = []string{"no-store"}
	nosniff            = []string{"nosniff"}
)

// Problem is one problem+json body. Policy, RetryAfter, Cost and Remaining are extension
// members, written only when set.
type Problem struct {
	Type   string
	Status int
	// Detail is the human explanation; for rate-limited and concurrency problems it is
	// generated from Policy, RetryAfter and Cost.
	Detail string
	// Policy names the policy that decided (429).
	Policy string
	// RetryAfter in seconds; when > 0 WriteProblem also sends it as Retry-After.
	RetryAfter int64
	// Cost is, for a rejected request of a weighted policy (cost above 1), what it would have
	// spent, and Remaining what is left of the budget (less than Cost): the body says which cost
	// did not fit. Both are written only when Cost > 1.
	Cost, Remaining int64
}

// WriteProblem writes p as the whole response, building the body in buf (which may be nil),
// and returns buf for reuse.
func WriteProblem(w http.ResponseWriter, buf []byte, p Problem) []byte {
	buf = AppendProblem(buf, p)
	var retry []string
	if p.RetryAfter > 0 {
		retry = RetryAfter(p.RetryAfter)
	}
	SetProblemHeaders(w.Header(), retry)
	w.WriteHeader(p.Status)
	_, _ = w.Write(buf) // the client may be gone; there is nobody left to tell
	return buf
}

// SetProblemHeaders sets the headers of a problem response, and Retry-After to retry unless it
// is nil. No cache may keep a problem: it describes one moment of one client's budget.
func SetProblemHeaders(h http.Header, retry []string) {
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	h["X-Content-Type-Options"] = nosniff
	if retry != nil {
		h[HeaderRetryAfter] = retry
	}
}

// AppendProblem appends p's problem+json body to buf, newline-terminated.
func AppendProblem(buf []byte, p Problem) []byte {
	buf = append(buf, `{"type":`...)
	buf = AppendJSONString(buf, p.Type)
	buf = append(buf, `,"title":`...)
	buf = AppendJSONString(buf, http.StatusText(p.Status))
	buf = append(buf, `,"status":`...)
	buf = strconv.AppendInt(buf, int64(p.Status), 10)
	buf = append(buf, `,"detail":`...)
	switch p.Type {
	case ProblemRateLimited, ProblemConcurrency:
		// Built here rather than with fmt: this is the hot path of an attack.
		if p.Type == ProblemRateLimited {
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
	default:
		buf = AppendJSONString(buf, p.Detail)
	}
	if p.Policy != "" {
		buf = append(buf, `,"policy":`...)
		buf = AppendJSONString(buf, p.Policy)
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

// AppendJSONString appends s as a JSON string.
func AppendJSONString(buf []byte, s string) []byte {
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
