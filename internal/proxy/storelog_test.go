package proxy

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestStoreErrorsLogOnceAMinute: a store that stays out (a missing table, an unreachable Redis)
// fails every request; the log gets the first error, then at most one line a minute with how
// many it left out, not a line per request. The metrics count every one.
func TestStoreErrorsLogOnceAMinute(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	lim := newFakeLimiter(false)
	lim.err = errors.New("ResourceNotFoundException: table not found")
	hs := newHarness(t, (&fakePolicies{}).add("per-ip", false, 1), lim, nil, func(o *Options) { o.Now = clock; o.Backend = "dynamodb" })
	get := func(n int) {
		for range n {
			if res, _ := hs.get("/"); res.StatusCode != http.StatusOK { // on_error allow
				t.Fatalf("a request with the store out: %d, want 200 (on_error allow)", res.StatusCode)
			}
		}
	}
	lines := func() int { return hs.logs.FilterMessage("rate-limit store error").Len() }
	get(50)
	if n := lines(); n != 1 {
		t.Fatalf("50 failing requests in one instant: %d log lines, want 1", n)
	}
	advance(30 * time.Second)
	get(10)
	if n := lines(); n != 1 {
		t.Fatalf("30 s later: %d log lines, want still 1", n)
	}
	advance(31 * time.Second)
	get(1)
	if n := lines(); n != 2 {
		t.Fatalf("a minute later: %d log lines, want 2", n)
	}
	last := hs.logs.FilterMessage("rate-limit store error").All()[1]
	if got := last.ContextMap()["left_out"]; got != int64(59) {
		t.Errorf("the second line's left_out: %v, want 59 (the errors since the first line)", got)
	}
	wantCounter(t, hs.reg, 61, "ratelimit_store_errors_total", "backend", "dynamodb", "reason", "error")
}
