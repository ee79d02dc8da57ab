package sim

import (
	"sync"
	"testing/synctest"
)

// turns runs the bubble's goroutines one at a time, so that a seed repeats its run byte for
// byte. Every goroutine of the stores (through dynamo.Options.Gate) and of the simulator takes a
// ticket just before it blocks (Park) and waits for its turn as soon as it wakes (Resume). One
// goroutine, the scheduler, hands out the turns: it waits until every goroutine of the bubble is
// blocked (synctest.Wait), then wakes the waiting goroutine of the smallest ticket, waits again,
// and so on until none waits. Tickets are taken by the one goroutine that runs, so their order
// is the run's own; goroutines that one event wakes together (the waiters of a coalesced write,
// backoffs ending at one instant) then go on in ticket order, not in the Go scheduler's.
//
// The scheduler also runs while the driver sleeps (time.Sleep in advance): goroutines that a
// timer wakes meanwhile have their turns at that timer's instant, as they would without turns,
// and the fake clock moves on only once they are all blocked again. The driver never calls
// synctest.Wait itself (two callers at once are not allowed): settle asks the scheduler.
type turns struct {
	mu      sync.Mutex
	next    uint64
	waiters map[uint64]chan struct{}
	kick    chan struct{}      // one place: a goroutine is waiting for its turn
	settle  chan chan struct{} // the driver's request: closed once nothing can run
	stop    chan struct{}
	grants  int
}

func newTurns() *turns {
	t := &turns{waiters: map[uint64]chan struct{}{}, kick: make(chan struct{}, 1), settle: make(chan chan struct{}), stop: make(chan struct{})}
	go t.loop()
	return t
}

// Park implements bucket.Gate.
func (t *turns) Park() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	return t.next
}

// Resume implements bucket.Gate.
func (t *turns) Resume(k uint64) {
	ch := make(chan struct{})
	t.mu.Lock()
	t.waiters[k] = ch
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
	<-ch
}

// Go runs f in a goroutine that waits for its turn first.
func (t *turns) Go(f func()) {
	k := t.Park()
	go func() {
		t.Resume(k)
		f()
	}()
}

// quiesce returns once every goroutine but the driver is blocked and none waits for a turn.
func (t *turns) quiesce() {
	done := make(chan struct{})
	t.settle <- done
	<-done
}

func (t *turns) close() { close(t.stop) }

func (t *turns) loop() {
	for {
		var done chan struct{}
		select {
		case <-t.kick:
		case done = <-t.settle:
		case <-t.stop:
			return
		}
		for {
			synctest.Wait()
			ch := t.first()
			if ch == nil {
				break
			}
			close(ch)
		}
		if done != nil {
			close(done)
		}
	}
}

// first takes the waiter of the smallest ticket out (nil when none waits).
func (t *turns) first() chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	var min uint64
	for k := range t.waiters {
		if min == 0 || k < min {
			min = k
		}
	}
	if min == 0 {
		return nil
	}
	ch := t.waiters[min]
	delete(t.waiters, min)
	t.grants++
	return ch
}
