package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// releaseHarness serves a Handler in front of up with the real memory store and one policy of
// limit l (charge_on as given, nil: every answer charged).
func releaseHarness(t *testing.T, up *countingUpstream, l bucket.Limit, chargeOn ...string) *harness {
	t.Helper()
	p := &policy.Policy{Name: "p", Limit: l}
	if chargeOn != nil {
		set, err := policy.ParseStatusSet(chargeOn)
		if err != nil {
			t.Fatalf("ParseStatusSet(%q): %v", chargeOn, err)
		}
		p.ChargeOn = set
	}
	pol := &fakePolicies{policies: []*policy.Policy{p}, charges: []bucket.Charge{{Key: testKey(1), Limit: l}}}
	mem := memstore.New(memstore.Options{})
	return newHarness(t, pol, newFakeLimiter(true), up, func(o *Options) {
		o.Limiter = mem
		o.Now = nil // the memory store decides at the real instant, as in production
	})
}

var oneSlot = bucket.Limit{Algorithm: bucket.Concurrency, Count: 1}

// served is get, then waiting until the handler has returned: slots and refunds are given back
// before it returns, but the client may have read the whole answer a moment earlier.
func (hs *harness) served(path string) *http.Response {
	hs.t.Helper()
	res, _ := hs.get(path)
	hs.waitServed(1)
	return res
}

// A slot is held while the upstream works and given back when the answer is complete; a
// request meanwhile gets the concurrency problem with Retry-After: 1.
func TestConcurrency_SlotHeldUntilAnswered(t *testing.T) {
	entered, finish := make(chan struct{}), make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			once.Do(func() { close(entered) })
			<-finish
		}
		_, _ = w.Write([]byte("ok"))
	})
	hs := releaseHarness(t, up, oneSlot)
	slow := make(chan int, 1)
	go func() {
		res, err := hs.client.Get(hs.srv.URL + "/slow")
		if err != nil {
			slow <- 0
			return
		}
		res.Body.Close()
		slow <- res.StatusCode
	}()
	<-entered
	res, body := hs.get("/other")
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second request with the slot taken: status %d, want 429", res.StatusCode)
	}
	wantHeader(t, res, "Retry-After", "1")
	wantHeader(t, res, "X-RateLimit-Limit", "1")
	wantHeader(t, res, "X-RateLimit-Remaining", "0")
	pb := decodeProblem(t, res, body)
	if pb.Type != answer.ProblemConcurrency || pb.Policy != "p" || pb.RetryAfter != 1 {
		t.Errorf("problem = %+v, want type %s, policy p, retry_after_seconds 1", pb, answer.ProblemConcurrency)
	}
	close(finish)
	if code := <-slow; code != http.StatusOK {
		t.Fatalf("slow request: status %d, want 200", code)
	}
	hs.waitServed(2)
	for i := range 3 {
		if res := hs.served("/after"); res.StatusCode != http.StatusOK {
			t.Errorf("sequential request %d after the slow one: status %d, want 200", i, res.StatusCode)
		}
	}
	if got := hs.up.hits.Load(); got != 4 {
		t.Errorf("upstream hits = %d, want 4 (the rejected request never reached it)", got)
	}
}

// Every way a forwarded request can end gives its slot back: an upstream that refuses (502), an
// upstream that fails in the middle of its body (the handler aborts), a client that leaves.
func TestConcurrency_SlotReturnedOnFailures(t *testing.T) {
	t.Run("upstream refused", func(t *testing.T) {
		dead := newUpstream(t, nil)
		dead.Close()
		hs := releaseHarness(t, dead, oneSlot)
		for i := range 3 {
			if res := hs.served("/"); res.StatusCode != http.StatusBadGateway {
				t.Errorf("request %d to a dead upstream: status %d, want 502 (a leaked slot answers 429)", i, res.StatusCode)
			}
		}
	})
	t.Run("aborted body", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/abort" {
				return
			}
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("short"))
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		})
		hs := releaseHarness(t, up, oneSlot)
		res, err := hs.client.Get(hs.srv.URL + "/abort")
		if err == nil {
			res.Body.Close()
		}
		hs.waitServed(1)
		if res, _ := hs.get("/"); res.StatusCode != http.StatusOK {
			t.Errorf("after an aborted answer: status %d, want 200", res.StatusCode)
		}
	})
	t.Run("client leaves", func(t *testing.T) {
		entered := make(chan struct{})
		var once sync.Once
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hang" {
				once.Do(func() { close(entered) })
				<-r.Context().Done()
			}
		})
		hs := releaseHarness(t, up, oneSlot)
		hs.cancelWhenEntered(t, "/hang", entered)
		if res, _ := hs.get("/"); res.StatusCode != http.StatusOK {
			t.Errorf("after the client left: status %d, want 200", res.StatusCode)
		}
	})
}

// charge_on: every request is checked, only listed answers consume the budget.
func TestChargeOn_OnlyListedAnswersCost(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.WriteHeader(code)
	})
	window := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}
	hs := releaseHarness(t, up, window, "401", "5xx")
	steps := []struct{ status, want int }{
		{200, 200}, {200, 200}, {204, 204}, {403, 403}, // free: the budget stays at 2
		{401, 401}, {200, 200}, {503, 503}, // two charged
		{200, 429}, {401, 429}, // exhausted: checked before forwarding
	}
	for i, s := range steps {
		res := hs.served("/login?status=" + strconv.Itoa(s.status))
		if res.StatusCode != s.want {
			t.Errorf("step %d (upstream %d): status %d, want %d", i, s.status, res.StatusCode, s.want)
		}
	}
	if got := hs.up.hits.Load(); got != 7 {
		t.Errorf("upstream hits = %d, want 7", got)
	}
	wantCounter(t, hs.reg, 5, "ratelimit_charges_refunded_total", "policy", "p")
	wantCounter(t, hs.reg, 0, "ratelimit_release_errors_total")
}

// The gateway's own answers count like the upstream's: a 502 of a dead upstream is a 5xx.
func TestChargeOn_GatewayAnswersCount(t *testing.T) {
	dead := newUpstream(t, nil)
	dead.Close()
	window := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}
	hs := releaseHarness(t, dead, window, "5xx")
	for i, want := range []int{502, 502, 429} {
		if res := hs.served("/"); res.StatusCode != want {
			t.Errorf("request %d: status %d, want %d", i, res.StatusCode, want)
		}
	}
}

// A store that cannot give charges back is counted, and the request is still answered.
type failingReleaser struct{ bucket.Store }

func (failingReleaser) Release(context.Context, time.Time, []bucket.Taken) error {
	return &net.OpError{Op: "release", Err: context.DeadlineExceeded}
}

func TestRelease_ErrorCounted(t *testing.T) {
	pol := &fakePolicies{
		policies: []*policy.Policy{{Name: "c", Limit: oneSlot}},
		charges:  []bucket.Charge{{Key: testKey(1), Limit: oneSlot}},
	}
	hs := newHarness(t, pol, newFakeLimiter(true), nil, func(o *Options) {
		o.Limiter = failingReleaser{memstore.New(memstore.Options{})}
	})
	if res := hs.served("/"); res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", res.StatusCode)
	}
	wantCounter(t, hs.reg, 1, "ratelimit_release_errors_total")
	// The slot was not given back: the next request is rejected.
	if res, _ := hs.get("/"); res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("after a failed release: status %d, want 429", res.StatusCode)
	}
}

// A WebSocket holds its slot for its whole life, and its answer is the 101 (which the reverse
// proxy writes to the hijacked connection itself): charge_on [101] charges it.
func TestWebSocket_SlotHeldAndChargedOn101(t *testing.T) {
	up := newUpstream(t, websocket.Handler(func(c *websocket.Conn) {
		_, _ = io.Copy(c, c) // echo
	}).ServeHTTP)
	for _, tc := range []struct {
		name     string
		l        bucket.Limit
		chargeOn []string
	}{
		{"concurrency", oneSlot, nil},
		{"charge_on 101", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}, []string{"101"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := releaseHarness(t, up, tc.l, tc.chargeOn...)
			conn := dialWS(t, hs.srv.URL)
			_ = conn.SetDeadline(time.Now().Add(failAfter))
			if err := websocket.Message.Send(conn, "hello"); err != nil {
				t.Fatalf("send: %v", err)
			}
			var got string
			if err := websocket.Message.Receive(conn, &got); err != nil || got != "hello" {
				t.Fatalf("echo = %q, %v; want hello", got, err)
			}
			// While the socket is open (concurrency), or for good (charge_on 101), the budget
			// of one is spent.
			if res, _ := hs.get("/plain"); res.StatusCode != http.StatusTooManyRequests {
				t.Errorf("request beside the open socket: status %d, want 429", res.StatusCode)
			}
			hs.waitServed(1)
			conn.Close()
			hs.waitServed(1) // the socket's handler returns once both directions closed
			// The upstream answers plain requests 400 (it only speaks WebSocket): forwarded.
			res := hs.served("/plain")
			switch {
			case tc.chargeOn != nil && res.StatusCode != http.StatusTooManyRequests:
				t.Errorf("after the socket closed: status %d, want 429 (the 101 was charged)", res.StatusCode)
			case tc.chargeOn == nil && res.StatusCode != http.StatusBadRequest:
				t.Errorf("after the socket closed: status %d, want the upstream's 400 (the slot is back)", res.StatusCode)
			}
		})
	}
}

// chargeOnHarness is releaseHarness with a fixed window of 1 request an hour, charged on 401,
// and edit applied to the options.
func chargeOnHarness(t *testing.T, up *countingUpstream, edit func(*Options)) *harness {
	t.Helper()
	one := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
	set, err := policy.ParseStatusSet([]string{"401"})
	if err != nil {
		t.Fatal(err)
	}
	pol := &fakePolicies{policies: []*policy.Policy{{Name: "p", Limit: one, ChargeOn: set}},
		charges: []bucket.Charge{{Key: testKey(1), Limit: one, MayGiveBack: true}}}
	return newHarness(t, pol, newFakeLimiter(true), up, func(o *Options) {
		o.Limiter = memstore.New(memstore.Options{})
		o.Now = nil
		if edit != nil {
			edit(o)
		}
	})
}

// A client that hangs up while the upstream works on its request keeps its charge: the upstream
// may have done what charge_on guards (a password check), and a client that could always leave
// before the answer would never pay.
func TestChargeOn_ClientLeavesKeepsCharge(t *testing.T) {
	entered := make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang" {
			once.Do(func() { close(entered) })
			<-r.Context().Done()
		}
	})
	hs := chargeOnHarness(t, up, nil)
	hs.cancelWhenEntered(t, "/hang", entered)
	if res := hs.served("/after"); res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("after a client left while the upstream worked: status %d, want 429 (its charge kept)", res.StatusCode)
	}
	wantCounter(t, hs.reg, 0, "ratelimit_charges_refunded_total", "policy", "p")
	wantCounter(t, hs.reg, 1, "ratelimit_client_canceled_total", "stage", "upstream")
}

// The upstream received the request and did not answer in time: 504, and the charge is kept
// whatever charge_on lists (the upstream may have done the work).
func TestChargeOn_UpstreamTimeoutKeepsCharge(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hang" {
			<-r.Context().Done()
		}
	})
	hs := chargeOnHarness(t, up, func(o *Options) {
		tr := NewTransport(50 * time.Millisecond)
		t.Cleanup(tr.CloseIdleConnections)
		o.Transport = tr
	})
	if res := hs.served("/hang"); res.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("upstream silent: status %d, want 504", res.StatusCode)
	}
	if res := hs.served("/after"); res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("after a 504: status %d, want 429 (its charge kept)", res.StatusCode)
	}
	wantCounter(t, hs.reg, 0, "ratelimit_charges_refunded_total", "policy", "p")
}

// A request that never reached the upstream (nothing listens) is answered 502 by the gateway
// and that answer decides: not listed, so refunded; every attempt gets its 502, not a 429.
func TestChargeOn_UndeliveredDecidedByGatewayAnswer(t *testing.T) {
	dead := newUpstream(t, nil)
	dead.Close()
	hs := chargeOnHarness(t, dead, nil)
	for i := range 3 {
		if res := hs.served("/"); res.StatusCode != http.StatusBadGateway {
			t.Errorf("request %d to a dead upstream: status %d, want 502", i, res.StatusCode)
		}
	}
	wantCounter(t, hs.reg, 3, "ratelimit_charges_refunded_total", "policy", "p")
}

// The upstream answered 200 (not listed) and the client left while the body streamed: the
// upstream did answer, with a status not listed, so the charge is given back.
func TestChargeOn_ClientLeavesDuringBodyOfUnlistedAnswer(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("welcome"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	hs := chargeOnHarness(t, up, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.srv.URL+"/stream", nil)
	res, err := hs.client.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v, %v; want 200", res, err)
	}
	cancel()
	res.Body.Close()
	hs.waitServed(1)
	wantCounter(t, hs.reg, 1, "ratelimit_charges_refunded_total", "policy", "p")
}

// A request held by a leaky bucket whose client leaves before its turn never reached the
// upstream: its charge_on reservation is given back.
func TestChargeOn_LeakyWaitAbandonedRefunded(t *testing.T) {
	entered := make(chan struct{})
	var once sync.Once
	hs := chargeOnHarness(t, nil, func(o *Options) {
		o.Wait = func(ctx context.Context, d time.Duration) error {
			once.Do(func() { close(entered) })
			<-ctx.Done()
			return ctx.Err()
		}
	})
	leaky := bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1.0 / 3600, Burst: 5}
	hs.pol.policies = append(hs.pol.policies, &policy.Policy{Name: "shape", Limit: leaky})
	hs.pol.charges = append(hs.pol.charges, bucket.Charge{Key: testKey(2), Limit: leaky})
	if res := hs.served("/first"); res.StatusCode != http.StatusOK { // no wait: forwarded
		t.Fatalf("first request: status %d, want 200", res.StatusCode)
	}
	hs.cancelWhenEntered(t, "/second", entered)
	if got := hs.up.hits.Load(); got != 1 {
		t.Errorf("upstream hits = %d, want 1", got)
	}
	wantCounter(t, hs.reg, 1, "ratelimit_client_canceled_total", "stage", "wait")
	wantCounter(t, hs.reg, 2, "ratelimit_charges_refunded_total", "policy", "p")
}
