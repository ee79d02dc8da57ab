package ratelimitclient

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
)

// maxSeconds is the largest number of seconds a time.Duration holds; larger hints saturate.
const maxSeconds = math.MaxInt64 / int64(time.Second)

// RetryDelay returns how long the server asked the client to wait before it retries, read from
// the response headers h at the instant now, and whether h held such a request at all:
//
//   - Retry-After as delta-seconds ("120") or an HTTP date (relative to now; a past date is 0).
//     With several Retry-After lines, the longest valid one counts.
//   - Otherwise the IETF RateLimit header: the largest `t` (seconds) among its policies that have
//     no quota left (`r` is 0 or missing), parsed as an RFC 9651 structured field list
//     (`"per-ip";r=0;t=3, "per-key";r=5;t=60` gives 3s), or in the older dictionary form of the
//     draft (`limit=10, remaining=0, reset=3`).
//
// Values that do not parse are ignored, as if the header were absent. A hint too large for a
// time.Duration saturates at the largest one. RetryDelay never returns a negative duration.
func RetryDelay(h http.Header, now time.Time) (time.Duration, bool) {
	if d, ok := retryAfter(h.Values("Retry-After"), now); ok {
		return d, true
	}
	return rateLimitReset(h.Values("RateLimit"))
}

// retryAfter parses Retry-After lines (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.
func retryAfter(lines []string, now time.Time) (time.Duration, bool) {
	var best time.Duration
	found := false
	for _, v := range lines {
		v = strings.TrimSpace(v)
		d, ok := deltaSeconds(v)
		if !ok {
			t, err := http.ParseTime(v)
			if err != nil {
				continue
			}
			d = t.Sub(now)
			if d < 0 {
				d = 0
			}
		}
		if !found || d > best {
			best, found = d, true
		}
	}
	return best, found
}

// deltaSeconds parses 1*DIGIT. The digits are checked first so that the only error ParseUint can
// return is an overflow, which saturates instead of failing: "wait a very long time" is what the
// server meant.
func deltaSeconds(v string) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > uint64(maxSeconds) { // only ErrRange is possible here
		return math.MaxInt64, true
	}
	return time.Duration(n) * time.Second, true
}

// rateLimitReset reads the IETF RateLimit header: the largest reset among exhausted policies.
func rateLimitReset(lines []string) (time.Duration, bool) {
	if len(lines) == 0 {
		return 0, false
	}
	if list, err := httpsfv.UnmarshalList(lines); err == nil {
		var best int64
		found := false
		for _, m := range list {
			it, ok := m.(httpsfv.Item)
			if !ok || it.Params == nil {
				continue
			}
			if !exhausted(it.Params.Get("r")) {
				continue
			}
			if t, ok := seconds(it.Params.Get("t")); ok && (!found || t > best) {
				best, found = t, true
			}
		}
		return secondsDuration(best), found
	}
	// The dictionary form of draft-ietf-httpapi-ratelimit-headers-07 and earlier.
	dict, err := httpsfv.UnmarshalDictionary(lines)
	if err != nil {
		return 0, false
	}
	if m, ok := dict.Get("remaining"); ok {
		it, isItem := m.(httpsfv.Item)
		if !isItem || !exhausted(it.Value, true) {
			return 0, false
		}
	}
	m, ok := dict.Get("reset")
	if !ok {
		return 0, false
	}
	it, isItem := m.(httpsfv.Item)
	if !isItem {
		return 0, false
	}
	t, ok := seconds(it.Value, true)
	if !ok {
		return 0, false
	}
	return secondsDuration(t), true
}

// exhausted reports whether a remaining-quota value (r, or remaining) says no quota is left. A
// missing value counts as exhausted: the server rejected the request and said no more.
func exhausted(v any, present bool) bool {
	if !present {
		return true
	}
	n, ok := v.(int64)
	if !ok {
		// A malformed r (a string, a decimal) tells nothing; the reset still bounds the wait.
		return true
	}
	return n <= 0
}

// seconds reads a non-negative integer number of seconds (t, or reset).
func seconds(v any, present bool) (int64, bool) {
	if !present {
		return 0, false
	}
	n, ok := v.(int64)
	if !ok || n < 0 {
		return 0, false
	}
	return n, true
}

func secondsDuration(n int64) time.Duration {
	if n > maxSeconds {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}
