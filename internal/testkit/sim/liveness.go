package sim

import (
	"context"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// liveness: once the faults have healed, every policy admits a request on every replica within
// livenessWithin (windows roll over, slots of crashed replicas expire and are reaped, stranded
// leases expire). The calls are delivered as they come, in the deterministic order.
func (w *world) liveness() {
	w.idle(slotLease) // what the faults left behind expires
	for _, r := range w.reps {
		for i := range policies {
			p := &policies[i]
			if p.lease && r.backend == backendMemory {
				continue
			}
			c, _, _, err := w.set.KeyCharge(p.name, keyValues[0])
			if err != nil {
				panic(err)
			}
			deadline := time.Now().Add(livenessWithin)
			ok := false
			for !ok && time.Now().Before(deadline) {
				ok = w.probe(r, p, c)
				if !ok {
					w.idle(200 * time.Millisecond)
				}
			}
			w.record("liveness r%d %s admitted %v", r.id, p.name, ok)
			if !ok {
				w.judge.violate("liveness: r%d never admitted %s within %s of the faults healing", r.id, p.name, livenessWithin)
			}
		}
	}
}

// probe makes one decision of c on r, delivering every call until it ends.
func (w *world) probe(r *replica, p *simPolicy, c bucket.Charge) bool {
	type out struct {
		ok   bool
		res  bucket.Result
		done bool
	}
	var o out
	start := time.Now()
	now := start.Add(r.offset)
	store := r.store
	w.goTrack(func() {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		res := make([]bucket.Result, 1)
		ok, err := store.Take(ctx, now, []bucket.Charge{c}, res)
		w.mu.Lock()
		o = out{ok: ok && err == nil, res: res[0], done: true}
		w.mu.Unlock()
	})
	for {
		w.settle()
		w.mu.Lock()
		done := o.done
		w.mu.Unlock()
		if done {
			break
		}
		if pending := w.sortedPending(); len(pending) > 0 {
			w.deliver(pending[0], deliverOK)
			continue
		}
		if ev, ok := w.agenda.due(time.Now()); ok {
			ev.f()
			continue
		}
		time.Sleep(time.Millisecond)
	}
	if o.ok {
		d := &decision{id: -1, rep: r, inc: r.inc, pols: []*simPolicy{p}, charges: []bucket.Charge{c}, exempt: []bool{false},
			results: []bucket.Result{o.res}, start: start, end: time.Now(), now: now, admitted: true}
		w.judge.decided(d)
		if p.conc > 0 {
			w.judge.exited(d, time.Now())
			w.release(d, []bucket.Taken{{Charge: c, At: now, Token: o.res.Token}}, "release")
		}
	}
	return o.ok
}

// idle lets d of simulated time pass with no new decisions: the agenda's events run and every
// call is delivered as it comes.
func (w *world) idle(d time.Duration) {
	end := time.Now().Add(d)
	for {
		w.settle()
		if ev, ok := w.agenda.due(time.Now()); ok {
			ev.f()
			continue
		}
		if pending := w.sortedPending(); len(pending) > 0 {
			w.deliver(pending[0], deliverOK)
			continue
		}
		now := time.Now()
		if !now.Before(end) {
			return
		}
		next := end
		if at, ok := w.agenda.next(); ok && at.Before(next) {
			next = at
		}
		time.Sleep(max(next.Sub(now), time.Microsecond))
	}
}
