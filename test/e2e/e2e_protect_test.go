package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// blockingUpstream answers /slow only when release is closed or the request ends; entered
// receives once per /slow request that arrived.
func blockingUpstream(t *testing.T) (u *upstream, entered chan struct{}, release func()) {
	t.Helper()
	entered = make(chan struct{}, 16)
	done := make(chan struct{})
	var once sync.Once
	u = newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			select {
			case <-done:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	})
	release = func() { once.Do(func() { close(done) }) }
	t.Cleanup(release)
	return u, entered, release
}

// slowInBackground sends GET /slow with ctx and waits until the upstream has it; the channel
// gets the status (0 on a client error).
func slowInBackground(t *testing.T, ctx context.Context, url string, entered chan struct{}) chan int {
	t.Helper()
	out := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/slow", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- 0
			return
		}
		res.Body.Close()
		out <- res.StatusCode
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream did not get /slow within 10s")
	}
	return out
}

const protectPolicy = `policies:
  - {name: lenient, key: ip, algorithm: token_bucket, rate: 1000/s, burst: 1000}
`

// TestProtectShedsWithProblemAndPriorities: the upstream's limit is 2 with half reserved for
// critical requests and no queue. With one default request in flight, a default request is shed
// (503, Retry-After, problem+json overloaded), a sheddable one too, and a critical one passes;
// the shed counts are per priority.
func TestProtectShedsWithProblemAndPriorities(t *testing.T) {
	up, entered, release := blockingUpstream(t)
	// The test client is the trusted proxy that sets X-Priority (a priority header is believed
	// only from trusted_proxies: see e2e_protect_hostile_test.go).
	g := startGateway(t, up.URL, `trusted_proxies: [127.0.0.1/32]
protect:
  concurrency: {adaptive: false, limit: 2}
  priorities:
    - name: critical
      match: {headers: {X-Priority: critical}}
      reserve: 0.5
    - name: sheddable
      match: {path_prefix: /batch}
`+protectPolicy)
	slow := slowInBackground(t, context.Background(), g.proxy, entered)

	res, body := get(t, g.proxy+"/x")
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("default request with the default share in use: got %d, want 503", res.StatusCode)
	}
	if got := res.Header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	if got := res.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type %q, want application/problem+json", got)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Type != "https://ratelimit-proxy.dev/problems/overloaded" || p.Status != 503 {
		t.Errorf("body %s (%v): want type .../problems/overloaded, status 503", body, err)
	}
	if res, _ := get(t, g.proxy+"/batch/job"); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("sheddable request: got %d, want 503", res.StatusCode)
	}
	if res, _ := get(t, g.proxy+"/x", "X-Priority", "critical"); res.StatusCode != http.StatusOK {
		t.Errorf("critical request with its reserve free: got %d, want 200", res.StatusCode)
	}
	for class, want := range map[string]float64{"default": 1, "sheddable": 1, "critical": 0} {
		if got := metric(t, g.admin, `ratelimit_upstream_shed_total{priority="`+class+`"}`); got != want {
			t.Errorf("shed_total{priority=%q} = %v, want %v", class, got, want)
		}
	}
	if got := metric(t, g.admin, "ratelimit_upstream_concurrency_limit"); got != 2 {
		t.Errorf("concurrency_limit gauge %v, want 2", got)
	}
	if got := metric(t, g.admin, "ratelimit_upstream_inflight"); got != 1 {
		t.Errorf("inflight gauge %v, want 1 (the slow request)", got)
	}
	release()
	if got := <-slow; got != http.StatusOK {
		t.Errorf("slow request: got %d, want 200", got)
	}
	eventually(t, "inflight back to 0", func() bool { return metric(t, g.admin, "ratelimit_upstream_inflight") == 0 })
}

// TestProtectSlotReleasedOnClientHangup: a client that hangs up while the upstream works gives
// its slot back; status 429 is answered when configured.
func TestProtectSlotReleasedOnClientHangup(t *testing.T) {
	up, entered, _ := blockingUpstream(t)
	g := startGateway(t, up.URL, "protect: {concurrency: {adaptive: false, limit: 1}, status: 429}\n"+protectPolicy)
	ctx, cancel := context.WithCancel(context.Background())
	slow := slowInBackground(t, ctx, g.proxy, entered)
	if res, _ := get(t, g.proxy+"/x"); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("with the one slot taken: got %d, want 429 (status: 429)", res.StatusCode)
	}
	cancel()
	<-slow
	eventually(t, "the hung-up request's slot back", func() bool { return metric(t, g.admin, "ratelimit_upstream_inflight") == 0 })
	if res, _ := get(t, g.proxy+"/x"); res.StatusCode != http.StatusOK {
		t.Errorf("after the hang-up: got %d, want 200", res.StatusCode)
	}
}

// TestProtectGRPCStatusAndStreams: a gRPC stream holds the one slot for as long as it is open; a
// call meanwhile gets UNAVAILABLE (status 503) or RESOURCE_EXHAUSTED (429) with a RetryInfo of
// 1s; once the stream ends its slot is back.
func TestProtectGRPCStatusAndStreams(t *testing.T) {
	for _, c := range []struct {
		status string
		code   codes.Code
	}{{"503", codes.Unavailable}, {"429", codes.ResourceExhausted}} {
		t.Run(c.status, func(t *testing.T) {
			up := newGRPCUpstream(t)
			g := startGateway(t, "http://"+up.addr, "upstream_protocol: h2c\nprotect: {concurrency: {adaptive: false, limit: 1}, status: "+c.status+"}\n"+protectPolicy)
			client := grpcClient(t, g)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: "silent"})
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the stream holds the slot", func() bool { return metric(t, g.admin, "ratelimit_upstream_inflight") == 1 })

			_, err = client.Check(callCtx(t), &healthpb.HealthCheckRequest{})
			st, _ := status.FromError(err)
			if st.Code() != c.code {
				t.Fatalf("call during the stream: got %v, want %v", err, c.code)
			}
			var retry *errdetails.RetryInfo
			for _, d := range st.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					retry = ri
				}
			}
			if retry == nil || retry.GetRetryDelay().AsDuration() != time.Second {
				t.Errorf("details %v: want a RetryInfo of 1s", st.Details())
			}

			cancel() // the client ends the stream
			_, _ = stream.Recv()
			eventually(t, "the stream's slot back", func() bool { return metric(t, g.admin, "ratelimit_upstream_inflight") == 0 })
			if _, err := client.Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("call after the stream: %v, want OK", err)
			}
		})
	}
}
