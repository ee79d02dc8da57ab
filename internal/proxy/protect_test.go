package proxy

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/protect"
)

// protectHarness is a handler with the memory store, the given charges' policies, and an upstream
// protection of a fixed limit of one slot, no queue. /slow blocks in the upstream until release
// is closed (or the request's context ends); entered is closed when it arrives.
func protectHarness(t *testing.T, limits ...bucket.Limit) (hs *harness, l *protect.Limiter, entered, release chan struct{}) {
	t.Helper()
	entered, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			once.Do(func() { close(entered) })
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	})
	pol := &fakePolicies{}
	for i, lim := range limits {
		pol.policies = append(pol.policies, &policy.Policy{Name: "p" + string(rune('a'+i)), Index: i, Limit: lim})
		pol.charges = append(pol.charges, bucket.Charge{Key: testKey(byte(10 * (i + 1))), Limit: lim})
	}
	l, err := protect.New(protect.Options{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New(memstore.Options{})
	hs = newHarness(t, pol, newFakeLimiter(true), up, func(o *Options) {
		o.Limiter = mem
		o.Now = nil
		o.Protect = &Protection{Slots: l}
	})
	return hs, l, entered, release
}

// holdSlow sends /slow in the background and waits until the upstream has it; the returned
// channel gets its status.
func holdSlow(hs *harness, entered chan struct{}) chan int {
	status := make(chan int, 1)
	go func() {
		res, err := hs.client.Get(hs.srv.URL + "/slow")
		if err != nil {
			status <- 0
			return
		}
		res.Body.Close()
		status <- res.StatusCode
	}()
	<-entered
	return status
}

// A request shed for the upstream's sake answers 503 problem+json overloaded with Retry-After,
// and gives back exactly what the policies charged it: a token bucket's token and a concurrency
// slot, once.
func TestProtect_ShedAnswersAndGivesBackCharges(t *testing.T) {
	tb := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600, Burst: 2}
	conc := bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}
	hs, _, entered, release := protectHarness(t, tb, conc)
	slow := holdSlow(hs, entered) // one token and one concurrency slot

	res, body := hs.get("/shed")
	hs.waitServed(1)
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("got %d, want 503 while the upstream's one slot is taken", res.StatusCode)
	}
	p := decodeProblem(t, res, body)
	if p.Type != "https://ratelimit-proxy.dev/problems/overloaded" {
		t.Errorf("got problem type %q, want .../problems/overloaded", p.Type)
	}
	wantHeader(t, res, "Retry-After", "1")
	if hs.up.hits.Load() != 1 {
		t.Errorf("upstream saw %d requests, want 1: the shed one must not reach it", hs.up.hits.Load())
	}

	close(release)
	if got := <-slow; got != http.StatusOK {
		t.Fatalf("slow request: got %d, want 200", got)
	}
	hs.waitServed(1)
	// The shed request's token came back: one is left of the burst of 2. (Without the
	// give-back this is 429.)
	if res, _ := hs.get("/a"); res.StatusCode != http.StatusOK {
		t.Fatalf("after the shed: got %d, want 200 from the token given back", res.StatusCode)
	}
	hs.waitServed(1)
	// And it came back once: nothing is left now.
	if res, _ := hs.get("/b"); res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("got %d, want 429: the give-back must not refund more than was taken", res.StatusCode)
	}
}

// The slot is given back when the client hangs up while the upstream works.
func TestProtect_SlotReleasedOnClientHangup(t *testing.T) {
	hs, l, entered, _ := protectHarness(t)
	hs.cancelWhenEntered(t, "/slow", entered)
	if got := l.Inflight(); got != 0 {
		t.Fatalf("got %d slots in flight after the client left, want 0", got)
	}
	if res, _ := hs.get("/next"); res.StatusCode != http.StatusOK {
		t.Errorf("next request: got %d, want 200", res.StatusCode)
	}
}

// A stream holds its slot until its last byte: a request meanwhile is shed, one after it is not.
// With an adaptive limit (pinned at 1) the forward goes through the timing writer, whose flushes
// must reach the client.
func TestProtect_StreamHoldsSlotUntilItEnds(t *testing.T) {
	for _, adaptive := range []bool{false, true} {
		t.Run(map[bool]string{false: "fixed", true: "adaptive"}[adaptive], func(t *testing.T) { testStreamHoldsSlot(t, adaptive) })
	}
}

func testStreamHoldsSlot(t *testing.T, adaptive bool) {
	headersSent, finish := make(chan struct{}), make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("first\n"))
			http.NewResponseController(w).Flush()
			close(headersSent)
			<-finish
			_, _ = w.Write([]byte("last\n"))
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	l, err := protect.New(protect.Options{Limit: 1, Adaptive: adaptive, MinLimit: 1, MaxLimit: 1})
	if err != nil {
		t.Fatal(err)
	}
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, func(o *Options) {
		o.Protect = &Protection{Slots: l, Status: http.StatusTooManyRequests}
	})
	streamRes, err := hs.client.Get(hs.srv.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer streamRes.Body.Close()
	<-headersSent
	// The first line arrives before the stream ends: the flush went through.
	first := make([]byte, len("first\n"))
	if _, err := io.ReadFull(streamRes.Body, first); err != nil || string(first) != "first\n" {
		t.Fatalf("got %q, %v before the stream ended, want the flushed first line", first, err)
	}
	res, body := hs.get("/during")
	if res.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("during the stream: got %d, want 429 (status: 429)", res.StatusCode)
	}
	if p := decodeProblem(t, res, body); p.Type != answer.ProblemOverloaded {
		t.Errorf("got type %q, want %q", p.Type, answer.ProblemOverloaded)
	}
	close(finish)
	buf := make([]byte, 64)
	for {
		if _, err := streamRes.Body.Read(buf); err != nil {
			break
		}
	}
	hs.waitServed(2)
	if res, _ := hs.get("/after"); res.StatusCode != http.StatusOK {
		t.Errorf("after the stream: got %d, want 200", res.StatusCode)
	}
}

// A request that waits in the queue gets the slot freed within queue_timeout.
func TestProtect_QueuedRequestGetsFreedSlot(t *testing.T) {
	up := newUpstream(t, nil)
	l, err := protect.New(protect.Options{Limit: 1, QueueTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	hs := newHarness(t, &fakePolicies{}, newFakeLimiter(true), up, func(o *Options) {
		o.Protect = &Protection{Slots: l}
	})
	if !l.TryAcquire(protect.Critical) { // a slot held elsewhere
		t.Fatal("no slot")
	}
	done := make(chan int, 1)
	go func() {
		res, err := hs.client.Get(hs.srv.URL + "/queued")
		if err != nil {
			done <- 0
			return
		}
		res.Body.Close()
		done <- res.StatusCode
	}()
	deadline := time.Now().Add(5 * time.Second)
	for hs.up.hits.Load() == 0 && time.Now().Before(deadline) {
		l.Release(protect.Critical, time.Now(), 0, false) // frees the held slot as soon as the request waits
		if !l.TryAcquire(protect.Critical) {
			break // the waiter took it: stop re-taking
		}
		time.Sleep(time.Millisecond)
	}
	if got := <-done; got != http.StatusOK {
		t.Fatalf("queued request: got %d, want 200", got)
	}
}
