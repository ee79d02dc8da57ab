package answer

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestAppendPolicyItem(t *testing.T) {
	tests := []struct {
		l    bucket.Limit
		want string
	}{
		{bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 30, Window: 1500 * time.Millisecond}, `"p";q=30;w=2`},
		{bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: 100 * time.Millisecond}, `"p";q=5;w=1`},
		{bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 4, Burst: 10}, `"p";q=10;w=3`},
		{bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 1}, `"p";q=1;w=1`},
		{bucket.Limit{Algorithm: bucket.Quota, Count: 1000, Period: bucket.Day}, `"p";q=1000;w=86400`},
		{bucket.Limit{Algorithm: bucket.Concurrency, Count: 7}, `"p";q=7;qu="concurrent-requests"`},
	}
	for _, tt := range tests {
		got := string(AppendPolicyItem(nil, "p", tt.l))
		if got != tt.want {
			t.Errorf("AppendPolicyItem(%+v) = %s, want %s", tt.l, got, tt.want)
		}
		// What a client's structured-field parser reads.
		if _, err := httpsfv.UnmarshalList([]string{got}); err != nil {
			t.Errorf("AppendPolicyItem(%+v) = %s: not an RFC 8941 list: %v", tt.l, got, err)
		}
	}
}

func TestAppendRateLimit(t *testing.T) {
	got := string(AppendRateLimit(nil, "per-ip", 3, 2500*time.Millisecond))
	if want := `"per-ip";r=3;t=3`; got != want {
		t.Fatalf("AppendRateLimit = %s, want %s", got, want)
	}
	it, err := httpsfv.UnmarshalItem([]string{got})
	if err != nil {
		t.Fatalf("%s: not an RFC 8941 item: %v", got, err)
	}
	if r, _ := it.Params.Get("r"); r != int64(3) {
		t.Errorf("r = %v, want 3", r)
	}
}

// Any label (RLS rule labels come from files that may hold any text) gives a header a
// structured-field parser accepts, and reads back as the label where the label is printable
// ASCII.
func FuzzAppendSFString(f *testing.F) {
	for _, s := range []string{"", "per-ip", `a"b\c`, "tab\t", "ünï", "\xff", "x\r\ny: z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := string(AppendRateLimit(nil, s, 1, time.Second))
		if strings.ContainsAny(v, "\r\n\x00") {
			t.Fatalf("AppendRateLimit(%q) = %q: a header value must not hold CR, LF or NUL", s, v)
		}
		it, err := httpsfv.UnmarshalItem([]string{v})
		if err != nil {
			t.Fatalf("AppendRateLimit(%q) = %q: not an RFC 8941 item: %v", s, v, err)
		}
		printable := true
		for i := 0; i < len(s); i++ {
			printable = printable && s[i] >= 0x20 && s[i] <= 0x7e
		}
		if printable && it.Value != s {
			t.Errorf("label %q reads back as %q", s, it.Value)
		}
	})
}

func TestResetValue(t *testing.T) {
	now := time.Unix(1000, 250e6)
	tests := []struct {
		delta bool
		d     time.Duration
		want  int64
	}{
		{true, 2500 * time.Millisecond, 3},
		{true, -time.Second, 0},
		{false, 750 * time.Millisecond, 1001}, // exactly on a second: not rounded further
		{false, time.Second, 1002},
		{false, -time.Second, 1001}, // never in the past
	}
	for _, tt := range tests {
		if got := ResetValue(tt.delta, now, tt.d); got != tt.want {
			t.Errorf("ResetValue(%v, %v) = %d, want %d", tt.delta, tt.d, got, tt.want)
		}
	}
}

func TestRetryAfterShared(t *testing.T) {
	if a, b := RetryAfter(7), RetryAfter(7); &a[0] != &b[0] || a[0] != "7" {
		t.Errorf("RetryAfter(7) = %v, %v: want the one shared value", a, b)
	}
	if got := RetryAfter(86400); got[0] != "86400" {
		t.Errorf("RetryAfter(86400) = %v", got)
	}
	// Header.Add must copy the shared value rather than append into it.
	h := http.Header{HeaderRetryAfter: RetryAfter(5)}
	h.Add(HeaderRetryAfter, "9")
	if RetryAfter(5)[0] != "5" || len(RetryAfter(5)) != 1 {
		t.Errorf("Header.Add wrote into the shared value: %v", RetryAfter(5))
	}
}

// The hot path's formatting allocates nothing once the buffer has grown: these run on every
// rejection of a flood.
func TestAppendAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 512)
	l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 5, Burst: 10}
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendPolicyItem(buf[:0], "per-ip", l)
		buf = append(buf, ", "...)
		buf = AppendRateLimit(buf, "per-ip", 3, time.Second)
		buf = AppendProblem(buf[:0], Problem{Type: ProblemRateLimited, Status: 429, Policy: "per-ip", RetryAfter: 2})
		_ = RetryAfter(2)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per answer, want 0", allocs)
	}
}

func BenchmarkAppendHeaders(b *testing.B) {
	buf := make([]byte, 0, 512)
	l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 5, Burst: 10}
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPolicyItem(buf[:0], "per-ip", l)
		buf = AppendRateLimit(buf[:0], "per-ip", 3, time.Second)
	}
}

func BenchmarkAppendProblem(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendProblem(buf[:0], Problem{Type: ProblemRateLimited, Status: 429, Policy: "per-ip", RetryAfter: 2})
	}
}
