package e2e

// The usage-plan limits on DynamoDB Local, across several gateway processes sharing one table:
// concurrency slots counted at the upstream, and the login example's refunds.

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// TestDynamoConcurrencyAcrossReplicas: three gateways share a limit of three requests in flight.
// Fifteen requests at once, spread over them, while the upstream holds every request it gets:
// the upstream sees exactly three, never more, the twelve others are refused with 429, and the
// slots come back when the held requests end.
func TestDynamoConcurrencyAcrossReplicas(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-conc-" + randomSuffix()
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
	cfg := dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + `policies:
  - name: in-flight
    key: global
    algorithm: concurrency
    limit: 3
`
	var gws []*gateway
	for range 3 {
		gws = append(gws, startGateway(t, up.URL, cfg, awsEnv()...))
	}
	const n = 15
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		gw := gws[i%len(gws)]
		wg.Go(func() {
			resp, err := http.Get(gw.proxy + "/hold")
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	for i := range n - 3 {
		if c := <-codes; c != http.StatusTooManyRequests {
			t.Errorf("answer %d while three are held: got %d, want 429", i, c)
		}
	}
	eventually(t, "three requests held at the upstream", func() bool { return inFlight.Load() == 3 })
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("held request: got %d, want 200", c)
		}
	}
	if p := peak.Load(); p != 3 {
		t.Errorf("peak in flight at the upstream across three replicas: got %d, want 3", p)
	}
	// The slots come back: three at once pass again, one per replica.
	eventually(t, "three concurrent requests admitted again", func() bool {
		var urls []string
		for _, gw := range gws {
			urls = append(urls, gw.proxy+"/quick")
		}
		return allOK(urls...)
	})
}

// TestDynamoLoginExampleAcrossReplicas runs configs/login.yaml on two gateways sharing a table,
// alternating between them: successful logins are free, the fifth failure is the last one
// answered, on either replica.
func TestDynamoLoginExampleAcrossReplicas(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-login-" + randomSuffix()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Password") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	cfg := dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + loginConfig(t)
	gws := []*gateway{startGateway(t, up.URL, cfg, awsEnv()...), startGateway(t, up.URL, cfg, awsEnv()...)}
	user := "alice-" + randomSuffix()
	i := 0
	login := func(password string) int {
		i++
		return post(t, gws[i%2].proxy+"/login", "X-Login-User", user, "X-Password", password)
	}
	for k := range 6 {
		if got := login("right"); got != http.StatusOK {
			t.Fatalf("successful login %d: got %d, want 200", k+1, got)
		}
	}
	for k := range 5 {
		if got := login("wrong"); got != http.StatusUnauthorized {
			t.Fatalf("failed login %d: got %d, want 401 (the successes were free)", k+1, got)
		}
	}
	for k, pw := range []string{"right", "wrong"} {
		if got := login(pw); got != http.StatusTooManyRequests {
			t.Errorf("login %d after five failures (%s password, replica %d): got %d, want 429", k+1, pw, i%2, got)
		}
	}
	if got := up.hits.Load(); got != 11 {
		t.Errorf("upstream hits: got %d, want 11", got)
	}
}
