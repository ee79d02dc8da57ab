package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const (
	mRequests  = "ratelimit_requests_total"
	mDecisions = "ratelimit_decisions_total"
)

func TestAdmitted_ForwardsWithHeadersOfLeastRemaining(t *testing.T) {
	pol := (&fakePolicies{}).add("per-ip", false, 1).add("per-key", false, 2).add("shadow", true, 3)
	lim := newFakeLimiter(true,
		bucket.Result{Allowed: true, Limit: 100, Remaining: 50, Reset: 1500 * time.Millisecond},
		bucket.Result{Allowed: true, Limit: 10, Remaining: 3, Reset: 2400 * time.Millisecond},
		bucket.Result{Allowed: true, Limit: 5, Remaining: 0, Reset: 9 * time.Second}, // shadow: ignored
	)
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/v1/things?x=1")

	if res.StatusCode != http.StatusOK || body != "upstream /v1/things" {
		t.Fatalf("got %d %q, want 200 %q", res.StatusCode, body, "upstream /v1/things")
	}
	if got := hs.up.hits.Load(); got != 1 {
		t.Errorf("upstream hits = %d, want 1", got)
	}
	wantHeader(t, res, "X-RateLimit-Limit", "10")
	wantHeader(t, res, "X-RateLimit-Remaining", "3")
	// now = 1_700_000_000.25; + 2.4s = ...002.65, rounded up.
	wantHeader(t, res, "X-RateLimit-Reset", "1700000003")
	wantHeader(t, res, "RateLimit", "")
	wantHeader(t, res, "RateLimit-Policy", "")
	if got, want := lim.lastNow, time.Unix(1_700_000_000, 250_000_000); !got.Equal(want) || lim.lastLen != 3 {
		t.Errorf("limiter got now=%v charges=%d, want now=%v charges=3", got, lim.lastLen, want)
	}
	for _, p := range []string{"per-ip", "per-key", "shadow"} {
		wantCounter(t, hs.reg, 1, mRequests, "policy", p, "result", "allowed")
		wantCounter(t, hs.reg, 0, mRequests, "policy", p, "result", "limited")
	}
	wantCounter(t, hs.reg, 1, mDecisions, "result", "allowed")
	if n, _ := histogram(t, hs.reg, "ratelimit_store_duration_seconds", "backend", "memory"); n != 1 {
		t.Errorf("store duration samples = %d, want 1", n)
	}
	if n, _ := histogram(t, hs.reg, "ratelimit_upstream_duration_seconds"); n != 1 {
		t.Errorf("upstream duration samples = %d, want 1", n)
	}
	if n := hs.logs.Len(); n != 0 {
		t.Errorf("admitted request logged %d lines, want 0: %v", n, hs.logs.All())
	}
}

func TestAdmitted_TieOnRemainingPicksFirst(t *testing.T) {
	pol := (&fakePolicies{}).add("a", false, 1).add("b", false, 2)
	lim := newFakeLimiter(true,
		bucket.Result{Allowed: true, Limit: 7, Remaining: 2, Reset: time.Second},
		bucket.Result{Allowed: true, Limit: 9, Remaining: 2, Reset: time.Second},
	)
	hs := newHarness(t, pol, lim, nil, nil)
	res, _ := hs.get("/")
	wantHeader(t, res, "X-RateLimit-Limit", "7")
}

func TestResetHeaderFormats(t *testing.T) {
	tests := []struct {
		name   string
		format policy.ResetFormat
		now    time.Time
		reset  time.Duration
		want   string
	}{
		{"delta rounds up", policy.ResetDelta, time.Unix(100, 0), 1200 * time.Millisecond, "2"},
		{"delta whole", policy.ResetDelta, time.Unix(100, 0), 3 * time.Second, "3"},
		{"delta zero", policy.ResetDelta, time.Unix(100, 0), 0, "0"},
		{"delta negative is zero", policy.ResetDelta, time.Unix(100, 0), -time.Second, "0"},
		{"unix exact", policy.ResetUnix, time.Unix(100, 0), 2 * time.Second, "102"},
		{"unix rounds up", policy.ResetUnix, time.Unix(100, 0), time.Nanosecond, "101"},
		{"unix now fraction", policy.ResetUnix, time.Unix(100, 500_000_000), 0, "101"},
		{"zero format is unix", 0, time.Unix(100, 0), 5 * time.Second, "105"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := (&fakePolicies{headers: policy.Headers{Reset: tt.format}}).add("p", false, 1)
			lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 1, Remaining: 0, Reset: tt.reset})
			hs := newHarness(t, pol, lim, nil, func(o *Options) { o.Now = func() time.Time { return tt.now } })
			res, _ := hs.get("/")
			wantHeader(t, res, "X-RateLimit-Reset", tt.want)
		})
	}
}

func TestRejected_429FromLargestRetryAfter(t *testing.T) {
	pol := (&fakePolicies{headers: policy.Headers{Reset: policy.ResetDelta}}).
		add("per-ip", false, 1).add("per-key", false, 2).add("global", false, 3).add("shadow", true, 4)
	lim := newFakeLimiter(false,
		bucket.Result{Allowed: false, Limit: 100, Reset: 5 * time.Second, RetryAfter: 1200 * time.Millisecond},
		bucket.Result{Allowed: false, Limit: 10, Reset: 7 * time.Second, RetryAfter: 3400 * time.Millisecond},
		bucket.Result{Allowed: true, Limit: 1000, Remaining: 999, Reset: time.Second},
		// A shadow charge never decides, even with the longest wait.
		bucket.Result{Allowed: false, Limit: 1, Reset: time.Minute, RetryAfter: time.Minute},
	)
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/x", "X-Api-Key", "sk_live_not_for_logs")

	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status = %d, want 429", res.StatusCode)
	}
	if got := hs.up.hits.Load(); got != 0 {
		t.Errorf("upstream hits = %d, want 0", got)
	}
	wantHeader(t, res, "Retry-After", "4")
	wantHeader(t, res, "X-RateLimit-Limit", "10")
	wantHeader(t, res, "X-RateLimit-Remaining", "0")
	wantHeader(t, res, "X-RateLimit-Reset", "7")
	p := decodeProblem(t, res, body)
	if p.Type != answer.ProblemRateLimited || p.Policy != "per-key" || p.RetryAfter != 4 {
		t.Errorf("problem = %+v, want type %s, policy per-key, retry_after_seconds 4", p, answer.ProblemRateLimited)
	}
	if !strings.Contains(p.Detail, `"per-key"`) || !strings.Contains(p.Detail, "4 seconds") {
		t.Errorf("detail = %q, want it to name the policy and the wait", p.Detail)
	}
	// Counting rule: rejecting enforced charges count "limited"; the rest consumed nothing.
	wantCounter(t, hs.reg, 1, mRequests, "policy", "per-ip", "result", "limited")
	wantCounter(t, hs.reg, 1, mRequests, "policy", "per-key", "result", "limited")
	for _, p := range []string{"global", "shadow"} {
		for _, r := range []string{"allowed", "limited", "shadow_limited"} {
			wantCounter(t, hs.reg, 0, mRequests, "policy", p, "result", r)
		}
	}
	wantCounter(t, hs.reg, 1, mDecisions, "result", "limited")
	wantCounter(t, hs.reg, 0, mDecisions, "result", "allowed")

	logs := hs.logs.FilterMessage("rate limited").All()
	if len(logs) != 1 {
		t.Fatalf("rate limited log lines = %d, want 1", len(logs))
	}
	fields := logs[0].ContextMap()
	want := hs.h.pseudonyms.Of("header:x-client", fakeValue(2))
	if fields["policy"] != "per-key" || fields["key"] != want {
		t.Errorf("log fields = %v, want policy per-key and key %s", fields, want)
	}
	// The logged key is a keyed pseudonym: not the raw value, nor the bucket key (an unkeyed
	// digest that small key spaces could be searched for).
	if fields["key"] == testKey(2).String() || fields["key"] == fakeValue(2) {
		t.Error("the log carries the bucket key or the raw value, want its HMAC under the process's secret")
	}
	if other := hs.h.pseudonyms.Of("header:x-client", fakeValue(3)); other == want {
		t.Error("two keys share one pseudonym")
	}
}

func TestRejected_RetryAfterAtLeastOne(t *testing.T) {
	for _, ra := range []time.Duration{0, time.Nanosecond, 300 * time.Millisecond, time.Second} {
		t.Run(ra.String(), func(t *testing.T) {
			pol := (&fakePolicies{}).add("p", false, 1)
			lim := newFakeLimiter(false, bucket.Result{Allowed: false, Limit: 1, RetryAfter: ra})
			hs := newHarness(t, pol, lim, nil, nil)
			res, body := hs.get("/")
			wantHeader(t, res, "Retry-After", "1")
			if p := decodeProblem(t, res, body); p.RetryAfter != 1 {
				t.Errorf("retry_after_seconds = %d, want 1", p.RetryAfter)
			}
		})
	}
}

// errBadToken is what a policy set returns for a bearer token that failed verification.
var errBadToken = fmt.Errorf("jwt: token is expired: %w", policy.ErrUnauthorized)

// With no ip policy matching, a bad token is answered 401 without asking the store.
func TestUnauthorized_NoCharges_401NotForwardedNotCharged(t *testing.T) {
	pol := &fakePolicies{err: errBadToken}
	lim := newFakeLimiter(true)
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/", "Authorization", "Bearer expired.token.value")

	wantBearer401(t, res, body)
	if hs.up.hits.Load() != 0 || lim.calls.Load() != 0 {
		t.Errorf("upstream hits = %d, limiter calls = %d, want 0 and 0", hs.up.hits.Load(), lim.calls.Load())
	}
	wantCounter(t, hs.reg, 1, mDecisions, "result", "unauthorized")
	for _, e := range hs.logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), "expired.token") {
			t.Errorf("log line %q carries the token", e.Message)
		}
	}
}

// A bad token still pays the ip charges Plan left: over the limit it gets the ordinary 429, so
// garbage tokens cannot bypass the ip flood protection.
func TestUnauthorized_IPChargeOverLimit_429(t *testing.T) {
	pol := (&fakePolicies{err: errBadToken, headers: policy.Headers{Reset: policy.ResetDelta}}).add("per-ip", false, 1)
	lim := newFakeLimiter(false,
		bucket.Result{Allowed: false, Limit: 10, Reset: 6 * time.Second, RetryAfter: 2500 * time.Millisecond})
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/", "Authorization", "Bearer garbage.token.value")

	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status = %d, want 429", res.StatusCode)
	}
	wantIPChargesOnly(t, hs, lim, pol)
	wantHeader(t, res, "Retry-After", "3")
	wantHeader(t, res, "X-RateLimit-Limit", "10")
	wantHeader(t, res, "X-RateLimit-Remaining", "0")
	wantHeader(t, res, "X-RateLimit-Reset", "6")
	wantHeader(t, res, "WWW-Authenticate", "")
	p := decodeProblem(t, res, body)
	if p.Type != answer.ProblemRateLimited || p.Policy != "per-ip" || p.RetryAfter != 3 {
		t.Errorf("problem = %+v, want type %s, policy per-ip, retry_after_seconds 3", p, answer.ProblemRateLimited)
	}
	wantCounter(t, hs.reg, 1, mRequests, "policy", "per-ip", "result", "limited")
	wantCounter(t, hs.reg, 0, mRequests, "policy", "per-ip", "result", "allowed")
	wantCounter(t, hs.reg, 1, mDecisions, "result", "limited")
	wantCounter(t, hs.reg, 0, mDecisions, "result", "unauthorized")
	if n, _ := histogram(t, hs.reg, "ratelimit_store_duration_seconds", "backend", "memory"); n != 1 {
		t.Errorf("store duration samples = %d, want 1", n)
	}
}

// Under the limit, a bad token is still refused with 401, and its ip charge stays taken.
func TestUnauthorized_IPChargeUnderLimit_401Charged(t *testing.T) {
	pol := (&fakePolicies{err: errBadToken}).add("per-ip", false, 1).add("per-ip-burst", false, 2)
	lim := newFakeLimiter(true,
		bucket.Result{Allowed: true, Limit: 10, Remaining: 9, Reset: time.Second},
		bucket.Result{Allowed: true, Limit: 100, Remaining: 99, Reset: time.Second})
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/", "Authorization", "Bearer garbage.token.value")

	wantBearer401(t, res, body)
	wantIPChargesOnly(t, hs, lim, pol)
	lim.mu.Lock()
	now := lim.lastNow
	lim.mu.Unlock()
	if want := time.Unix(1_700_000_000, 250_000_000); !now.Equal(want) {
		t.Errorf("limiter now = %v, want the handler's clock %v", now, want)
	}
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		wantHeader(t, res, h, "")
	}
	wantCounter(t, hs.reg, 1, mDecisions, "result", "unauthorized")
	wantCounter(t, hs.reg, 0, mDecisions, "result", "allowed")
	// Nothing reached the upstream, so nothing counts as allowed.
	wantCounter(t, hs.reg, 0, mRequests, "policy", "per-ip", "result", "allowed")
	if n, _ := histogram(t, hs.reg, "ratelimit_store_duration_seconds", "backend", "memory"); n != 1 {
		t.Errorf("store duration samples = %d, want 1", n)
	}
}

// A store that fails on a bad token's ip charges does not apply on_error: the request is refused
// either way, so it is neither forwarded (allow) nor turned into a 503 (deny).
func TestUnauthorized_StoreError_401(t *testing.T) {
	tests := []struct {
		name       string
		onError    bucket.OnError
		block      bool
		wantReason string
	}{
		{"error allow", bucket.Allow, false, "error"},
		{"error deny", bucket.Deny, false, "error"},
		{"timeout allow", bucket.Allow, true, "timeout"},
		{"timeout deny", bucket.Deny, true, "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := (&fakePolicies{err: errBadToken}).add("per-ip", false, 1)
			lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 1})
			lim.err = errors.New("store: connection reset")
			lim.block = tt.block
			lim.rule = tt.onError // as the fallback store decides it
			hs := newHarness(t, pol, lim, nil, func(o *Options) {
				o.Backend = "dynamodb"
				o.StoreTimeout = 20 * time.Millisecond
			})

			res, body := hs.get("/", "Authorization", "Bearer garbage.token.value")

			wantBearer401(t, res, body)
			wantIPChargesOnly(t, hs, lim, pol)
			wantCounter(t, hs.reg, 1, "ratelimit_store_errors_total", "backend", "dynamodb", "reason", tt.wantReason)
			wantCounter(t, hs.reg, 1, mDecisions, "result", "unauthorized")
			wantCounter(t, hs.reg, 0, mDecisions, "result", "store_error_allowed")
			wantCounter(t, hs.reg, 0, mDecisions, "result", "store_error_denied")
			if n := hs.logs.FilterMessage("rate-limit store error").Len(); n != 1 {
				t.Errorf("store error log lines = %d, want 1", n)
			}
		})
	}
}

// wantBearer401 checks a 401 answer: a Bearer challenge and the unauthorized problem type.
func wantBearer401(t *testing.T, res *http.Response, body string) {
	t.Helper()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status = %d, want 401", res.StatusCode)
	}
	if got := res.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
		t.Errorf("WWW-Authenticate = %q, want a Bearer challenge", got)
	}
	if p := decodeProblem(t, res, body); p.Type != answer.ProblemUnauthorized {
		t.Errorf("type = %q, want %q", p.Type, answer.ProblemUnauthorized)
	}
}

// wantIPChargesOnly checks what every answer to a bad token shares: nothing reached the
// upstream, the limiter was asked once with exactly the charges the plan left (the ip ones), and
// no log line carries the token.
func wantIPChargesOnly(t *testing.T, hs *harness, lim *fakeLimiter, pol *fakePolicies) {
	t.Helper()
	if got := hs.up.hits.Load(); got != 0 {
		t.Errorf("upstream hits = %d, want 0", got)
	}
	if got := lim.calls.Load(); got != 1 {
		t.Errorf("limiter calls = %d, want 1", got)
	}
	if got, want := fmt.Sprint(lim.charges()), fmt.Sprint(pol.charges); got != want {
		t.Errorf("limiter charges = %s, want the ip charges %s", got, want)
	}
	for _, e := range hs.logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), "garbage.token") {
			t.Errorf("log line %q carries the token", e.Message)
		}
	}
}

func TestPlanError_500(t *testing.T) {
	pol := &fakePolicies{err: errors.New("boom")}
	hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)
	res, body := hs.get("/")
	if res.StatusCode != http.StatusInternalServerError {
		t.Fatalf("status = %d, want 500", res.StatusCode)
	}
	decodeProblem(t, res, body)
	if hs.up.hits.Load() != 0 {
		t.Errorf("upstream hits = %d, want 0", hs.up.hits.Load())
	}
	wantCounter(t, hs.reg, 1, mDecisions, "result", "error")
}

func TestUnmatched_ForwardsWithoutHeaders(t *testing.T) {
	lim := newFakeLimiter(true)
	hs := newHarness(t, &fakePolicies{}, lim, nil, nil)
	res, _ := hs.get("/")
	if res.StatusCode != http.StatusOK || hs.up.hits.Load() != 1 {
		t.Fatalf("status = %d, upstream hits = %d, want 200 and 1", res.StatusCode, hs.up.hits.Load())
	}
	if lim.calls.Load() != 0 {
		t.Errorf("limiter calls = %d, want 0", lim.calls.Load())
	}
	for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
		wantHeader(t, res, h, "")
	}
	wantCounter(t, hs.reg, 1, mDecisions, "result", "unmatched")
}

func TestStoreError_OnErrorRule(t *testing.T) {
	tests := []struct {
		name       string
		onError    bucket.OnError
		block      bool // a store that hangs until the deadline, rather than failing at once
		wantStatus int
		wantHits   int64
		wantDec    string
		wantReason string
	}{
		{"error allow", bucket.Allow, false, http.StatusOK, 1, "store_error_allowed", "error"},
		{"error deny", bucket.Deny, false, http.StatusServiceUnavailable, 0, "store_error_denied", "error"},
		{"timeout allow", bucket.Allow, true, http.StatusOK, 1, "store_error_allowed", "timeout"},
		{"timeout deny", bucket.Deny, true, http.StatusServiceUnavailable, 0, "store_error_denied", "timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := (&fakePolicies{}).add("p", false, 1)
			lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 1})
			lim.err = errors.New("store: connection reset")
			lim.block = tt.block
			lim.rule = tt.onError // as the fallback store decides it
			hs := newHarness(t, pol, lim, nil, func(o *Options) {
				o.Backend = "dynamodb"
				o.StoreTimeout = 20 * time.Millisecond
			})

			res, body := hs.get("/")

			if res.StatusCode != tt.wantStatus {
				t.Fatalf("status = %d, want %d", res.StatusCode, tt.wantStatus)
			}
			if got := hs.up.hits.Load(); got != tt.wantHits {
				t.Errorf("upstream hits = %d, want %d", got, tt.wantHits)
			}
			if tt.block {
				select {
				case <-lim.sawDone:
				default:
					t.Error("the store never saw its context end")
				}
			}
			if tt.onError == bucket.Deny {
				wantHeader(t, res, "Retry-After", "1")
				if p := decodeProblem(t, res, body); p.Type != answer.ProblemUnavailable {
					t.Errorf("type = %q, want %q", p.Type, answer.ProblemUnavailable)
				}
			}
			for _, h := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
				wantHeader(t, res, h, "")
			}
			wantCounter(t, hs.reg, 1, "ratelimit_store_errors_total", "backend", "dynamodb", "reason", tt.wantReason)
			wantCounter(t, hs.reg, 1, mDecisions, "result", tt.wantDec)
			if n := hs.logs.FilterMessage("rate-limit store error").Len(); n != 1 {
				t.Errorf("store error log lines = %d, want 1", n)
			}
		})
	}
}

func TestShadow_CountedNeverRejected(t *testing.T) {
	pol := (&fakePolicies{}).add("enforced", false, 1).add("trial", true, 2)
	lim := newFakeLimiter(true,
		bucket.Result{Allowed: true, Limit: 50, Remaining: 40, Reset: time.Second},
		bucket.Result{Allowed: false, Limit: 5, Remaining: 0, Reset: time.Minute, RetryAfter: time.Minute},
	)
	hs := newHarness(t, pol, lim, nil, nil)

	res, _ := hs.get("/")

	if res.StatusCode != http.StatusOK || hs.up.hits.Load() != 1 {
		t.Fatalf("status = %d, upstream hits = %d, want 200 and 1", res.StatusCode, hs.up.hits.Load())
	}
	wantHeader(t, res, "X-RateLimit-Limit", "50")
	wantHeader(t, res, "X-RateLimit-Remaining", "40")
	wantHeader(t, res, "Retry-After", "")
	wantCounter(t, hs.reg, 1, mRequests, "policy", "trial", "result", "shadow_limited")
	wantCounter(t, hs.reg, 0, mRequests, "policy", "trial", "result", "allowed")
	wantCounter(t, hs.reg, 1, mRequests, "policy", "enforced", "result", "allowed")
	logs := hs.logs.FilterMessage("shadow limit exceeded").All()
	if len(logs) != 1 || logs[0].ContextMap()["policy"] != "trial" {
		t.Errorf("shadow logs = %v, want one line for policy trial", logs)
	}
}

func TestLeakyBucket_WaitsForLargestEnforcedWait(t *testing.T) {
	pol := (&fakePolicies{}).add("a", false, 1).add("b", false, 2).add("s", true, 3)
	lim := newFakeLimiter(true,
		bucket.Result{Allowed: true, Limit: 5, Remaining: 1, Wait: 250 * time.Millisecond},
		bucket.Result{Allowed: true, Limit: 5, Remaining: 3, Wait: 100 * time.Millisecond},
		bucket.Result{Allowed: true, Limit: 5, Remaining: 3, Wait: time.Hour}, // shadow never shapes
	)
	var waits []time.Duration
	var hitsDuringWait int64 = -1
	var hs *harness
	hs = newHarness(t, pol, lim, nil, func(o *Options) {
		o.Wait = func(ctx context.Context, d time.Duration) error {
			waits = append(waits, d) // one request: no race
			hitsDuringWait = hs.up.hits.Load()
			return ctx.Err()
		}
	})

	res, _ := hs.get("/")

	if res.StatusCode != http.StatusOK || hs.up.hits.Load() != 1 {
		t.Fatalf("status = %d, upstream hits = %d, want 200 and 1", res.StatusCode, hs.up.hits.Load())
	}
	if len(waits) != 1 || waits[0] != 250*time.Millisecond {
		t.Errorf("waits = %v, want [250ms]", waits)
	}
	if hitsDuringWait != 0 {
		t.Errorf("upstream hits while waiting = %d, want 0 (wait before forwarding)", hitsDuringWait)
	}
	if n, sum := histogram(t, hs.reg, "ratelimit_leaky_wait_seconds"); n != 1 || sum != 0.25 {
		t.Errorf("leaky wait histogram = %d samples, sum %v; want 1, 0.25", n, sum)
	}
}

func TestLeakyBucket_NoWaitWhenZero(t *testing.T) {
	pol := (&fakePolicies{}).add("a", false, 1)
	lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 5, Remaining: 1})
	var called atomic.Bool
	hs := newHarness(t, pol, lim, nil, func(o *Options) {
		o.Wait = func(context.Context, time.Duration) error { called.Store(true); return nil }
	})
	hs.get("/")
	if called.Load() {
		t.Error("Wait was called for a request with no wait")
	}
}

func TestLeakyBucket_ClientGoneWhileWaiting(t *testing.T) {
	pol := (&fakePolicies{}).add("a", false, 1)
	lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 5, Wait: time.Hour})
	entered := make(chan struct{})
	hs := newHarness(t, pol, lim, nil, func(o *Options) {
		o.Wait = func(ctx context.Context, d time.Duration) error {
			close(entered)
			<-ctx.Done()
			return ctx.Err()
		}
	})
	hs.cancelWhenEntered(t, "/", entered)
	if got := hs.up.hits.Load(); got != 0 {
		t.Errorf("upstream hits = %d, want 0", got)
	}
	wantCounter(t, hs.reg, 1, "ratelimit_client_canceled_total", "stage", "wait")
}

func TestDefaultWait_HonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("sleep on a canceled context = %v, want context.Canceled", err)
	}
	if err := sleep(context.Background(), time.Nanosecond); err != nil {
		t.Errorf("sleep 1ns = %v, want nil", err)
	}
}

func TestIETFHeaders(t *testing.T) {
	window := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Minute}
	tb := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 20}
	override := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 5}
	pol := &fakePolicies{
		headers: policy.Headers{Reset: policy.ResetDelta, IETF: true},
		policies: []*policy.Policy{
			{Name: "per-ip", Limit: window, IETFPolicy: `"per-ip";q=100;w=60`},
			{Name: "per-key", Limit: tb, IETFPolicy: `"per-key";q=20;w=2`},
			{Name: "trial", Shadow: true, Limit: tb, IETFPolicy: `"trial";q=20;w=2`},
		},
		charges: []bucket.Charge{
			{Key: testKey(1), Limit: window},
			{Key: testKey(2), Limit: override},
			{Key: testKey(3), Limit: tb, Shadow: true},
		},
	}
	const wantPolicy = `"per-ip";q=100;w=60, "per-key";q=5;w=5`

	t.Run("admitted", func(t *testing.T) {
		lim := newFakeLimiter(true,
			bucket.Result{Allowed: true, Limit: 100, Remaining: 40, Reset: 30 * time.Second},
			bucket.Result{Allowed: true, Limit: 5, Remaining: 2, Reset: 2500 * time.Millisecond},
			bucket.Result{Allowed: true, Limit: 20, Remaining: 0, Reset: time.Second},
		)
		hs := newHarness(t, pol, lim, nil, nil)
		res, _ := hs.get("/")
		wantHeader(t, res, "RateLimit-Policy", wantPolicy)
		wantHeader(t, res, "RateLimit", `"per-key";r=2;t=3`)
		wantHeader(t, res, "X-RateLimit-Remaining", "2")
	})
	t.Run("rejected", func(t *testing.T) {
		lim := newFakeLimiter(false,
			bucket.Result{Allowed: false, Limit: 100, Reset: 30 * time.Second, RetryAfter: 10 * time.Second},
			bucket.Result{Allowed: true, Limit: 5, Remaining: 2, Reset: 2500 * time.Millisecond},
			bucket.Result{Allowed: true, Limit: 20, Remaining: 0, Reset: time.Second},
		)
		hs := newHarness(t, pol, lim, nil, nil)
		res, _ := hs.get("/")
		wantHeader(t, res, "RateLimit-Policy", wantPolicy)
		wantHeader(t, res, "RateLimit", `"per-ip";r=0;t=30`)
		wantHeader(t, res, "Retry-After", "10")
	})
}

func TestAppendIETFItem(t *testing.T) {
	tests := []struct {
		l    bucket.Limit
		want string
	}{
		{bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 30, Window: 1500 * time.Millisecond}, `"p";q=30;w=2`},
		{bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 4, Burst: 10}, `"p";q=10;w=3`},
		{bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 1}, `"p";q=1;w=1`},
		{bucket.Limit{Algorithm: bucket.Concurrency, Count: 7}, `"p";q=7;qu="concurrent-requests"`},
	}
	for _, tt := range tests {
		if got := string(answer.AppendPolicyItem(nil, "p", tt.l)); got != tt.want {
			t.Errorf("answer.AppendPolicyItem(%+v) = %s, want %s", tt.l, got, tt.want)
		}
	}
}

// A trusted proxy's forwarding headers are kept (its list extended by the peer); an untrusted
// client's are replaced by what the gateway saw. Trust is asked once, about the direct peer.
func TestForwardingHeaders(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			pol := &fakePolicies{trust: trusted}
			hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)

			hs.get("/", "X-Forwarded-For", "203.0.113.7", "X-Forwarded-Host", "public.example",
				"X-Forwarded-Proto", "https", "Forwarded", "for=198.51.100.1")

			in := hs.up.lastRequest(t)
			wantFor, wantHost, wantProto := "127.0.0.1", hs.srv.Listener.Addr().String(), "http"
			if trusted {
				wantFor, wantHost, wantProto = "203.0.113.7, 127.0.0.1", "public.example", "https"
			}
			if got := strings.Join(in.Header.Values("X-Forwarded-For"), "|"); got != wantFor {
				t.Errorf("X-Forwarded-For = %q, want %q", got, wantFor)
			}
			if got := strings.Join(in.Header.Values("X-Forwarded-Host"), "|"); got != wantHost {
				t.Errorf("X-Forwarded-Host = %q, want %q", got, wantHost)
			}
			if got := strings.Join(in.Header.Values("X-Forwarded-Proto"), "|"); got != wantProto {
				t.Errorf("X-Forwarded-Proto = %q, want %q", got, wantProto)
			}
			if got := in.Header.Get("Forwarded"); got != "" {
				t.Errorf("Forwarded = %q, want it dropped", got)
			}
			if got, want := in.Host, hs.up.Listener.Addr().String(); got != want {
				t.Errorf("upstream Host = %q, want the upstream's %q", got, want)
			}
			pol.mu.Lock()
			peers := fmt.Sprint(pol.peers)
			pol.mu.Unlock()
			if peers != "[127.0.0.1]" {
				t.Errorf("Trusted was asked about %s, want [127.0.0.1]", peers)
			}
		})
	}
}

// Which inbound X-Forwarded-Proto and X-Forwarded-Host values survive, each sent alone (so the
// policy set must reach the rewrite without an X-Forwarded-For too).
func TestForwardingHeaders_ProtoAndHost(t *testing.T) {
	const self = "" // stands for the value the gateway sets itself
	tests := []struct {
		name    string
		trusted bool
		header  string
		values  []string // one line each
		want    string   // self: the connection's scheme (http) or the client's Host
	}{
		// Behind a TLS-terminating load balancer listed in trusted_proxies.
		{"trusted proto https", true, "X-Forwarded-Proto", []string{"https"}, "https"},
		{"trusted proto HTTPS", true, "X-Forwarded-Proto", []string{"HTTPS"}, "https"},
		{"trusted proto Http", true, "X-Forwarded-Proto", []string{"Http"}, "http"},
		{"trusted proto list", true, "X-Forwarded-Proto", []string{"https, http"}, self},
		{"trusted proto two lines", true, "X-Forwarded-Proto", []string{"https", "https"}, self},
		{"trusted proto other scheme", true, "X-Forwarded-Proto", []string{"wss"}, self},
		{"trusted proto empty", true, "X-Forwarded-Proto", []string{""}, self},
		{"untrusted proto https", false, "X-Forwarded-Proto", []string{"https"}, self},
		{"trusted host", true, "X-Forwarded-Host", []string{"public.example"}, "public.example"},
		{"trusted host two lines", true, "X-Forwarded-Host", []string{"a.example", "b.example"}, self},
		{"trusted host empty", true, "X-Forwarded-Host", []string{""}, self},
		{"untrusted host", false, "X-Forwarded-Host", []string{"evil.example"}, self},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := &fakePolicies{trust: tt.trusted}
			hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)
			var kv []string
			for _, v := range tt.values {
				kv = append(kv, tt.header, v)
			}

			hs.get("/", kv...)

			want := tt.want
			if want == self {
				want = "http"
				if tt.header == "X-Forwarded-Host" {
					want = hs.srv.Listener.Addr().String()
				}
			}
			if got := strings.Join(hs.up.lastRequest(t).Header.Values(tt.header), "|"); got != want {
				t.Errorf("%s = %q at the upstream, want %q", tt.header, got, want)
			}
			if got := pol.trustedCalls.Load(); got != 1 {
				t.Errorf("Trusted calls = %d, want 1", got)
			}
		})
	}
}

// Without inbound forwarding headers the peer's trust is not even asked (the cheap path).
func TestForwardingHeaders_NoInboundList(t *testing.T) {
	pol := &fakePolicies{trust: true}
	hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)
	hs.get("/")
	in := hs.up.lastRequest(t)
	if got := in.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want 127.0.0.1", got)
	}
	if got := in.Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto = %q, want http", got)
	}
	if got := pol.trustedCalls.Load(); got != 0 {
		t.Errorf("Trusted calls = %d, want 0", got)
	}
}

// A client cannot use Connection to strip the forwarding headers the gateway writes:
// ReverseProxy drops the hop-by-hop headers it names before Rewrite runs.
func TestForwardingHeaders_ConnectionCannotStripThem(t *testing.T) {
	pol := &fakePolicies{trust: false}
	hs := newHarness(t, pol, newFakeLimiter(true), nil, nil)

	hs.get("/", "Connection", "X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host", "X-Forwarded-For", "198.51.100.1")

	in := hs.up.lastRequest(t)
	if got := in.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want 127.0.0.1", got)
	}
	if got := in.Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto = %q, want http", got)
	}
	if got, want := in.Header.Get("X-Forwarded-Host"), hs.srv.Listener.Addr().String(); got != want {
		t.Errorf("X-Forwarded-Host = %q, want the client's Host %q", got, want)
	}
}

func TestOneSetPerRequest(t *testing.T) {
	first := (&fakePolicies{trust: true}).add("p", false, 1)
	second := (&fakePolicies{trust: true}).add("p", false, 1)
	var calls atomic.Int64
	lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 1})
	hs := newHarness(t, first, lim, nil, func(o *Options) {
		o.Policies = func() Policies {
			// A reload lands right after the request read its set.
			if calls.Add(1) == 1 {
				return first
			}
			return second
		}
	})

	hs.get("/", "X-Forwarded-For", "203.0.113.7")

	if got := calls.Load(); got != 1 {
		t.Errorf("Policies() calls = %d, want 1", got)
	}
	if first.plans.Load() != 1 || first.trustedCalls.Load() != 1 {
		t.Errorf("first set: plans %d, trusted %d; want 1 and 1", first.plans.Load(), first.trustedCalls.Load())
	}
	if second.plans.Load() != 0 || second.trustedCalls.Load() != 0 {
		t.Errorf("second set consulted (plans %d, trusted %d), want not at all", second.plans.Load(), second.trustedCalls.Load())
	}
}

func TestServesEveryPath(t *testing.T) {
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), nil, nil)
	for _, p := range []string{"/metrics", "/healthz", "/readyz", "/"} {
		res, body := hs.get(p)
		if res.StatusCode != http.StatusOK || body != "upstream "+p {
			t.Errorf("GET %s = %d %q, want 200 from the upstream", p, res.StatusCode, body)
		}
	}
}

func TestLogs_SampledAndFreeOfSecrets(t *testing.T) {
	const secretKey, secretToken, secretUser = "sk_live_supersecret", "eyJ.secret.tok", "user-4711"
	pol := (&fakePolicies{}).add("per-key", false, 9)
	lim := newFakeLimiter(false, bucket.Result{Allowed: false, Limit: 1, RetryAfter: time.Second})
	hs := newHarness(t, pol, lim, nil, nil)

	const n = 5 * logBurst
	for range n {
		res, _ := hs.get("/", "X-Api-Key", secretKey, "Authorization", "Bearer "+secretToken, "X-User", secretUser)
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("status = %d, want 429", res.StatusCode)
		}
	}
	wantCounter(t, hs.reg, n, mDecisions, "result", "limited")
	logs := hs.logs.FilterMessage("rate limited").All()
	if len(logs) != logBurst {
		t.Errorf("rate limited log lines for %d rejections in one second = %d, want %d", n, len(logs), logBurst)
	}
	for _, e := range hs.logs.All() {
		text := fmt.Sprint(e.Message, e.ContextMap())
		for _, s := range []string{secretKey, secretToken, secretUser} {
			if strings.Contains(text, s) {
				t.Errorf("log line %q contains %q", text, s)
			}
		}
	}
}

func TestNew_Validation(t *testing.T) {
	valid := func() Options {
		return Options{
			Upstream: mustURL(t, "http://127.0.0.1:1"),
			Policies: func() Policies { return &fakePolicies{} },
			Limiter:  newFakeLimiter(true),
		}
	}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no upstream", func(o *Options) { o.Upstream = nil }, "upstream is required"},
		{"relative upstream", func(o *Options) { o.Upstream = mustURL(t, "/x") }, "scheme"},
		{"ftp upstream", func(o *Options) { o.Upstream = mustURL(t, "ftp://h/") }, "scheme"},
		{"no host", func(o *Options) { o.Upstream = mustURL(t, "http:///x") }, "host"},
		{"no policies", func(o *Options) { o.Policies = nil }, "policies"},
		{"no limiter", func(o *Options) { o.Limiter = nil }, "limiter"},
		{"negative timeout", func(o *Options) { o.StoreTimeout = -time.Second }, "negative"},
	}
	for _, tt := range tests {
		o := valid()
		tt.edit(&o)
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: New error = %v, want one mentioning %q", tt.name, err, tt.want)
		}
	}
	h, err := New(valid())
	if err != nil {
		t.Fatalf("New(valid) = %v", err)
	}
	if h.storeTimeout != DefaultStoreTimeout {
		t.Errorf("default store timeout = %v, want %v", h.storeTimeout, DefaultStoreTimeout)
	}
}

func TestNilPolicySet_FailsClosed(t *testing.T) {
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), nil, func(o *Options) {
		o.Policies = func() Policies { return nil }
	})
	res, body := hs.get("/")
	if res.StatusCode != http.StatusServiceUnavailable || hs.up.hits.Load() != 0 {
		t.Fatalf("status = %d, upstream hits = %d; want 503 and 0", res.StatusCode, hs.up.hits.Load())
	}
	decodeProblem(t, res, body)
}
