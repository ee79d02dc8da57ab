package e2e

// End-to-end tests of the usage-plan limits that look at the answer or at the requests in
// flight: charge_on (the login example of configs/login.yaml) and concurrency, through the real
// binary over real sockets.

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// loginConfig is configs/login.yaml without its upstream line: startGateway writes its own.
func loginConfig(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../configs/login.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "upstream:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// post sends POST path with the header pairs and returns the status. The body is read to the
// end, so that the next request reuses the connection: the gateway reads it only after it has
// given this one's charges back, which a new connection would race.
func post(t *testing.T, url string, hdr ...string) int {
	t.Helper()
	resp, _ := doMethod(t, http.MethodPost, url, hdr...)
	return resp.StatusCode
}

// TestLoginExample runs configs/login.yaml: successful logins are free, five failed logins of
// one user are answered, the sixth login of that user is refused with 429 before it reaches
// the service (even with the right password), other users go on until the address has failed
// twenty times.
func TestLoginExample(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Password") == "right" {
			fmt.Fprint(w, "welcome")
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	})
	g := startGateway(t, up.URL, loginConfig(t))
	login := func(user, password string) int {
		return post(t, g.proxy+"/login", "X-Login-User", user, "X-Password", password)
	}
	for i := range 10 {
		if got := login("alice", "right"); got != http.StatusOK {
			t.Fatalf("successful login %d of alice: got %d, want 200", i+1, got)
		}
	}
	for i := range 5 {
		if got := login("alice", "wrong"); got != http.StatusUnauthorized {
			t.Fatalf("failed login %d of alice: got %d, want 401 (the ten successes were free)", i+1, got)
		}
	}
	hits := up.hits.Load()
	for _, pw := range []string{"wrong", "right"} {
		if got := login("alice", pw); got != http.StatusTooManyRequests {
			t.Errorf("login of alice (%s password) after five failures: got %d, want 429", pw, got)
		}
	}
	if got := up.hits.Load(); got != hits {
		t.Errorf("upstream hits after the refused logins: got %d, want %d (429s are never forwarded)", got, hits)
	}
	// Another user from the same address is not held by alice's failures, until the address
	// has failed twenty times in all (alice's five count).
	for u := range 3 {
		user := fmt.Sprintf("user%d", u)
		for i := range 5 {
			if got := login(user, "wrong"); got != http.StatusUnauthorized {
				t.Fatalf("failed login %d of %s: got %d, want 401", i+1, user, got)
			}
		}
	}
	if got := login("bob", "right"); got != http.StatusTooManyRequests {
		t.Errorf("login of a fresh user after the address failed twenty times: got %d, want 429", got)
	}
	if got := metric(t, g.admin, `ratelimit_charges_refunded_total{policy="login-failures-per-user"}`); got != 10 {
		t.Errorf("refunded per-user charges: got %v, want 10", got)
	}
}

// TestConcurrencyLimitAtUpstream: twelve requests at once against a limit of three in flight;
// the upstream, which holds every request until told to answer, sees exactly three at a time,
// the others are refused with 429 and Retry-After: 1, and the slots come back afterwards.
func TestConcurrencyLimitAtUpstream(t *testing.T) {
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if r.URL.Path == "/hold" {
			<-release
		}
	})
	g := startGateway(t, up.URL, `headers: {ietf_draft: true}
policies:
  - name: in-flight
    key: global
    algorithm: concurrency
    limit: 3
`)
	const n = 12
	type answer struct {
		code             int
		retryAfter, ietf string
	}
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, err := http.Get(g.proxy + "/hold")
			if err != nil {
				answers <- answer{}
				return
			}
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit-Policy")}
		})
	}
	// The refused ones answer while the admitted ones are held at the upstream.
	for i := range n - 3 {
		a := <-answers
		if a.code != http.StatusTooManyRequests || a.retryAfter != "1" || a.ietf != `"in-flight";q=3;qu="concurrent-requests"` {
			t.Errorf("refused answer %d: got %+v, want 429 with Retry-After 1 and the concurrent-requests policy", i, a)
		}
	}
	eventually(t, "three requests held at the upstream", func() bool { return inFlight.Load() == 3 })
	close(release)
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.code != http.StatusOK {
			t.Errorf("admitted answer: got %d, want 200", a.code)
		}
	}
	if p := peak.Load(); p != 3 {
		t.Errorf("peak in flight at the upstream: got %d, want 3", p)
	}
	// Every slot comes back: three at once pass again. (The held requests' slots are given back
	// just before their handlers return, a moment after their clients read the last byte, so
	// this polls.)
	eventually(t, "three concurrent requests admitted again", func() bool {
		return allOK(g.proxy+"/quick", g.proxy+"/quick", g.proxy+"/quick")
	})
}

// getAll sends a GET to every URL at once and returns the statuses (0 for a transport error),
// in the order they came.
func getAll(urls ...string) []int {
	var wg sync.WaitGroup
	codes := make(chan int, len(urls))
	for _, u := range urls {
		wg.Go(func() {
			resp, err := http.Get(u)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	var out []int
	for c := range codes {
		out = append(out, c)
	}
	return out
}

// allOK sends a GET to every URL at once and reports whether every answer was 200.
func allOK(urls ...string) bool {
	for _, c := range getAll(urls...) {
		if c != http.StatusOK {
			return false
		}
	}
	return true
}
