package e2e

// End-to-end test of charge_on: a charge is given back only for an answer the upstream sent with
// a status not listed, through the real binary over real sockets.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestChargeOnOnlyUpstreamAnswersRefund guards a login endpoint with charge_on [401, 403] and a
// budget of 3, as an attacker would try it: a client that hangs up while the upstream works
// (after it has hashed the password, counted the lockout, sent the SMS) must keep its charge,
// and so must a request the upstream never answered in time (504). Only an answer the upstream
// sent with a status not listed is free, even when the client leaves while its body streams.
func TestChargeOnOnlyUpstreamAnswersRefund(t *testing.T) {
	arrived := make(chan struct{}, 100)
	var hangs atomic.Int64
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		// Read as a login handler does; then net/http notices a closed connection (and ends
		// r.Context()) while the handler works.
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/login/ok":
			w.WriteHeader(http.StatusOK)
		case "/login/fail":
			w.WriteHeader(http.StatusUnauthorized)
		case "/login/stream-ok": // a 200 whose body never ends
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("welcome"))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/login/hang": // does the work, then never answers
			hangs.Add(1)
			arrived <- struct{}{}
			<-r.Context().Done()
		}
	})
	g := startGateway(t, up.URL, `upstream_timeout: 1s
policies:
  - name: login-failures
    key: ip
    algorithm: sliding_window
    limit: 3
    window: 15m
    charge_on: [401, 403]
    match: {methods: [POST], path_prefix: /login}
`)
	post := func(ctx context.Context, path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.proxy+path, strings.NewReader("user=alice&password=guess"))
		if err != nil {
			t.Fatal(err)
		}
		return http.DefaultClient.Do(req)
	}
	status := func(path string) int {
		t.Helper()
		res, err := post(context.Background(), path)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	refunds := func() float64 {
		return metric(t, g.admin, `ratelimit_charges_refunded_total{policy="login-failures"}`)
	}

	// Successful logins are free.
	for i := range 5 {
		if got := status("/login/ok"); got != http.StatusOK {
			t.Fatalf("successful login %d: status %d, want 200", i, got)
		}
	}
	eventually(t, "5 refunds", func() bool { return refunds() == 5 })

	// The upstream answered 200 and the client left while the body streamed: the upstream did
	// answer, with a status not listed, so it is refunded.
	ctx, cancel := context.WithCancel(context.Background())
	res, err := post(ctx, "/login/stream-ok")
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("streamed login: %v, %v; want 200", res, err)
	}
	cancel()
	res.Body.Close()
	eventually(t, "the streamed 200 refunded", func() bool { return refunds() == 6 })

	// The upstream took the request and never answered: 504, charged (1 of 3).
	if got := status("/login/hang"); got != http.StatusGatewayTimeout {
		t.Fatalf("login the upstream never answers: status %d, want 504", got)
	}
	<-arrived // its arrival

	// 20 attempts, each abandoned by its client once the upstream has it.
	var limited int
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			res *http.Response
			err error
		}
		done := make(chan result, 1)
		go func() {
			res, err := post(ctx, "/login/hang")
			done <- result{res, err}
		}()
		select {
		case <-arrived:
			cancel()
			if r := <-done; !errors.Is(r.err, context.Canceled) {
				t.Fatalf("attempt %d: got %v, %v; want the client's cancellation", i, r.res, r.err)
			}
		case r := <-done:
			if r.err != nil || r.res.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("attempt %d: got %v, %v; want 429 or the upstream reached", i, r.res, r.err)
			}
			r.res.Body.Close()
			limited++
		}
		cancel()
	}
	// The 504 and two abandoned attempts spent the budget of 3.
	if got := hangs.Load(); got != 3 {
		t.Errorf("logins that reached the upstream: %d, want 3 (a budget of 3 failures)", got)
	}
	if limited != 18 {
		t.Errorf("attempts answered 429: %d, want 18", limited)
	}
	if got := status("/login/ok"); got != http.StatusTooManyRequests {
		t.Errorf("login after the budget was spent: status %d, want 429", got)
	}
	if got := refunds(); got != 6 {
		t.Errorf("refunds got %v, want 6 (only the upstream's 200s)", got)
	}
}
