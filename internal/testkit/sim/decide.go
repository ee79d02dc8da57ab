package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The driver's agenda, and a decision's life: started, ended, judged, followed up.

// The agenda: events the driver runs at their instants (console reads, restarts, releases).
type event struct {
	at      time.Time
	seq     int
	f       func()
	restart bool
}

type agenda []*event

func (a agenda) Len() int { return len(a) }
func (a agenda) Less(i, j int) bool {
	if !a[i].at.Equal(a[j].at) {
		return a[i].at.Before(a[j].at)
	}
	return a[i].seq < a[j].seq
}
func (a agenda) Swap(i, j int) { a[i], a[j] = a[j], a[i] }
func (a *agenda) Push(x any)   { *a = append(*a, x.(*event)) }
func (a *agenda) Pop() any {
	old := *a
	e := old[len(old)-1]
	*a = old[:len(old)-1]
	return e
}

func (a *agenda) due(now time.Time) (*event, bool) {
	if len(*a) == 0 || (*a)[0].at.After(now) {
		return nil, false
	}
	return heap.Pop(a).(*event), true
}

func (a *agenda) next() (time.Time, bool) {
	if len(*a) == 0 {
		return time.Time{}, false
	}
	return (*a)[0].at, true
}

func (a *agenda) dropRestarts() {
	kept := (*a)[:0]
	for _, e := range *a {
		if !e.restart {
			kept = append(kept, e)
		}
	}
	*a = kept
	heap.Init(a)
}

func (w *world) at(t time.Time, f func()) *event {
	w.seq++
	e := &event{at: t, seq: w.seq, f: f}
	heap.Push(&w.agenda, e)
	return e
}

// decision is one request's rate-limit decision.
type decision struct {
	id      int
	rep     *replica
	inc     int
	pols    []*simPolicy
	charges []bucket.Charge
	exempt  []bool
	results []bucket.Result
	// start and end bound the decision on the true clock; now is the replica's reading.
	start, end, now time.Time
	admitted        bool
	err             error
}

// decide starts a decision on a live replica.
func (w *world) decide() {
	var live []*replica
	for _, r := range w.reps {
		if r.alive {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		w.advance()
		return
	}
	r := live[w.rng.IntN(len(live))]
	g := groups[w.rng.IntN(len(groups))]
	d := &decision{id: w.started, rep: r, inc: r.inc}
	value := keyValues[w.rng.IntN(len(keyValues))]
	for _, name := range g {
		p := policyByName(name)
		if p.lease && r.backend == backendMemory {
			continue
		}
		c, _, _, err := w.set.KeyCharge(name, value)
		if err != nil {
			panic(err)
		}
		if p.limit.Kind != 0 || p.conc == 0 { // costs: mostly 1, sometimes up to 3
			if w.rng.IntN(4) == 0 && p.conc == 0 {
				c.Cost = 1 + w.rng.Int64N(3)
			}
		}
		d.pols = append(d.pols, p)
		d.charges = append(d.charges, c)
	}
	if len(d.charges) == 0 {
		return
	}
	w.started++
	w.inflight++
	d.start = time.Now()
	d.now = d.start.Add(r.offset)
	d.exempt = make([]bool, len(d.charges))
	var charged []bucket.Charge
	var idx []int
	for i, c := range d.charges {
		if exp, ok := r.exempt[c.Key.String()]; ok && d.now.Before(exp) {
			d.exempt[i] = true
			continue
		}
		charged = append(charged, c)
		idx = append(idx, i)
	}
	d.results = make([]bucket.Result, len(d.charges))
	w.record("decide %d r%d %s %v costs %v exempt %v", d.id, r.id, value, g, costs(d.charges), d.exempt)
	store := r.store
	// Deadlines a fraction of a millisecond apart: decisions started at one instant do not
	// all wake at once.
	timeout := storeTimeout + time.Duration(w.rng.Int64N(int64(time.Millisecond)))
	w.turns.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		res := make([]bucket.Result, len(charged))
		admitted, err := true, error(nil)
		if len(charged) > 0 {
			admitted, err = store.Take(ctx, d.now, charged, res)
		}
		for j, i := range idx {
			d.results[i] = res[j]
		}
		d.admitted, d.err, d.end = admitted && err == nil, err, time.Now()
		w.mu.Lock()
		w.ended = append(w.ended, d)
		w.mu.Unlock()
	})
}

func costs(cs []bucket.Charge) []int64 {
	out := make([]int64, len(cs))
	for i := range cs {
		out[i] = cs[i].N()
	}
	return out
}

// collect records the decisions that ended, in the order they were started, and schedules
// what follows an admission: a concurrency slot's release when its request ends, a charge_on
// give-back when its answer is not charged.
func (w *world) collect() {
	w.mu.Lock()
	ended := w.ended
	w.ended = nil
	w.mu.Unlock()
	sort.Slice(ended, func(i, j int) bool { return ended[i].id < ended[j].id })
	for _, r := range w.reps {
		w.mu.Lock()
		ex := r.pendingExempt
		r.pendingExempt = nil
		w.mu.Unlock()
		if ex != nil {
			r.exempt = ex
		}
	}
	for _, d := range ended {
		w.inflight--
		if d.inc != d.rep.inc {
			w.record("decided %d r%d lost with its replica", d.id, d.rep.id)
			continue // its replica crashed meanwhile: its answer went nowhere
		}
		switch {
		case d.err != nil:
			w.res.Errors++
		case d.admitted:
			w.res.Admitted++
		default:
			w.res.Rejected++
		}
		w.record("decided %d r%d admitted %v err %v %s", d.id, d.rep.id, d.admitted, errKind(d.err), results(d))
		w.judge.decided(d)
		if d.admitted {
			w.followUp(d)
		}
	}
}

func results(d *decision) string {
	s := ""
	for i, r := range d.results {
		s += fmt.Sprintf("[%v %d]", r.Allowed, r.Remaining)
		_ = i
	}
	return s
}

// followUp schedules an admitted decision's releases.
func (w *world) followUp(d *decision) {
	var give []bucket.Taken
	var conc []bucket.Taken
	for i, c := range d.charges {
		if d.exempt[i] || !d.results[i].Allowed || c.Shadow {
			continue
		}
		t := bucket.Taken{Charge: c, At: d.now, Token: d.results[i].Token}
		switch {
		case d.pols[i].conc > 0:
			conc = append(conc, t)
		case d.pols[i].refund && w.rng.IntN(3) == 0:
			give = append(give, t)
		}
	}
	if len(give) > 0 {
		w.judge.givenBack(d, give)
		w.at(d.end.Add(time.Duration(w.rng.Int64N(int64(300*time.Millisecond)))), func() { w.release(d, give, "give back") })
	}
	if len(conc) > 0 {
		hold := time.Duration(w.rng.Int64N(int64(time.Second)))
		if w.rng.IntN(20) == 0 {
			hold += slotLease // a request that outlives its slot's lease without renewals... renewed
		}
		w.at(d.end.Add(hold), func() {
			w.judge.exited(d, time.Now())
			w.release(d, conc, "release")
		})
	}
}

// release gives taken back on d's replica, if it still runs the incarnation that took them.
func (w *world) release(d *decision, taken []bucket.Taken, what string) {
	r := d.rep
	if !r.alive || r.inc != d.inc {
		w.record("%s %d r%d: replica gone", what, d.id, r.id)
		return
	}
	w.record("%s %d r%d", what, d.id, r.id)
	store := r.store
	now := time.Now().Add(r.offset)
	w.goTrack(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*storeTimeout)
		defer cancel()
		_ = store.Release(ctx, now, taken)
	})
}

// errKind is a decision error's gist for the history.
func errKind(err error) string {
	switch {
	case err == nil:
		return "none"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, errTransport):
		return "transport"
	case errors.Is(err, dynamo.ErrThrottled):
		return "throttled"
	}
	return mask(err.Error())
}
