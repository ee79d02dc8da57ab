package ratelimitclient

import (
	"math"
	"net/http"
	"strconv"
	"testing"
	"time"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestRetryDelay(t *testing.T) {
	tests := []struct {
		name       string
		retryAfter []string
		rateLimit  []string
		want       time.Duration
		wantOK     bool
	}{
		{name: "no headers"},
		{name: "delta seconds", retryAfter: []string{"3"}, want: 3 * time.Second, wantOK: true},
		{name: "zero", retryAfter: []string{"0"}, want: 0, wantOK: true},
		{name: "surrounding space", retryAfter: []string{" 7 "}, want: 7 * time.Second, wantOK: true},
		{name: "HTTP date", retryAfter: []string{t0.Add(90 * time.Second).Format(http.TimeFormat)}, want: 90 * time.Second, wantOK: true},
		{name: "RFC 850 date", retryAfter: []string{"Wednesday, 02-Jan-30 03:04:15 GMT"}, want: 10 * time.Second, wantOK: true},
		{name: "ANSI C date", retryAfter: []string{"Wed Jan  2 03:04:25 2030"}, want: 20 * time.Second, wantOK: true},
		{name: "date in the past", retryAfter: []string{t0.Add(-time.Hour).Format(http.TimeFormat)}, want: 0, wantOK: true},
		{name: "negative is not delta-seconds", retryAfter: []string{"-5"}},
		{name: "plus sign", retryAfter: []string{"+5"}},
		{name: "decimal", retryAfter: []string{"1.5"}},
		{name: "garbage", retryAfter: []string{"soon"}},
		{name: "empty", retryAfter: []string{""}},
		{name: "overflow saturates", retryAfter: []string{"99999999999999999999999"}, want: math.MaxInt64, wantOK: true},
		{name: "beyond a Duration saturates", retryAfter: []string{strconv.FormatInt(maxSeconds+1, 10)}, want: math.MaxInt64, wantOK: true},
		{name: "largest of several lines", retryAfter: []string{"2", "junk", "5", "1"}, want: 5 * time.Second, wantOK: true},
		{name: "invalid Retry-After falls back to RateLimit", retryAfter: []string{"later"}, rateLimit: []string{`"p";r=0;t=4`}, want: 4 * time.Second, wantOK: true},

		{name: "Retry-After wins over RateLimit", retryAfter: []string{"1"}, rateLimit: []string{`"per-ip";r=0;t=9`}, want: time.Second, wantOK: true},
		{name: "RateLimit as the gateway sends it", rateLimit: []string{`"per-ip";r=0;t=3`}, want: 3 * time.Second, wantOK: true},
		{name: "RateLimit token name", rateLimit: []string{`default;r=0;t=30`}, want: 30 * time.Second, wantOK: true},
		{name: "RateLimit policy with quota left is no floor", rateLimit: []string{`"per-ip";r=4;t=3`}},
		{name: "RateLimit largest exhausted t", rateLimit: []string{`"a";r=0;t=3, "b";r=7;t=60, "c";r=0;t=5`}, want: 5 * time.Second, wantOK: true},
		{name: "RateLimit over several lines", rateLimit: []string{`"a";r=0;t=3`, `"c";r=0;t=8`}, want: 8 * time.Second, wantOK: true},
		{name: "RateLimit missing r counts as exhausted", rateLimit: []string{`"a";t=6`}, want: 6 * time.Second, wantOK: true},
		{name: "RateLimit exhausted without t", rateLimit: []string{`"a";r=0`}},
		{name: "RateLimit negative t ignored", rateLimit: []string{`"a";r=0;t=-3`}},
		{name: "RateLimit decimal t ignored", rateLimit: []string{`"a";r=0;t=3.5`}},
		{name: "RateLimit t beyond a Duration saturates", rateLimit: []string{`"a";r=0;t=999999999999999`}, want: math.MaxInt64, wantOK: true},
		{name: "RateLimit inner list ignored", rateLimit: []string{`("a" "b");r=0;t=3`}},
		{name: "RateLimit malformed", rateLimit: []string{`"a";r=0;t=3,,`}},
		{name: "RateLimit draft-07 dictionary", rateLimit: []string{`limit=10, remaining=0, reset=12`}, want: 12 * time.Second, wantOK: true},
		{name: "RateLimit draft-07 dictionary with quota left", rateLimit: []string{`limit=10, remaining=2, reset=12`}},
		{name: "RateLimit draft-07 dictionary without reset", rateLimit: []string{`limit=10, remaining=0`}},
		{name: "RateLimit draft-07 dictionary negative reset", rateLimit: []string{`remaining=0, reset=-1`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tc.retryAfter {
				h.Add("Retry-After", v)
			}
			for _, v := range tc.rateLimit {
				h.Add("RateLimit", v)
			}
			got, ok := RetryDelay(h, t0)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("RetryDelay(%q) = %v, %v; want %v, %v", h, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// FuzzRetryDelay: any header values give a non-negative delay (0 when there is no hint), and a
// Retry-After of plain digits is exactly that many seconds, whatever RateLimit says.
func FuzzRetryDelay(f *testing.F) {
	f.Add("3", `"per-ip";r=0;t=1`)
	f.Add("Wed, 02 Jan 2030 03:05:00 GMT", "")
	f.Add("", `"a";r=0;t=3, "b";r=7;t=60`)
	f.Add("x", `limit=10, remaining=0, reset=12`)
	f.Add("", `("a" "b");r=0;t=3`)
	f.Add("18446744073709551616", `"a";r=?0;t=9999999999999999`)
	f.Fuzz(func(t *testing.T, retryAfter, rateLimit string) {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		if rateLimit != "" {
			h.Set("RateLimit", rateLimit)
		}
		d, ok := RetryDelay(h, t0)
		if d < 0 {
			t.Fatalf("RetryDelay(%q) = %v: negative", h, d)
		}
		if !ok && d != 0 {
			t.Fatalf("RetryDelay(%q) = %v, false: a delay without a hint", h, d)
		}
		if n, err := strconv.ParseInt(retryAfter, 10, 64); err == nil && n >= 0 && n <= 1e6 && retryAfter[0] >= '0' && retryAfter[0] <= '9' {
			if !ok || d != time.Duration(n)*time.Second {
				t.Fatalf("RetryDelay(%q) = %v, %v; want %ds, true", h, d, ok, n)
			}
		}
	})
}
