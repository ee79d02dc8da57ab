package fallback

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

var t0 = time.Unix(1_700_000_000, 0)

var errDown = errors.New("store: connection refused")

// fakeStore is a primary whose answer the test sets; it counts the calls that reach it.
type fakeStore struct {
	mu      sync.Mutex
	err     error
	calls   int
	charges []bucket.Charge // of the last call
	block   chan struct{}   // when set, Take waits for it to close (or ctx to end)
	entered chan struct{}   // when set, receives once per call before blocking
	// needs, when set, makes a slow store: a call whose ctx leaves it less than this much time
	// runs into its deadline; one with enough time answers at once.
	needs time.Duration
}

func (f *fakeStore) Take(ctx context.Context, _ time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	f.mu.Lock()
	f.calls++
	f.charges = append([]bucket.Charge(nil), charges...)
	block, entered, needs := f.block, f.entered, f.needs
	f.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if d, ok := ctx.Deadline(); ok && needs > 0 && time.Until(d) < needs {
		<-ctx.Done()
		return false, ctx.Err()
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	f.mu.Lock()
	err := f.err // read after the block, so a test can change the answer of a waiting call
	f.mu.Unlock()
	if err != nil {
		return false, err
	}
	for i := range charges {
		results[i] = bucket.Result{Allowed: true, Limit: 42}
	}
	return true, nil
}

func (f *fakeStore) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakeStore) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// clock is the breaker's injected clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	primary *fakeStore
	clock   *clock
	store   *Store
	reg     *prometheus.Registry
}

func newFixture(t *testing.T, o Options) *fixture {
	t.Helper()
	f := &fixture{primary: &fakeStore{}, clock: &clock{now: t0}, reg: prometheus.NewRegistry()}
	o.Now = f.clock.Now
	o.Registerer = f.reg
	s, err := New(f.primary, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.store = s
	return f
}

var oneCharge = []bucket.Charge{{Key: bucket.Key{1}, Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}}}

// take makes one decision and checks whether it reached the primary.
func (f *fixture) take(t *testing.T, wantCall bool) (bool, error) {
	t.Helper()
	before := f.primary.count()
	r := make([]bucket.Result, len(oneCharge))
	ok, err := f.store.Take(context.Background(), f.clock.Now(), oneCharge, r)
	if called := f.primary.count() > before; called != wantCall {
		t.Fatalf("at +%v: primary called %v, want %v", f.clock.Now().Sub(t0), called, wantCall)
	}
	return ok, err
}

func gauge(t *testing.T, g prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(g)
}

func TestBreakerOpensSkipsProbesAndCloses(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Deny})
	if _, err := f.take(t, true); err != nil {
		t.Fatalf("healthy store: got error %v", err)
	}

	f.primary.set(errDown)
	if _, err := f.take(t, true); !errors.Is(err, errDown) {
		t.Fatalf("first failure: got %v, want the store's error", err)
	}
	if f.store.Healthy() {
		t.Error("after a failure: Healthy got true, want false")
	}
	if got := gauge(t, f.store.m.healthy); got != 0 {
		t.Errorf("ratelimit_store_healthy got %v, want 0", got)
	}

	// During the backoff the primary is not called and the error comes at once.
	for _, d := range []time.Duration{0, 100 * time.Millisecond, 149 * time.Millisecond} {
		f.clock.advance(d)
		_, err := f.take(t, false)
		if !errors.Is(err, ErrOpen) || !strings.Contains(err.Error(), errDown.Error()) {
			t.Fatalf("open circuit: got %v, want ErrOpen naming the last error", err)
		}
	}
	if got := gauge(t, f.store.m.skipped); got != 3 {
		t.Errorf("circuit_open_total got %v, want 3", got)
	}

	// At 250 ms one probe goes through; it fails, so the circuit stays open for 500 ms.
	f.clock.advance(time.Millisecond)
	if _, err := f.take(t, true); !errors.Is(err, errDown) {
		t.Fatalf("failed probe: got %v, want the store's error", err)
	}
	f.clock.advance(499 * time.Millisecond)
	f.take(t, false)

	// The store is back: the next probe closes the circuit.
	f.primary.set(nil)
	f.clock.advance(time.Millisecond)
	if ok, err := f.take(t, true); err != nil || !ok {
		t.Fatalf("successful probe: got %v, %v; want admitted, nil", ok, err)
	}
	if !f.store.Healthy() || gauge(t, f.store.m.healthy) != 1 {
		t.Errorf("after a successful probe: Healthy %v gauge %v, want true and 1", f.store.Healthy(), gauge(t, f.store.m.healthy))
	}
	f.take(t, true)

	// The backoff was reset: the next outage opens for 250 ms again, not 1 s.
	f.primary.set(errDown)
	f.take(t, true)
	f.clock.advance(249 * time.Millisecond)
	f.take(t, false)
	f.clock.advance(time.Millisecond)
	f.take(t, true)
}

func TestStateChangeCallback(t *testing.T) {
	var got []string
	f := newFixture(t, Options{OnError: bucket.Allow, OnStateChange: func(healthy bool, err error) {
		got = append(got, fmt.Sprint(healthy, " ", err))
	}})
	f.primary.set(errDown)
	f.take(t, true)
	f.clock.advance(DefaultMinBackoff)
	f.take(t, true) // failed probe: still open, no call
	f.primary.set(nil)
	f.clock.advance(2 * DefaultMinBackoff)
	f.take(t, true)
	f.take(t, true)
	want := []string{"false " + errDown.Error(), "true <nil>"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("transitions got %q, want %q", got, want)
	}
}

func TestBackoffDoublesUpToMax(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Allow})
	f.primary.set(errDown)
	f.take(t, true)
	for _, want := range []time.Duration{250, 500, 1000, 2000, 4000, 5000, 5000} {
		want *= time.Millisecond
		f.clock.advance(want - time.Millisecond)
		f.take(t, false)
		f.clock.advance(time.Millisecond)
		f.take(t, true) // the probe, which fails
	}
}

func TestOneProbeAtATime(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Allow})
	f.primary.set(errDown)
	f.take(t, true)
	f.clock.advance(DefaultMinBackoff)

	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	f.primary.mu.Lock()
	f.primary.block, f.primary.entered = release, entered
	f.primary.mu.Unlock()
	probeDone := make(chan error, 1)
	go func() {
		_, err := f.store.Take(context.Background(), t0, oneCharge, make([]bucket.Result, 1))
		probeDone <- err
	}()
	<-entered // the probe is in the primary
	for range 5 {
		if _, err := f.store.Take(context.Background(), t0, oneCharge, make([]bucket.Result, 1)); !errors.Is(err, ErrOpen) {
			t.Fatalf("while probing: got %v, want ErrOpen", err)
		}
	}
	if got := f.primary.count(); got != 2 {
		t.Errorf("primary calls got %d, want 2 (the failure and one probe)", got)
	}
	f.primary.set(nil)
	close(release)
	if err := <-probeDone; err != nil {
		t.Fatalf("probe: got %v, want nil", err)
	}
	if !f.store.Healthy() {
		t.Error("after the probe succeeded: Healthy got false")
	}
}

func TestHealthyErrorsDoNotOpen(t *testing.T) {
	errBusy := errors.New("too much contention")
	f := newFixture(t, Options{OnError: bucket.Deny, Healthy: func(err error) bool { return errors.Is(err, errBusy) }})
	f.primary.set(errBusy)
	if _, err := f.take(t, true); !errors.Is(err, errBusy) {
		t.Fatalf("got %v, want the contention error returned", err)
	}
	f.take(t, true) // still closed
	if !f.store.Healthy() {
		t.Error("Healthy got false after an error the classifier calls healthy")
	}
}

func TestClientCancelDoesNotOpen(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Deny})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.primary.set(context.Canceled)
	if _, err := f.store.Take(ctx, t0, oneCharge, make([]bucket.Result, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if !f.store.Healthy() {
		t.Error("a client that left opened the circuit")
	}
}

func TestTimeoutOpens(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Allow})
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	f.primary.set(context.DeadlineExceeded)
	if _, err := f.store.Take(ctx, t0, oneCharge, make([]bucket.Result, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if f.store.Healthy() {
		t.Error("a store timeout did not open the circuit")
	}
}

func TestLocalDividesLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit bucket.Limit
	}{
		{"token bucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600, Burst: 9}},
		{"fixed window", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 9, Window: time.Hour}},
		{"sliding window", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 9, Window: time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Options{OnError: bucket.Local, Replicas: 3})
			f.primary.set(errDown)
			charges := []bucket.Charge{{Key: bucket.Key{7}, Limit: tc.limit}}
			admitted := 0
			for i := range 6 {
				r := make([]bucket.Result, 1)
				ok, err := f.store.Take(context.Background(), t0, charges, r)
				if err != nil {
					t.Fatalf("decision %d: got error %v, want none in local mode", i, err)
				}
				if ok {
					admitted++
					if r[0].Limit != 3 {
						t.Errorf("decision %d: Limit got %d, want 3 (9 / 3 replicas)", i, r[0].Limit)
					}
				} else if r[0].RetryAfter <= 0 {
					t.Errorf("decision %d: rejected with RetryAfter %v, want > 0", i, r[0].RetryAfter)
				}
			}
			if admitted != 3 {
				t.Errorf("admitted got %d, want 3 (burst 9 / 3 replicas at one instant)", admitted)
			}
			if got := f.primary.count(); got != 1 {
				t.Errorf("primary calls got %d, want 1: the open circuit skips it", got)
			}
			if got := gauge(t, f.store.m.fallbackError); got != 1 {
				t.Errorf("fallback decisions{reason=error} got %v, want 1", got)
			}
			if got := gauge(t, f.store.m.fallbackSkipped); got != 5 {
				t.Errorf("fallback decisions{reason=open} got %v, want 5", got)
			}
		})
	}
}

func TestLocalUsesPrimaryWhenHealthy(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Local, Replicas: 3})
	r := make([]bucket.Result, 1)
	ok, err := f.store.Take(context.Background(), t0, oneCharge, r)
	if err != nil || !ok || r[0].Limit != 42 {
		t.Fatalf("got %v %v %+v, want the primary's answer (Limit 42)", ok, err, r[0])
	}
	if f.primary.charges[0].Limit != oneCharge[0].Limit {
		t.Errorf("primary got limit %+v, want the undivided %+v", f.primary.charges[0].Limit, oneCharge[0].Limit)
	}
}

func TestLocalAfterTimeoutDecides(t *testing.T) {
	// The primary used up the decision's deadline; the local decision must still be made.
	f := newFixture(t, Options{OnError: bucket.Local, Replicas: 2})
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	f.primary.set(context.DeadlineExceeded)
	ok, err := f.store.Take(ctx, t0, oneCharge, make([]bucket.Result, 1))
	if err != nil || !ok {
		t.Fatalf("got %v, %v; want admitted locally", ok, err)
	}
}

func TestDivide(t *testing.T) {
	tests := []struct {
		in   bucket.Limit
		n    int64
		want bucket.Limit
	}{
		{bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 9, Burst: 9}, 3, bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 3, Burst: 3}},
		{bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 10}, 3, bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1.0 / 3, Burst: 2}}, // 11 at once / 3 = 3 each: 1 served + 2 waiting
		{bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}, 3, bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 3, Burst: 1}},
		{bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Minute}, 3, bucket.Limit{Algorithm: bucket.FixedWindow, Count: 33, Window: time.Minute}},
		{bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 1, Window: time.Minute}, 5, bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 1, Window: time.Minute}},
		{bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Minute}, 1, bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Minute}},
	}
	for _, tt := range tests {
		if got := Divide(tt.in, tt.n); got != tt.want {
			t.Errorf("Divide(%+v, %d): got %+v, want %+v", tt.in, tt.n, got, tt.want)
		}
	}
}

func TestReadyDeny(t *testing.T) {
	f := newFixture(t, Options{OnError: bucket.Deny})
	if err := f.store.Ready(context.Background()); err != nil {
		t.Fatalf("healthy: Ready got %v, want nil", err)
	}
	if got := f.primary.count(); got != 0 {
		t.Errorf("a healthy Ready called the primary %d times, want 0", got)
	}
	f.primary.set(errDown)
	f.take(t, true)
	err := f.store.Ready(context.Background())
	if err == nil || !strings.Contains(err.Error(), errDown.Error()) {
		t.Fatalf("open circuit: Ready got %v, want an error naming the store's", err)
	}
	if got := f.primary.count(); got != 1 {
		t.Errorf("Ready during the backoff called the primary: %d calls, want 1", got)
	}

	// After the backoff Ready probes by itself; the store is still down.
	f.clock.advance(DefaultMinBackoff)
	if err := f.store.Ready(context.Background()); err == nil {
		t.Fatal("failed probe: Ready got nil, want an error")
	}
	if got := f.primary.count(); got != 2 {
		t.Fatalf("primary calls got %d, want 2 (Ready's probe)", got)
	}
	if c := f.primary.charges; len(c) != 1 || c[0].Key != probeKey || c[0].Shadow {
		t.Errorf("probe charges got %+v, want one enforced charge on the probe key", c)
	}

	// The store is back; after the doubled backoff Ready's probe closes the circuit.
	f.primary.set(nil)
	f.clock.advance(2*DefaultMinBackoff - time.Millisecond)
	if err := f.store.Ready(context.Background()); err == nil {
		t.Fatal("Ready during the doubled backoff got nil, want an error")
	}
	f.clock.advance(time.Millisecond)
	if err := f.store.Ready(context.Background()); err != nil {
		t.Fatalf("store back: Ready got %v, want nil", err)
	}
	if !f.store.Healthy() {
		t.Error("Ready's successful probe did not close the circuit")
	}
}

// TestReadySlowStoreStaysUnready: a store that answers, but slower than a decision may wait,
// must not make a fail-closed gateway ready: its traffic would time out, the circuit would open,
// and the pod would flap in and out of the load balancer. The readiness probe may take longer
// (it may have to reconnect), but only a second probe within the decision timeout closes the
// circuit.
func TestReadySlowStoreStaysUnready(t *testing.T) {
	const decide = 20 * time.Millisecond
	f := newFixture(t, Options{OnError: bucket.Deny, DecisionTimeout: decide})
	f.primary.set(errDown)
	f.take(t, true)
	f.primary.mu.Lock()
	f.primary.err, f.primary.needs = nil, 10*decide // up again, but slow
	f.primary.mu.Unlock()

	backoff := DefaultMinBackoff
	for i := range 3 {
		f.clock.advance(backoff)
		before := f.primary.count()
		if err := f.store.Ready(context.Background()); err == nil || !errors.Is(err, ErrOpen) {
			t.Fatalf("probe %d of a slow store: Ready got %v, want the open-circuit error", i, err)
		}
		if got := f.primary.count() - before; got != 2 {
			t.Fatalf("probe %d: primary calls got %d, want 2 (a probe that may reconnect, then one within the decision timeout)", i, got)
		}
		if f.store.Healthy() {
			t.Fatalf("probe %d: a store slower than the decision timeout closed the circuit", i)
		}
		if _, err := f.take(t, false); !errors.Is(err, ErrOpen) {
			t.Fatalf("probe %d: a decision during the backoff got %v, want ErrOpen without calling the store", i, err)
		}
		backoff *= 2
	}

	// Fast again: the next probe pair closes the circuit.
	f.primary.mu.Lock()
	f.primary.needs = 0
	f.primary.mu.Unlock()
	f.clock.advance(backoff)
	if err := f.store.Ready(context.Background()); err != nil {
		t.Fatalf("store fast again: Ready got %v, want nil", err)
	}
	if !f.store.Healthy() {
		t.Error("a store that answers within the decision timeout did not close the circuit")
	}
}

func TestReadyAllowAndLocalStayReady(t *testing.T) {
	for _, o := range []Options{{OnError: bucket.Allow}, {OnError: bucket.Local, Replicas: 2}} {
		f := newFixture(t, o)
		f.primary.set(errDown)
		f.store.Take(context.Background(), t0, oneCharge, make([]bucket.Result, 1))
		f.clock.advance(time.Minute)
		if err := f.store.Ready(context.Background()); err != nil {
			t.Errorf("OnError %d with the store down: Ready got %v, want nil", o.OnError, err)
		}
		if got := f.primary.count(); got != 1 {
			t.Errorf("OnError %d: Ready called the primary (%d calls, want 1)", o.OnError, got)
		}
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(&fakeStore{}, Options{OnError: bucket.Local}); err == nil {
		t.Error("Local without Replicas: got nil error")
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("nil primary: got nil error")
	}
	reg := prometheus.NewRegistry()
	if _, err := New(&fakeStore{}, Options{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(&fakeStore{}, Options{Registerer: reg}); err == nil {
		t.Error("second store on one registry: got nil error, want a registration error")
	}
}

// localStore is a primary that can decide some charges without I/O (as the DynamoDB store's
// leases do); decided says whether it can, admit what it decides.
type localStore struct {
	fakeStore
	decided, admit bool
	local          int
}

func (l *localStore) TakeLocal(_ time.Time, charges []bucket.Charge, results []bucket.Result) (bool, bool) {
	l.local++
	if !l.decided {
		return false, false
	}
	for i := range charges {
		results[i] = bucket.Result{Allowed: l.admit, Limit: 7}
	}
	return l.admit, true
}

// TestOpenCircuitDecidesLocallyWhatThePrimaryHolds: while the circuit is open, a charge the
// primary can decide from what it holds (a lease's units) is decided so, without an error and
// without calling it; the others follow on_error as before.
func TestOpenCircuitDecidesLocallyWhatThePrimaryHolds(t *testing.T) {
	for _, mode := range []bucket.OnError{bucket.Allow, bucket.Deny, bucket.Local} {
		primary := &localStore{}
		c := &clock{now: t0}
		s, err := New(primary, Options{OnError: mode, Replicas: 2, Now: c.Now})
		if err != nil {
			t.Fatal(err)
		}
		primary.set(errDown)
		r := make([]bucket.Result, 1)
		if _, err := s.Take(context.Background(), c.Now(), oneCharge, r); !errors.Is(err, errDown) && mode != bucket.Local {
			t.Fatalf("on_error %d: first failure got %v", mode, err)
		}
		if primary.local != 0 {
			t.Errorf("on_error %d: TakeLocal called while the circuit was closed", mode)
		}
		for _, tc := range []struct{ decided, admit bool }{{true, true}, {true, false}} {
			primary.decided, primary.admit = tc.decided, tc.admit
			calls := primary.count()
			ok, err := s.Take(context.Background(), c.Now(), oneCharge, r)
			if err != nil || ok != tc.admit || r[0].Limit != 7 || primary.count() != calls {
				t.Errorf("on_error %d, open, held (admit %v): got %v %v limit %d, primary calls +%d; want the local verdict, no error, no call",
					mode, tc.admit, ok, err, r[0].Limit, primary.count()-calls)
			}
		}
		primary.decided = false
		ok, err := s.Take(context.Background(), c.Now(), oneCharge, r)
		switch mode {
		case bucket.Local:
			if err != nil || r[0].Limit != 5 { // burst 10 divided by 2 replicas
				t.Errorf("on_error local, open, not held: got %v %v limit %d, want the divided local decision", ok, err, r[0].Limit)
			}
		default:
			if !errors.Is(err, ErrOpen) {
				t.Errorf("on_error %d, open, not held: got %v %v, want ErrOpen", mode, ok, err)
			}
		}
	}
}

// TestUndecidedCarriesTheRule: the fallback store decides on_error once; a decision it cannot
// make reaches the front ends as a *bucket.UndecidedError naming the rule, both when the
// primary fails and while the circuit is open, with the store's error still inside.
func TestUndecidedCarriesTheRule(t *testing.T) {
	for _, rule := range []bucket.OnError{bucket.Allow, bucket.Deny} {
		f := newFixture(t, Options{OnError: rule})
		f.primary.set(errDown)
		for _, stage := range []string{"failure", "open circuit"} {
			_, err := f.take(t, stage == "failure")
			ue, ok := errors.AsType[*bucket.UndecidedError](err)
			if !ok || ue.Rule != rule || bucket.RuleOf(err) != rule {
				t.Errorf("%v, %s: got %v, want an UndecidedError with rule %v", rule, stage, err, rule)
			}
			if want := map[string]error{"failure": errDown, "open circuit": ErrOpen}[stage]; !errors.Is(err, want) {
				t.Errorf("%v, %s: got %v, want %v inside", rule, stage, err, want)
			}
		}
	}
}
