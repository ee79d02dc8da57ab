package protect

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustNew(t *testing.T, o Options) *Limiter {
	t.Helper()
	l, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// granted reports whether w holds its slot (its ready channel is closed).
func granted(w *Waiter) bool {
	select {
	case <-w.Ready():
		return true
	default:
		return false
	}
}

func TestFixedLimit(t *testing.T) {
	l := mustNew(t, Options{Limit: 3})
	for i := 0; i < 3; i++ {
		if !l.TryAcquire(Sheddable) {
			t.Fatalf("request %d: got no slot, want one of 3", i+1)
		}
	}
	if l.TryAcquire(Critical) {
		t.Fatal("4th request got a slot over the fixed limit of 3")
	}
	l.Release(Sheddable, t0, time.Second, true) // a fixed limit ignores latency
	if got := l.Limit(); got != 3 {
		t.Errorf("got limit %d after a slow sample, want 3 (fixed)", got)
	}
	if !l.TryAcquire(Default) {
		t.Error("got no slot after a release, want one")
	}
	if got := l.Inflight(); got != 3 {
		t.Errorf("got inflight %d, want 3", got)
	}
}

func TestReserveKeepsSlotsForCritical(t *testing.T) {
	// limit 10, critical reserve 0.2: default and sheddable stop at 8, critical may take 10.
	l := mustNew(t, Options{Limit: 10, Reserves: [NumClasses]float64{Critical: 0.2}})
	for i := 0; i < 8; i++ {
		if !l.TryAcquire(Default) {
			t.Fatalf("default request %d: got no slot, want 8 of them", i+1)
		}
	}
	if l.TryAcquire(Default) || l.TryAcquire(Sheddable) {
		t.Fatal("a default or sheddable request took a slot of critical's reserve")
	}
	for i := 0; i < 2; i++ {
		if !l.TryAcquire(Critical) {
			t.Fatalf("critical request %d: got no slot, want the 2 reserved", i+1)
		}
	}
	if l.TryAcquire(Critical) {
		t.Fatal("critical got a slot over the limit")
	}
}

// Below a class with requests in flight, a class leaves room for its bursts: the square root of
// its count in flight, on top of the reserve.
func TestBurstRoomForTheClassesAbove(t *testing.T) {
	l := mustNew(t, Options{Limit: 10, Reserves: [NumClasses]float64{Critical: 0.2}})
	for i := 0; i < 4; i++ {
		l.TryAcquire(Critical)
	}
	n := 0
	for l.TryAcquire(Default) {
		n++
	}
	// default's threshold: 10 less the reserve of 2, less sqrt(4) = 2 for critical's bursts: 6
	// in flight in all, so 2 default requests.
	if n != 2 {
		t.Fatalf("default took %d slots beside 4 critical ones, want 2 (8 less 2 of burst room)", n)
	}
	for i := 0; i < 4; i++ {
		if !l.TryAcquire(Critical) {
			t.Fatalf("critical burst request %d found no slot", i+1)
		}
	}
	if got := l.Inflight(); got != 10 {
		t.Errorf("got %d in flight, want the limit 10", got)
	}
}

func TestDefaultReserveShedsSheddableFirst(t *testing.T) {
	l := mustNew(t, Options{Limit: 10, Reserves: [NumClasses]float64{Critical: 0.2, Default: 0.2}})
	n := 0
	for l.TryAcquire(Sheddable) {
		n++
	}
	if n != 6 {
		t.Fatalf("sheddable took %d slots, want 6 (10 less 2 for critical, 2 for default)", n)
	}
	first, second, third := l.TryAcquire(Default), l.TryAcquire(Default), l.TryAcquire(Default)
	if !first || !second || third {
		t.Fatal("default did not get exactly the 2 slots above sheddable's share")
	}
}

func TestQueueOrderPriorityThenFIFO(t *testing.T) {
	l := mustNew(t, Options{Limit: 2, QueueTimeout: 10 * time.Millisecond})
	l.TryAcquire(Sheddable)
	l.TryAcquire(Sheddable)
	enq := func(c Class) *Waiter {
		w, ok := l.Enqueue(c, t0)
		if ok || w == nil {
			t.Fatalf("%v: got a slot or no waiter with the limit full", c)
		}
		return w
	}
	s1, d1, c1, d2 := enq(Sheddable), enq(Default), enq(Critical), enq(Default)
	order := []*Waiter{c1, d1, d2, s1}
	names := map[*Waiter]string{s1: "s1", d1: "d1", c1: "c1", d2: "d2"}
	// Each release is of the request that got the previous slot (one sheddable holds the other
	// slot throughout).
	released := []Class{Sheddable, Critical, Default, Default}
	for i, want := range order {
		l.Release(released[i], t0.Add(time.Millisecond), 0, false)
		for _, w := range order[:i+1] {
			if !granted(w) {
				t.Fatalf("release %d: %s has no slot, want %s served", i+1, names[w], names[want])
			}
		}
		for _, w := range order[i+1:] {
			if granted(w) {
				t.Fatalf("release %d: %s got a slot before %s", i+1, names[w], names[want])
			}
		}
	}
}

func TestNewRequestDoesNotPassTheQueue(t *testing.T) {
	l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Second})
	l.TryAcquire(Default)
	w, _ := l.Enqueue(Default, t0)
	l.inflight.Store(0) // as if the slot were free but not dispatched yet
	if l.TryAcquire(Default) || l.TryAcquire(Sheddable) {
		t.Error("a new request took a slot while one of its class waited")
	}
	if !l.TryAcquire(Critical) {
		t.Error("critical did not get a free slot while only a default request waited")
	}
	_ = w
}

func TestQueueDeadline(t *testing.T) {
	l := mustNew(t, Options{Limit: 1, QueueTimeout: 10 * time.Millisecond})
	l.TryAcquire(Default)
	late, _ := l.Enqueue(Default, t0)
	onTime, _ := l.Enqueue(Default, t0.Add(5*time.Millisecond))
	l.Release(Default, t0.Add(11*time.Millisecond), 0, false) // late's deadline has passed
	if granted(late) {
		t.Error("a waiter past its deadline got a slot")
	}
	if !granted(onTime) {
		t.Error("the next waiter within its deadline got no slot")
	}
	if l.Cancel(late) {
		t.Error("Cancel of the expired waiter reports a slot")
	}
	if !l.Cancel(onTime) {
		t.Error("Cancel of a granted waiter does not report its slot")
	}
}

func TestNoQueueSheds(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	l := mustNew(t, Options{Limit: 1, Metrics: m, Now: func() time.Time { return t0 }})
	if _, err := l.Acquire(context.Background(), Critical); err != nil {
		t.Fatalf("first request: %v, want a slot", err)
	}
	if _, err := l.Acquire(context.Background(), Sheddable); !errors.Is(err, ErrShed) {
		t.Fatalf("got %v, want ErrShed", err)
	}
	if got := testutil.ToFloat64(m.shedTotal[Sheddable]); got != 1 {
		t.Errorf("got shed_total{sheddable} %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.shedTotal[Default]); got != 0 {
		t.Errorf("got shed_total{default} %v, want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "ratelimit_upstream_concurrency_limit", "ratelimit_upstream_inflight"); err != nil || n != 2 {
		t.Errorf("got %d gauge series (%v), want 2", n, err)
	}
	if got := testutil.ToFloat64(prometheusGauge(t, reg, "ratelimit_upstream_inflight")); got != 1 {
		t.Errorf("got inflight gauge %v, want 1", got)
	}
}

func TestAcquireWaitsForARelease(t *testing.T) {
	l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Minute})
	l.TryAcquire(Default)
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(context.Background(), Default)
		done <- err
	}()
	waitQueued(t, l, Default)
	l.Release(Default, time.Now(), 0, false)
	if err := <-done; err != nil {
		t.Fatalf("got %v, want the freed slot", err)
	}
	if got := l.Inflight(); got != 1 {
		t.Errorf("got inflight %d, want 1 (the waiter's)", got)
	}
}

func TestAcquireClientGoneFreesNothingTwice(t *testing.T) {
	l := mustNew(t, Options{Limit: 1, QueueTimeout: time.Minute})
	l.TryAcquire(Default)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, Default)
		done <- err
	}()
	waitQueued(t, l, Default)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if got := l.Inflight(); got != 1 {
		t.Errorf("got inflight %d, want 1: the gone waiter must hold nothing", got)
	}
	l.mu.Lock()
	empty := l.queues[Default].empty()
	l.mu.Unlock()
	if !empty {
		t.Error("the gone waiter is still queued")
	}
}

// waitQueued polls, with a deadline, until a request of class c waits.
func waitQueued(t *testing.T, l *Limiter, c Class) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		q := !l.queues[c].empty()
		l.mu.Unlock()
		if q {
			return
		}
		time.Sleep(time.Millisecond) // polling, not waiting for an effect
	}
	t.Fatal("no request queued within 5s")
}

func prometheusGauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "copy"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// Many requests at once through the lock-free path and the queue: never more in flight than the
// limit, every waiter served (a slot freed while a request was queueing must not strand it:
// with a queue timeout of 10s, a stranded last waiter would be shed), nothing left in flight.
func TestConcurrentNeverOverLimitNorStranded(t *testing.T) {
	for _, adaptive := range []bool{false, true} {
		l := mustNew(t, Options{Adaptive: adaptive, Limit: 5, MinLimit: 5, MaxLimit: 5, QueueTimeout: 10 * time.Second,
			Reserves: [NumClasses]float64{Critical: 0.2}})
		var active, peak atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := 0; i < 300; i++ {
					c := Class((g + i) % NumClasses)
					if _, err := l.Acquire(context.Background(), c); err != nil {
						errs <- err
						return
					}
					n := active.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					active.Add(-1)
					l.Release(c, time.Now(), time.Millisecond, true)
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("adaptive=%v: %v: a waiter was not served", adaptive, err)
		}
		if p := peak.Load(); p > 5 {
			t.Errorf("adaptive=%v: %d in flight at once, want at most the limit 5", adaptive, p)
		}
		if n := l.Inflight(); n != 0 {
			t.Errorf("adaptive=%v: %d left in flight, want 0", adaptive, n)
		}
	}
}
