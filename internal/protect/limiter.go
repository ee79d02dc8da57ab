// Package protect limits the requests in flight to the upstream.
//
// It guards the upstream itself: a limit on the requests in flight to it, fixed or
// adaptive (following the upstream's latency, see gradient.go), and priority classes that decide
// who waits and who is shed when the limit is reached. It knows nothing about HTTP: the proxy
// classifies a request (Classifier), asks Acquire for a slot, and hands the slot back with the
// upstream's latency (Release).
//
// Shedding order: a class may take a slot while the requests in flight are below its threshold,
// the limit less the reserves of the classes above it and less room for their bursts (the square
// root of each one's count in flight), so sheddable requests are refused first, then default
// ones; critical ones only when the whole limit is in use. Requests that find no
// slot wait up to QueueTimeout in a FIFO queue of their class; a freed slot goes to the most
// important class waiting, first in first out within it.
//
// Every method that depends on time takes now (or reads the injected clock), so tests need no
// sleeps.
package protect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Class is a priority class. Lower values are more important.
type Class uint8

// The classes, most important first.
const (
	Critical Class = iota
	Default
	Sheddable
	// NumClasses is how many classes there are.
	NumClasses = 3
)

var classNames = [NumClasses]string{"critical", "default", "sheddable"}

// String is the class's name in the config and in metric labels.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ErrShed is what Acquire returns for a request that got no slot.
var ErrShed = errors.New("protect: upstream overloaded, request shed")

// Options configure New.
type Options struct {
	// Adaptive moves the limit with the upstream's latency between MinLimit and MaxLimit;
	// otherwise it stays Limit.
	Adaptive bool
	// Limit is the fixed limit or the adaptive one's start. (Required) at least 1.
	Limit int
	// MinLimit and MaxLimit bound the adaptive limit. (Required when Adaptive)
	MinLimit, MaxLimit int
	// QueueTimeout is how long a request may wait for a slot; 0: not at all.
	QueueTimeout time.Duration
	// Reserves[c] is the share of the limit held back from every class below c.
	Reserves [NumClasses]float64
	// Now is the clock of Acquire. (Optional) default time.Now.
	Now func() time.Time
	// Metrics receive the shed counts and queue waits. (Optional) default: none.
	Metrics *Metrics
}

// Limiter hands out slots for requests to the upstream. It is safe for concurrent use; create
// it with New (the zero Limiter is not usable).
//
// The hot path (a slot free, nobody waiting) is lock-free: a compare-and-swap on the count in
// flight to take a slot, an add to give it back, and for an adaptive limit a few atomic adds
// into the current window. The mutex is taken only to queue, to hand freed slots to waiting
// requests, and (a TryLock) by the one sample that closes a window.
type Limiter struct {
	opts Options
	now  func() time.Time
	m    *Metrics

	inflight  atomic.Int64
	classIn   [NumClasses]atomic.Int64 // slots taken by each class
	waiting   [NumClasses]atomic.Int64 // requests in each class's queue
	thr       [NumClasses]atomic.Int64 // each class's threshold at the current limit
	limitBits atomic.Uint64            // the limit, a float64

	mu     sync.Mutex // guards the queues and the waiters' fields
	queues [NumClasses]queue

	// The adaptive limit's current window, filled lock-free; closed under ctrlMu.
	winStart, winSum, winN, winMax atomic.Int64 // unix ns (0: no sample yet), ns, samples, most in flight
	sampleCap                      atomic.Int64 // ns; 0 until the first window
	every                          atomic.Int64 // Sample measures one request in every (about)
	ctrlMu                         sync.Mutex
	ctrl                           gradient

	// above[c] is the sum of the reserves of the classes more important than c.
	above [NumClasses]float64
}

// New builds a Limiter from o.
func New(o Options) (*Limiter, error) {
	if o.Limit < 1 {
		return nil, fmt.Errorf("protect: limit %d: must be at least 1", o.Limit)
	}
	if o.Adaptive && (o.MinLimit < 1 || o.MaxLimit < o.MinLimit || o.Limit < o.MinLimit || o.Limit > o.MaxLimit) {
		return nil, fmt.Errorf("protect: adaptive limit %d: want 1 <= min_limit (%d) <= limit <= max_limit (%d)", o.Limit, o.MinLimit, o.MaxLimit)
	}
	if o.QueueTimeout < 0 {
		return nil, fmt.Errorf("protect: queue timeout %v: must not be negative", o.QueueTimeout)
	}
	var sum float64
	for c, r := range o.Reserves {
		if r < 0 || r >= 1 {
			return nil, fmt.Errorf("protect: reserve of %s %v: want [0, 1)", Class(c), r)
		}
		sum += r
	}
	if sum >= 1 {
		return nil, fmt.Errorf("protect: reserves add up to %v: want below 1", sum)
	}
	l := &Limiter{opts: o, now: o.Now, m: o.Metrics}
	if l.now == nil {
		l.now = time.Now
	}
	for c := Class(1); c < NumClasses; c++ {
		l.above[c] = l.above[c-1] + o.Reserves[c-1]
	}
	l.setLimit(float64(o.Limit))
	if o.Adaptive {
		l.ctrl = newGradient(float64(o.MinLimit), float64(o.MaxLimit))
	}
	if l.m != nil {
		l.m.attach(l)
	}
	return l, nil
}

// setLimit makes f the limit and updates the classes' thresholds: the limit in whole slots
// (at least 1) less the reserves above the class, rounded down (a reserve is never short of
// a slot).
func (l *Limiter) setLimit(f float64) {
	l.limitBits.Store(math.Float64bits(f))
	n := max(1, int(f))
	for c := Class(0); c < NumClasses; c++ {
		l.thr[c].Store(int64(math.Floor(float64(n) * (1 - l.above[c]))))
	}
}

func (l *Limiter) limit() float64 { return math.Float64frombits(l.limitBits.Load()) }

// Limit is the current limit (whole slots).
func (l *Limiter) Limit() int { return max(1, int(l.limit())) }

// CountShed counts a request of class c that its caller shed without asking Acquire (the
// proxy's per-client bound on streaming uploads), in ratelimit_upstream_shed_total.
func (l *Limiter) CountShed(c Class) { l.m.shed(c) }

// Inflight is how many slots are taken.
func (l *Limiter) Inflight() int { return int(l.inflight.Load()) }

// TryAcquire takes a slot for class c at once if one is free to it and nobody of c or a more
// important class is waiting (a new request does not pass the queue). It never waits.
func (l *Limiter) TryAcquire(c Class) bool {
	for d := Class(0); d <= c; d++ {
		if l.waiting[d].Load() > 0 {
			return false
		}
	}
	return l.take(c)
}

// take takes a slot if the requests in flight are below c's threshold: its static one (the
// limit less the reserves above c) less room for the bursts of every class above c, the square
// root of what it has in flight (about one standard deviation of a count of random arrivals).
// So a critical request that arrives in a burst finds a slot that a default one left free,
// rather than waiting for one to end.
func (l *Limiter) take(c Class) bool {
	thr := l.thr[c].Load()
	for d := Class(0); d < c; d++ {
		if n := l.classIn[d].Load(); n > 0 {
			thr -= int64(math.Ceil(math.Sqrt(float64(n))))
		}
	}
	for {
		n := l.inflight.Load()
		if n >= thr {
			return false
		}
		if l.inflight.CompareAndSwap(n, n+1) {
			l.classIn[c].Add(1)
			return true
		}
	}
}

// Waiter is a request waiting in its class's queue.
type Waiter struct {
	class      Class
	deadline   time.Time
	ready      chan struct{} // closed when the slot is granted
	granted    bool          // guarded by the Limiter's mu
	queued     bool          // in its queue; guarded by mu
	prev, next *Waiter
}

// Ready is closed when the waiter got its slot.
func (w *Waiter) Ready() <-chan struct{} { return w.ready }

// Enqueue is TryAcquire that, failing, puts the request at the back of its class's queue until
// now+QueueTimeout: it returns (nil, true) for a slot taken at once, (w, false) for a request
// that waits for w.Ready (or its deadline, then Cancel), and (nil, false) when it must be shed
// at once (no queue).
func (l *Limiter) Enqueue(c Class, now time.Time) (*Waiter, bool) {
	if l.TryAcquire(c) {
		return nil, true
	}
	if l.opts.QueueTimeout <= 0 {
		return nil, false
	}
	w := &Waiter{class: c, deadline: now.Add(l.opts.QueueTimeout), ready: make(chan struct{}), queued: true}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queues[c].push(w)
	l.waiting[c].Add(1)
	// A slot freed between TryAcquire and the count above was given back by a Release that
	// saw nobody waiting: look again now that the count is published.
	l.dispatch(now)
	if w.granted {
		return nil, true
	}
	return w, false
}

// Cancel takes w out of its queue (its deadline passed, or its client left). It reports whether
// w was granted a slot in the meantime: then the caller holds the slot and must Release it (or
// use it).
func (l *Limiter) Cancel(w *Waiter) (granted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.queued {
		l.queues[w.class].remove(w)
		l.waiting[w.class].Add(-1)
		w.queued = false
	}
	return w.granted
}

// Release gives back a slot of class c at now (zero: the Limiter reads its clock if it needs to). With
// sampled, rtt is the upstream's latency for the request that held it (time to its response
// headers), which moves an adaptive limit; without, nothing was learnt (the request never
// reached the upstream or its client left).
func (l *Limiter) Release(c Class, now time.Time, rtt time.Duration, sampled bool) {
	l.classIn[c].Add(-1)
	in := l.inflight.Add(-1) + 1 // in flight while the request was
	if sampled && l.opts.Adaptive {
		if now.IsZero() {
			now = l.now()
		}
		l.sample(now, rtt, in)
	}
	if l.waiting[Critical].Load()+l.waiting[Default].Load()+l.waiting[Sheddable].Load() > 0 {
		if now.IsZero() {
			now = l.now()
		}
		l.mu.Lock()
		l.dispatch(now)
		l.mu.Unlock()
	}
}

// samplesPerWindow is how many latencies a window aims at: plenty for an average, and at high
// request rates most requests are not timed at all (reading the clock twice per request is a
// noticeable part of the gateway's cost on some virtual machines).
const samplesPerWindow = 64

// Sample reports whether the latency of the request about to take a slot should be measured
// and handed to Release: never for a fixed limit; for an adaptive one every request at low
// rates, about samplesPerWindow per window at high ones (a random choice: no shared counter).
func (l *Limiter) Sample() bool {
	if !l.opts.Adaptive {
		return false
	}
	k := l.every.Load()
	return k <= 1 || rand.Uint64N(uint64(k)) == 0
}

// sample adds one latency to the current window and closes the window when it is due.
func (l *Limiter) sample(now time.Time, rtt time.Duration, in int64) {
	x := int64(rtt)
	if c := l.sampleCap.Load(); c > 0 && x > c {
		x = c
	}
	l.winSum.Add(x)
	n := l.winN.Add(1)
	for m := l.winMax.Load(); in > m && !l.winMax.CompareAndSwap(m, in); m = l.winMax.Load() {
	}
	t := now.UnixNano()
	start := l.winStart.Load()
	if start == 0 {
		l.winStart.CompareAndSwap(0, t)
		return
	}
	if n < windowSamples || t-start < int64(windowMin) || !l.ctrlMu.TryLock() {
		return
	}
	defer l.ctrlMu.Unlock()
	if l.winStart.Load() != start {
		return // another sample closed it
	}
	n, sum, most := l.winN.Swap(0), l.winSum.Swap(0), l.winMax.Swap(0)
	l.winStart.Store(0)
	if n == 0 {
		return
	}
	// The window saw about n*every requests: time one in every so many that the next sees
	// samplesPerWindow.
	l.every.Store(max(1, n*max(1, l.every.Load())/samplesPerWindow))
	old := l.limit()
	next := l.ctrl.update(float64(sum)/float64(n)/1e9, float64(most)*2 >= old, old)
	l.setLimit(next)
	l.sampleCap.Store(int64(l.ctrl.baseline * tolerance / minGradient * 1e9))
}

// dispatch grants free slots to waiting requests, most important class first, FIFO within a
// class, dropping those whose deadline passed (their own timer sheds them). Callers hold mu.
func (l *Limiter) dispatch(now time.Time) {
	for c := Class(0); c < NumClasses; c++ {
		q := &l.queues[c]
		for !q.empty() {
			w := q.head
			if now.After(w.deadline) {
				q.remove(w)
				l.waiting[c].Add(-1)
				w.queued = false
				continue
			}
			if !l.take(c) {
				// Every class below has a threshold no higher: nobody else can go either.
				return
			}
			q.remove(w)
			l.waiting[c].Add(-1)
			w.queued = false
			w.granted = true
			close(w.ready)
		}
	}
}

// Acquire asks for a slot for a request of class c, waiting up to QueueTimeout. It returns
// nil with a slot taken (hand it back with Release), ErrShed when there was none, or ctx's
// error when the context ended while it waited. waited is the time spent in the queue.
func (l *Limiter) Acquire(ctx context.Context, c Class) (waited time.Duration, err error) {
	if l.TryAcquire(c) {
		return 0, nil // the common case, without reading the clock
	}
	start := l.now()
	w, ok := l.Enqueue(c, start)
	if ok {
		return 0, nil
	}
	if w == nil {
		l.m.shed(c)
		return 0, ErrShed
	}
	t := time.NewTimer(w.deadline.Sub(start))
	defer t.Stop()
	select {
	case <-w.ready:
		err = nil
	case <-t.C:
		err = ErrShed
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil && l.Cancel(w) {
		if errors.Is(err, ErrShed) {
			err = nil // granted just as the deadline passed: take it
		} else {
			l.Release(c, l.now(), 0, false) // nobody left to use it
		}
	}
	waited = l.now().Sub(start)
	l.m.waited(waited)
	if errors.Is(err, ErrShed) {
		l.m.shed(c)
	}
	return waited, err
}

// queue is an intrusive FIFO of waiters.
type queue struct{ head, tail *Waiter }

func (q *queue) empty() bool { return q.head == nil }

func (q *queue) push(w *Waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
}

func (q *queue) remove(w *Waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
}
