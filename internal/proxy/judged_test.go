package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// A request Plan cannot judge unambiguously is answered 400 (the problem names the header),
// never forwarded, and its ip charges stay taken.
func TestBadRequest_IPChargeUnderLimit_400(t *testing.T) {
	pol := (&fakePolicies{err: &policy.RequestError{Header: "X-Api-Key"}}).add("per-ip", false, 1)
	lim := newFakeLimiter(true, bucket.Result{Allowed: true, Limit: 10, Remaining: 9, Reset: time.Second})
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/")

	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("status = %d, want 400", res.StatusCode)
	}
	p := decodeProblem(t, res, body)
	if p.Type != answer.ProblemAmbiguous || !strings.Contains(p.Detail, "X-Api-Key") {
		t.Errorf("problem = %+v, want type %s naming X-Api-Key", p, answer.ProblemAmbiguous)
	}
	wantIPChargesOnly(t, hs, lim, pol)
	wantCounter(t, hs.reg, 1, mDecisions, "result", "bad_request")
}

// Over the ip limit, a flood of such requests gets the ordinary 429.
func TestBadRequest_IPChargeOverLimit_429(t *testing.T) {
	pol := (&fakePolicies{err: &policy.RequestError{}}).add("per-ip", false, 1)
	lim := newFakeLimiter(false, bucket.Result{Allowed: false, Limit: 10, Reset: 6 * time.Second, RetryAfter: 2 * time.Second})
	hs := newHarness(t, pol, lim, nil, nil)

	res, body := hs.get("/")

	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status = %d, want 429", res.StatusCode)
	}
	if p := decodeProblem(t, res, body); p.Policy != "per-ip" {
		t.Errorf("problem = %+v, want policy per-ip", p)
	}
	wantIPChargesOnly(t, hs, lim, pol)
	wantCounter(t, hs.reg, 0, mDecisions, "result", "bad_request")
}
