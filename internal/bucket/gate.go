package bucket

import "sync"

// Gate lets a test run the goroutines of a store one at a time, in an order of its choosing
// (the DynamoDB and the Redis stores take one in their Options):
// the simulator (internal/testkit/sim) gives every replica's store the same Gate, so that two
// goroutines that one event wakes (the waiters of a coalesced write, backoffs ending at one
// instant) never race for the store's random source or its lease pools, and a seed repeats its
// run byte for byte. The gateway leaves it nil, which costs a nil check at each place a
// goroutine of the store blocks or starts.
type Gate interface {
	// Park is called by a goroutine just before it blocks (on a channel, a timer, a
	// WaitGroup, or before a goroutine it starts runs) and returns a ticket.
	Park() uint64
	// Resume is called with Park's ticket as soon as the goroutine wakes; it returns when the
	// goroutine may go on.
	Resume(ticket uint64)
}

// Turns is a store's Gate, nil or not: its methods are what the store calls.
type Turns struct{ G Gate }

// Park takes a ticket before blocking (0 without a Gate).
func (t Turns) Park() uint64 {
	if t.G == nil {
		return 0
	}
	return t.G.Park()
}

// Resume waits for the ticket's turn (at once without a Gate).
func (t Turns) Resume(ticket uint64) {
	if t.G != nil {
		t.G.Resume(ticket)
	}
}

// Go runs f in a new goroutine that, with a Gate, waits for its turn first.
func (t Turns) Go(f func()) {
	if t.G == nil {
		go f()
		return
	}
	k := t.G.Park()
	go func() {
		t.G.Resume(k)
		f()
	}()
}

// GoWG is Go counted in wg (wg.Go with a Gate's turn).
func (t Turns) GoWG(wg *sync.WaitGroup, f func()) {
	if t.G == nil {
		wg.Go(f)
		return
	}
	k := t.G.Park()
	wg.Go(func() {
		t.G.Resume(k)
		f()
	})
}

// Wait is wg.Wait between Park and Resume.
func (t Turns) Wait(wg *sync.WaitGroup) {
	k := t.Park()
	wg.Wait()
	t.Resume(k)
}
