package fallback

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// heldCall is one call to a heldPrimary, waiting for the test to answer it.
type heldCall struct{ answer chan error }

// heldPrimary hands every call to the test and returns what the test answers, so that the
// test decides the order in which concurrent calls finish.
type heldPrimary struct{ calls chan heldCall }

func (p *heldPrimary) Take(ctx context.Context, _ time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	c := heldCall{answer: make(chan error)}
	p.calls <- c
	if err := <-c.answer; err != nil {
		return false, err
	}
	for i := range charges {
		results[i] = bucket.Result{Allowed: true}
	}
	return true, nil
}

// TestStaleSuccessDuringProbeKeepsBackoff: a call that started while the circuit was closed
// succeeds while a probe is in flight (store.timeout above MinBackoff, or a Healthy error),
// closing the circuit and resetting the backoff to 0. The probe then fails: that re-opens the
// circuit, which must start from MinBackoff and be reported to OnStateChange. (The breaker used
// to double the backoff of 0 and leave the re-opening unreported: an open circuit with no
// backoff, probing a failing store on every decision.)
func TestStaleSuccessDuringProbeKeepsBackoff(t *testing.T) {
	clk := &clock{now: t0}
	p := &heldPrimary{calls: make(chan heldCall)}
	var (
		mu      sync.Mutex
		changes []bool
	)
	s, err := New(p, Options{
		OnError:    bucket.Allow,
		MinBackoff: time.Second,
		MaxBackoff: 8 * time.Second,
		Now:        clk.Now,
		Registerer: prometheus.NewRegistry(),
		OnStateChange: func(healthy bool, _ error) {
			mu.Lock()
			changes = append(changes, healthy)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// start begins a decision in its own goroutine; the returned channel closes when Take has
	// returned (and so has recorded its outcome).
	start := func() <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			r := make([]bucket.Result, 1)
			_, _ = s.Take(context.Background(), clk.Now(), oneCharge, r)
		}()
		return done
	}

	slowDone := start() // slow: started while closed
	slow := <-p.calls
	failDone := start() // fails: opens the circuit
	(<-p.calls).answer <- errDown
	<-failDone
	if s.Healthy() {
		t.Fatal("a failed call left the circuit closed")
	}

	clk.advance(time.Second)
	probeDone := start() // the probe
	probe := <-p.calls
	slow.answer <- nil // the stale success closes the circuit
	<-slowDone
	if !s.Healthy() {
		t.Fatal("the stale success did not close the circuit (the scenario needs it to)")
	}
	probe.answer <- errDown // the probe fails: the circuit opens again
	<-probeDone
	if s.Healthy() {
		t.Fatal("the failed probe left the circuit closed")
	}

	// At the same instant the circuit must not be probed again: after any failure the backoff
	// is at least MinBackoff.
	s.mu.Lock()
	backoff, wait := s.backoff, s.until.Sub(clk.Now())
	s.mu.Unlock()
	if call, _ := s.acquire(); call || backoff < time.Second {
		t.Errorf("after a failed probe: next decision calls the store %v, backoff %v, open for %v; want no call, backoff >= %v", call, backoff, wait, time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) == 0 || changes[len(changes)-1] {
		t.Errorf("got OnStateChange calls %v (true = closed): the last reported state is closed while the circuit is open", changes)
	}
}
