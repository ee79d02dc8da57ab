package ddbrelay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// Faults of order: a write applied after its client gave up, a copy applied after other writes
// landed, two writes of one client applied in the opposite order. These are what a network with
// retries, queues and several paths does to writes, and what a store must survive if it settles
// an uncertain outcome by anything but the write's own marker: a give-back re-derived from
// state that a late or delayed copy changes under it over-admits.

// The default holds of the order faults (Fault.Hold).
const (
	defaultLateHold      = 10 * time.Second
	defaultDuplicateHold = time.Second
	defaultReorderHold   = 500 * time.Millisecond
)

// hold is f.Hold, or the kind's default.
func (f *Fault) hold() time.Duration {
	if f.Hold > 0 {
		return f.Hold
	}
	switch f.Kind {
	case FaultLateWrite:
		return defaultLateHold
	case FaultDelayedDuplicate:
		return defaultDuplicateHold
	}
	return defaultReorderHold
}

type ctxKey int

const (
	sourceKey ctxKey = iota // the name given to Source
	arrivalKey
	copyKey // a delayed copy
)

// Source returns a handler that serves like r and names its callers source: a reorder fault
// reorders two writes of one source. Serve each client (each gateway process) on a listener of
// its own with its own Source, all sharing r. Calls that reach r directly have the source "".
func (r *Relay) Source(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), sourceKey, name)))
	})
}

func source(ctx context.Context) string {
	s, _ := ctx.Value(sourceKey).(string)
	return s
}

func arrival(ctx context.Context) int64 {
	n, _ := ctx.Value(arrivalKey).(int64)
	return n
}

// order is the relay's state of the order faults.
type order struct {
	mu     sync.Mutex
	next   int64          // arrivals so far: each call's arrival number
	held   []*heldWrite   // reorder: writes waiting for a later write of their source
	copies []*heldCopy    // delayed_duplicate: copies waiting for another write to their items
	bg     sync.WaitGroup // late writes and copies in flight
}

type heldWrite struct {
	source  string
	arrival int64
	release chan struct{}
}

type heldCopy struct {
	items map[Item]bool
	timer *time.Timer
	send  func()
}

// arrive numbers a call in the order calls arrived.
func (r *Relay) arrive(req *http.Request) *http.Request {
	r.ord.mu.Lock()
	r.ord.next++
	n := r.ord.next
	r.ord.mu.Unlock()
	return req.WithContext(context.WithValue(req.Context(), arrivalKey, n))
}

// landed is told of every write the server answered (but a delayed copy): it releases the writes held for a later
// write of the same source and sends the copies held for a write to one of their items.
func (r *Relay) landed(req *http.Request, items []Item) {
	if req.Context().Value(copyKey) != nil {
		return
	}
	src, n := source(req.Context()), arrival(req.Context())
	var send []func()
	r.ord.mu.Lock()
	held := r.ord.held[:0]
	for _, h := range r.ord.held {
		if h.source == src && n > h.arrival {
			close(h.release)
			continue
		}
		held = append(held, h)
	}
	clear(r.ord.held[len(held):])
	r.ord.held = held
	copies := r.ord.copies[:0]
	for _, c := range r.ord.copies {
		if c.touches(items) && c.timer.Stop() {
			send = append(send, c.send)
			continue
		}
		copies = append(copies, c)
	}
	clear(r.ord.copies[len(copies):])
	r.ord.copies = copies
	r.ord.mu.Unlock()
	for _, f := range send {
		go f() // bg counted when the copy was held
	}
}

func (c *heldCopy) touches(items []Item) bool {
	for _, it := range items {
		if c.items[it] {
			return true
		}
	}
	return false
}

// detached is a copy of req that outlives its client, with body as its body.
func detached(req *http.Request, body []byte) *http.Request {
	c := req.Clone(context.WithoutCancel(req.Context()))
	c.Body = io.NopCloser(bytes.NewReader(body))
	return c
}

// lateWrite serves a call that drew FaultLateWrite: it waits until the client gives up (its
// timeout closes the connection) or f's hold passes, then applies the write; the client never
// learns its outcome.
func (r *Relay) lateWrite(w http.ResponseWriter, req *http.Request, op string, body []byte, f *Fault) {
	late := detached(req, body)
	_ = r.sleep(req.Context(), f.hold()) // ends early when the client leaves
	r.countFault(FaultLateWrite)
	r.serve(httptest.NewRecorder(), late, op, body)
	if req.Context().Err() == nil {
		abort(w) // still there after the hold: it learns nothing all the same
	}
}

// delayedDuplicate serves a call that drew FaultDelayedDuplicate: it is applied and answered,
// and a copy is applied once another write to one of its items has landed (or f's hold passed).
func (r *Relay) delayedDuplicate(w http.ResponseWriter, req *http.Request, op string, body []byte, f *Fault) {
	items, err := writtenItems(op, body, r.keyAttr)
	// A copy landing sends no other copy: one fault, one extra write.
	cp := detached(req.WithContext(context.WithValue(req.Context(), copyKey, true)), body)
	r.serve(w, req, op, body)
	if err != nil || len(items) == 0 {
		return
	}
	c := &heldCopy{items: make(map[Item]bool, len(items))}
	for _, it := range items {
		c.items[it] = true
	}
	r.ord.bg.Add(1)
	c.send = func() {
		defer r.ord.bg.Done()
		r.countFault(FaultDelayedDuplicate)
		r.serve(httptest.NewRecorder(), cp, op, body)
	}
	r.ord.mu.Lock()
	c.timer = time.AfterFunc(f.hold(), func() {
		r.ord.mu.Lock()
		r.ord.copies = removeCopy(r.ord.copies, c)
		r.ord.mu.Unlock()
		c.send()
	})
	r.ord.copies = append(r.ord.copies, c)
	r.ord.mu.Unlock()
}

func removeCopy(cs []*heldCopy, c *heldCopy) []*heldCopy {
	for i, x := range cs {
		if x == c {
			return append(cs[:i], cs[i+1:]...)
		}
	}
	return cs
}

// reorder serves a call that drew FaultReorder: it is held until a write of the same source
// that arrived after it has landed, then applied and answered, so that the two land in the
// opposite order. Held past f's hold without one, it is applied as it is (not counted).
func (r *Relay) reorder(w http.ResponseWriter, req *http.Request, op string, body []byte, f *Fault) {
	h := &heldWrite{source: source(req.Context()), arrival: arrival(req.Context()), release: make(chan struct{})}
	r.ord.mu.Lock()
	r.ord.held = append(r.ord.held, h)
	r.ord.mu.Unlock()
	t := time.NewTimer(f.hold())
	defer t.Stop()
	select {
	case <-h.release:
		r.countFault(FaultReorder)
	case <-t.C:
		r.unhold(h)
	case <-req.Context().Done():
		r.unhold(h)
		return
	}
	r.serve(w, req, op, body)
}

func (r *Relay) unhold(h *heldWrite) {
	r.ord.mu.Lock()
	defer r.ord.mu.Unlock()
	for i, x := range r.ord.held {
		if x == h {
			r.ord.held = append(r.ord.held[:i], r.ord.held[i+1:]...)
			return
		}
	}
}

// Close sends every copy still held (delayed_duplicate) now and waits for them and for the late
// writes in flight, so that nothing reaches the server after it returns. The relay still serves
// afterwards; call it when its clients are done.
func (r *Relay) Close() {
	r.ord.mu.Lock()
	var send []func()
	for _, c := range r.ord.copies {
		if c.timer.Stop() {
			send = append(send, c.send)
		}
	}
	r.ord.copies = nil
	r.ord.mu.Unlock()
	for _, f := range send {
		go f()
	}
	r.ord.bg.Wait()
}
