package proxy

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// storeCtx is the context handed to Limiter.Take: the request's context with the StoreTimeout
// deadline. context.WithTimeout would start a timer and register a child with the request's
// context on every request, although the memory store never waits (it only asks Err). storeCtx
// does the same lazily: Deadline and Err answer from the deadline and the parent without any of
// that, and the first call to Done (a store that actually waits, such as DynamoDB's HTTP client)
// builds the real context.WithDeadline, which every later call delegates to. So the memory path
// costs one small allocation instead of a timer and three, and a waiting store gets exactly the
// standard context (child contexts derived from it attach to the real one through Value, without
// a goroutine).
type storeCtx struct {
	parent   context.Context
	deadline time.Time
	// parentBound: the deadline is the parent's (a gRPC call's grpc-timeout), not StoreTimeout.
	parentBound bool

	mu   sync.Mutex                  // serialises materialising
	real atomic.Pointer[materialCtx] // nil until Done is first called: read without the lock
}

// materialCtx is the real context of a storeCtx whose Done was called, and its cancel.
type materialCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newStoreCtx(parent context.Context, deadline time.Time) *storeCtx {
	c := new(storeCtx)
	c.init(parent, deadline)
	return c
}

// init (re)starts c for one Take. Only a storeCtx that was never materialised may be reused
// (see reusable): nobody can hold its Done channel, and Limiter.Take does not keep ctx after it
// returns.
func (c *storeCtx) init(parent context.Context, deadline time.Time) {
	c.parentBound = false
	if d, ok := parent.Deadline(); ok && !d.After(deadline) {
		deadline = d
		c.parentBound = true
	}
	c.parent, c.deadline = parent, deadline
}

// reusable reports whether c may be initialised again after release: true unless Done was called,
// in which case a timer, a child context or a goroutine may still refer to it.
func (c *storeCtx) reusable() bool { return c.materialised() == nil }

// timedOut reports, for a Take that ended at end, whether c had run out of time: the same as
// errors.Is(c.Err(), context.DeadlineExceeded) but without reading the clock again.
func (c *storeCtx) timedOut(end time.Time) bool {
	err := c.parent.Err()
	if r := c.materialised(); r != nil {
		err = r.Err()
	}
	if err != nil {
		return errors.Is(err, context.DeadlineExceeded)
	}
	return !end.Before(c.deadline)
}

// materialised returns the real context, or nil before Done was called.
func (c *storeCtx) materialised() context.Context {
	if m := c.real.Load(); m != nil {
		return m.ctx
	}
	return nil
}

func (c *storeCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *storeCtx) Done() <-chan struct{} {
	if m := c.real.Load(); m != nil {
		return m.ctx.Done()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.real.Load()
	if m == nil {
		m = new(materialCtx)
		m.ctx, m.cancel = context.WithDeadline(c.parent, c.deadline)
		c.real.Store(m)
	}
	return m.ctx.Done()
}

// Err reports the parent's error, else DeadlineExceeded once the deadline has passed. Once Done
// was called it is the real context's Err, so Err and Done agree.
func (c *storeCtx) Err() error {
	if r := c.materialised(); r != nil {
		return r.Err()
	}
	if err := c.parent.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// Value delegates to the real context once it exists: the context package finds a parent's
// cancellation through Value, and must find the one whose Done channel it was given.
func (c *storeCtx) Value(key any) any {
	if r := c.materialised(); r != nil {
		return r.Value(key)
	}
	return c.parent.Value(key)
}

// release ends the context after Take returned, stopping the real context's timer if there is one.
func (c *storeCtx) release() {
	if m := c.real.Load(); m != nil {
		m.cancel()
	}
}
