// Package protect guards the upstream itself: a limit on the requests in flight to it, fixed or
// adaptive (following the upstream's latency, see gradient.go), and priority classes that decide
// who waits and who is shed when the limit is reached. It knows nothing about HTTP: the proxy
// classifies a request (Classifier), asks Acquire for a slot, and hands the slot back with the
// upstream's latency (Release).
//
// Shedding order: a class may take a slot while the requests in flight are below its threshold,
// the limit less the reserves of the classes above it, so sheddable requests are refused first,
// then default ones; critical ones only when the whole limit is in use. Requests that find no
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
	"sync"
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
type Limiter struct {
	opts Options
	now  func() time.Time
	m    *Metrics

	mu       sync.Mutex
	inflight int
	queues   [NumClasses]queue
	ctrl     gradient // adaptive only; its limit is the limit
	limit    float64
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
	l := &Limiter{opts: o, now: o.Now, m: o.Metrics, limit: float64(o.Limit)}
	if l.now == nil {
		l.now = time.Now
	}
	for c := Class(1); c < NumClasses; c++ {
		l.above[c] = l.above[c-1] + o.Reserves[c-1]
	}
	if o.Adaptive {
		l.ctrl = newGradient(float64(o.MinLimit), float64(o.MaxLimit))
	}
	if l.m != nil {
		l.m.attach(l)
	}
	return l, nil
}

// Limit is the current limit (whole slots).
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.slots()
}

// Inflight is how many slots are taken.
func (l *Limiter) Inflight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inflight
}

// slots is the limit in whole slots, at least 1. Callers hold mu.
func (l *Limiter) slots() int { return max(1, int(l.limit)) }

// threshold is how many requests may be in flight for class c to take a slot: the limit less
// the reserves above c, rounded down (a reserve is never short of a slot). Callers hold mu.
func (l *Limiter) threshold(c Class) int {
	n := l.slots()
	if c == 0 {
		return n
	}
	return int(math.Floor(float64(n) * (1 - l.above[c])))
}

// TryAcquire takes a slot for class c at once if one is free to it and nobody of c or a more
// important class is waiting (a new request never passes the queue). It never waits.
func (l *Limiter) TryAcquire(c Class) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tryLocked(c)
}

func (l *Limiter) tryLocked(c Class) bool {
	for d := Class(0); d <= c; d++ {
		if !l.queues[d].empty() {
			return false
		}
	}
	if l.inflight >= l.threshold(c) {
		return false
	}
	l.inflight++
	return true
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
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tryLocked(c) {
		return nil, true
	}
	if l.opts.QueueTimeout <= 0 {
		return nil, false
	}
	w := &Waiter{class: c, deadline: now.Add(l.opts.QueueTimeout), ready: make(chan struct{}), queued: true}
	l.queues[c].push(w)
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
		w.queued = false
	}
	return w.granted
}

// Release gives a slot back at now. With sampled, rtt is the upstream's latency for the
// request that held it (time to its response headers), which moves an adaptive limit; without,
// nothing was learnt (the request never reached the upstream or its client left).
func (l *Limiter) Release(now time.Time, rtt time.Duration, sampled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight > 0 {
		l.inflight--
	}
	if sampled && l.opts.Adaptive {
		l.limit = l.ctrl.sample(now, rtt, l.inflight+1, l.limit)
	}
	l.dispatch(now)
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
				w.queued = false
				continue
			}
			if l.inflight >= l.threshold(c) {
				// Every class below has a threshold no higher: nobody else can go either.
				return
			}
			q.remove(w)
			w.queued = false
			w.granted = true
			l.inflight++
			close(w.ready)
		}
	}
}

// Acquire asks for a slot for a request of class c, waiting up to QueueTimeout. It returns
// nil with a slot taken (hand it back with Release), ErrShed when there was none, or ctx's
// error when the context ended while it waited. waited is the time spent in the queue.
func (l *Limiter) Acquire(ctx context.Context, c Class) (waited time.Duration, err error) {
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
		if err == ErrShed {
			err = nil // granted just as the deadline passed: take it
		} else {
			l.Release(l.now(), 0, false) // nobody left to use it
		}
	}
	waited = l.now().Sub(start)
	l.m.waited(waited)
	if err == ErrShed {
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
