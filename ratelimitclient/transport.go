package ratelimitclient

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"
)

// Defaults for the zero fields of Options.
const (
	DefaultMaxAttempts = 3
	DefaultBaseDelay   = time.Second
	DefaultMaxJitter   = 20 * time.Second
	DefaultMaxWait     = 2 * time.Minute
)

// drainLimit bounds how much of a discarded body is read to reuse its connection; a longer body
// is closed unread, which costs the connection but not the time to read it.
const drainLimit = 64 << 10

// Options configure a Transport. Every field is optional; the zero value of each is documented.
type Options struct {
	// Base sends every attempt. nil means http.DefaultTransport.
	Base http.RoundTripper

	// MaxAttempts is the most attempts per request, the first included: 1 never retries.
	// 0 means DefaultMaxAttempts (3). Negative is an error.
	MaxAttempts int

	// BaseDelay is the jitter window before the first retry; it doubles for every further retry,
	// up to MaxJitter. 0 means DefaultBaseDelay (1s). Negative is an error.
	BaseDelay time.Duration

	// MaxJitter caps the jitter window. 0 means DefaultMaxJitter (20s). Negative is an error.
	MaxJitter time.Duration

	// MaxWait is the longest wait before one retry (the server's floor plus jitter). A response
	// whose floor alone is longer is returned at once; a longer floor plus jitter is cut to
	// MaxWait. 0 means DefaultMaxWait (2 minutes); negative means no limit but the context.
	MaxWait time.Duration

	// RetryNonIdempotent also retries requests that are neither idempotent by method nor carry
	// an Idempotency-Key (POST, PATCH, ...), as long as their body is replayable. Safe in front
	// of ratelimit-proxy, whose 429 means the service never saw the request; a 503 from another
	// server may come after it acted. false (the zero value) retries only idempotent requests.
	RetryNonIdempotent bool

	// Now reads the clock: the HTTP date in Retry-After and the context's deadline are compared
	// with it. nil means time.Now.
	Now func() time.Time

	// Sleep waits d or until ctx ends, whichever is first, and returns a non-nil error (wrapping
	// ctx's) only when ctx ended. nil means a timer.
	Sleep func(ctx context.Context, d time.Duration) error

	// Rand returns a uniform random number in [0, n) for n > 0. It must be safe for concurrent
	// use. nil means math/rand/v2's Int64N.
	Rand func(n int64) int64
}

// Transport is an http.RoundTripper that retries requests answered with 429 or 503 after the
// wait the package documentation describes. The zero Transport uses the defaults of Options. It
// is safe for concurrent use when the functions in its Options are.
type Transport struct {
	o Options
}

var _ http.RoundTripper = (*Transport)(nil)

// New returns a Transport with options o, or an error naming the first invalid field.
func New(o Options) (*Transport, error) {
	switch {
	case o.MaxAttempts < 0:
		return nil, fmt.Errorf("ratelimitclient: Options.MaxAttempts: %d: must not be negative", o.MaxAttempts)
	case o.BaseDelay < 0:
		return nil, fmt.Errorf("ratelimitclient: Options.BaseDelay: %q: must not be negative", o.BaseDelay)
	case o.MaxJitter < 0:
		return nil, fmt.Errorf("ratelimitclient: Options.MaxJitter: %q: must not be negative", o.MaxJitter)
	}
	return &Transport{o: o}, nil
}

func (t *Transport) base() http.RoundTripper {
	if t.o.Base != nil {
		return t.o.Base
	}
	return http.DefaultTransport
}

func (t *Transport) maxAttempts() int {
	if t.o.MaxAttempts > 0 {
		return t.o.MaxAttempts
	}
	if t.o.MaxAttempts < 0 { // only a Transport built without New
		return 1
	}
	return DefaultMaxAttempts
}

func (t *Transport) now() time.Time {
	if t.o.Now != nil {
		return t.o.Now()
	}
	return time.Now()
}

func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if t.o.Sleep != nil {
		return t.o.Sleep(ctx, d)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// jitter draws the random part of the wait before retry number n (1 for the second attempt).
func (t *Transport) jitter(n int) time.Duration {
	base, limit := t.o.BaseDelay, t.o.MaxJitter
	if base <= 0 {
		base = DefaultBaseDelay
	}
	if limit <= 0 {
		limit = DefaultMaxJitter
	}
	window := base
	for i := 1; i < n && window < limit; i++ {
		window *= 2 // stops at limit or above, long before it could overflow
	}
	window = min(window, limit)
	if t.o.Rand != nil {
		return time.Duration(t.o.Rand(int64(window)))
	}
	return time.Duration(rand.Int64N(int64(window)))
}

func (t *Transport) maxWait() time.Duration {
	switch {
	case t.o.MaxWait < 0:
		return -1
	case t.o.MaxWait == 0:
		return DefaultMaxWait
	}
	return t.o.MaxWait
}

// RoundTrip sends req, and sends it again while the answer is 429 or 503, the request may be
// retried, attempts are left and the wait fits before MaxWait and the context's deadline. It
// returns the last response, or an error from Base, from req.GetBody, or wrapping the context's
// error when the context ended during a wait.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	retryable := t.retryable(req)
	ctx := req.Context()
	attempts := t.maxAttempts()
	for n := 1; ; n++ {
		r := req
		if n > 1 {
			var err error
			if r, err = replay(req); err != nil {
				return nil, err
			}
		}
		resp, err := t.base().RoundTrip(r)
		if err != nil || !retryable || n >= attempts || !retryStatus(resp.StatusCode) {
			return resp, err
		}
		now := t.now()
		floor, _ := RetryDelay(resp.Header, now)
		wait := floor + t.jitter(n)
		if wait < floor { // floor near the largest Duration
			wait = floor
		}
		if limit := t.maxWait(); limit >= 0 {
			if floor > limit {
				return resp, nil
			}
			wait = min(wait, limit)
		}
		if deadline, ok := ctx.Deadline(); ok && !now.Add(wait).Before(deadline) {
			// The retry could not be sent before the deadline: the caller gets the answer
			// now rather than an error later.
			return resp, nil
		}
		discard(resp.Body)
		if err := t.sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("ratelimitclient: waiting %v to retry %s %s (attempt %d of %d): %w",
				wait, req.Method, req.URL.Redacted(), n+1, attempts, err)
		}
	}
}

// CloseIdleConnections closes the idle connections of Base, when it has any (as
// *http.Transport does), so that http.Client.CloseIdleConnections reaches through the wrapper.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// retryStatus reports whether a status asks the client to come back later.
func retryStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
}

// retryable reports whether req may be sent again: idempotent (by method or by an
// Idempotency-Key, as net/http decides it may replay a request), or any method when the options
// say so; and in both cases with a body that can be produced again.
func (t *Transport) retryable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	if t.o.RetryNonIdempotent {
		return true
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace,
		http.MethodPut, http.MethodDelete:
		return true
	}
	_, key := req.Header["Idempotency-Key"]
	_, xkey := req.Header["X-Idempotency-Key"]
	return key || xkey
}

// replay is a copy of req for another attempt, with a fresh body.
func replay(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("ratelimitclient: replay body of %s %s: %w", req.Method, req.URL.Redacted(), err)
		}
		r.Body = body
	}
	return r, nil
}

// discard drains a bounded part of a body we will not return, so its connection can be reused,
// and closes it.
func discard(body io.ReadCloser) {
	if body == nil { // a Base that breaks the RoundTripper contract
		return
	}
	_, _ = io.CopyN(io.Discard, body, drainLimit)
	_ = body.Close()
}
