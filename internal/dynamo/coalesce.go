package dynamo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// maxBatch caps the charges of one weighted write, so that its arithmetic and the time a waiter
// may stay queued stay bounded; waiters past the cap go in the next batch.
const maxBatch = 128

// maxBatchRounds bounds the failed conditions of one batch. A condition fails only when
// another writer (a replica, a refund) changed the item since this batch learnt its value, so
// failures cannot go on without others making progress; but another replica draining its own
// queue in small writes can win several rounds in a row (4 was seen to be too few with two
// replicas on one hot item), and giving up fails every charge of the batch. The deadline of
// the batch's context bounds the time.
const maxBatchRounds = 16

// compactAfter is how many waiters that left while queued a queue keeps before it is compacted
// (when they are also at least half of it).
const compactAfter = 64

// coalescer keeps at most one conditional write in flight per item (pk). The charges that
// arrive for an item while its write is in flight queue, and go out together as one weighted
// write when it returns (group commit). It is safe for concurrent use.
type coalescer struct {
	mu    sync.Mutex
	items map[string]*itemQueue // an entry exists while a writer goroutine runs for the pk
}

// itemQueue is the charges waiting for one item's next write, in arrival order.
type itemQueue struct {
	queue []*waiter
	left  int // waiters in queue that left before being taken
	// throttled counts this item's throttled writes, so that a waiter whose deadline passes
	// while they were retried fails as throttled, not as a store timeout.
	throttled atomic.Int64
}

// waiter is one charge waiting for its item's write. The writer reads its request fields and
// writes its outcome fields; the Take that queued it reads the outcome only after done is
// closed, and touches nothing of it once it has left.
type waiter struct {
	ctx context.Context
	n   int64
	c   bucket.Charge
	t   int64 // GCRA emission interval and tolerance
	tau int64
	// Sliding window: the current slot and the counted slots' counts before the request.
	cur    int64
	counts slotCounts

	done chan struct{} // closed when the outcome is set
	// throttledBefore is its item's throttled count when it was queued.
	throttledBefore int64

	// Guarded by coalescer.mu.
	q    *itemQueue
	b    *batch // the batch it was taken into; nil while queued
	gone bool   // its Take stopped waiting

	// Outcome, set by the writer before done is closed.
	applied, decided bool
	wid              uint64 // the marker of the GCRA write that applied it
	result           bucket.Result
	err              error
}

// batch is the charges of one item that share its writes: same pk, same Limit, same cost (and
// for a sliding window the same closed-slot sum, which its condition depends on).
type batch struct {
	pk     string
	key    bucket.Key
	l      bucket.Limit
	cost   int64 // what each charge spends: m charges add m*cost units
	t, tau int64
	avail  int64 // windows: the count the current window or slot may still reach
	cur    int64
	n      int64 // the batch instant: the latest now among its charges
	ws     []*waiter
	ctx    context.Context
	cancel context.CancelFunc
	live   int // waiters still waiting (guarded by coalescer.mu)
}

// itemState is what a batch knows or assumes of its item: a tat or a count, or that the
// attribute is absent; and for a sliding window's slot whether it is sealed.
type itemState struct {
	v       int64
	present bool
	sealed  bool
}

func compatible(a, b *waiter) bool {
	return a.c.Limit == b.c.Limit && a.c.N() == b.c.N() &&
		(a.c.Limit.Algorithm != bucket.SlidingWindow || a.counts.closed() == b.counts.closed())
}

// applyCoalesced queues the undecided ops' charges on their items' writers and waits until
// each is decided or ctx ends. A charge whose Take leaves while its batch is being written may
// still be applied; the Take reports the context error and does not refund it, which only
// makes the limit stricter.
func (s *Store) applyCoalesced(ctx context.Context, ops []op, n int64) {
	type queued struct {
		o *op
		w *waiter
	}
	var qs []queued
	var start []string
	s.co.mu.Lock()
	for i := range ops {
		o := &ops[i]
		if !undecided(o) {
			continue
		}
		o.coalesced = true
		w := &waiter{ctx: ctx, n: n, c: o.c, t: o.t, tau: o.tau, cur: o.cur, counts: o.counts, done: make(chan struct{})}
		q, running := s.co.items[o.pk]
		if !running {
			q = &itemQueue{}
			s.co.items[o.pk] = q
			start = append(start, o.pk)
		}
		w.q, w.throttledBefore = q, q.throttled.Load()
		q.queue = append(q.queue, w)
		qs = append(qs, queued{o, w})
	}
	s.co.mu.Unlock()
	for _, pk := range start {
		s.turns.Go(func() { s.writeLoop(pk) })
	}
	for i, q := range qs {
		k := s.turns.Park()
		select {
		case <-q.w.done:
			s.turns.Resume(k)
			q.o.take(q.w)
			continue
		case <-ctx.Done():
		}
		s.turns.Resume(k)
		// Out of time: keep the outcomes already there, leave every other queue.
		for _, q := range qs[i:] {
			select {
			case <-q.w.done:
				q.o.take(q.w)
			default:
				s.co.leave(q.w)
				q.o.err = fmt.Errorf("dynamo: update %s: %w", q.o.pk, ctx.Err())
				if q.w.q.throttled.Load() > q.w.throttledBefore {
					q.o.err = fmt.Errorf("dynamo: update %s: %w: waited for writes DynamoDB throttled: %w", q.o.pk, ErrThrottled, ctx.Err())
				}
			}
		}
		return
	}
}

// take copies the writer's outcome for w into o.
func (o *op) take(w *waiter) {
	o.applied, o.done, o.result, o.err, o.wid = w.applied, w.decided, w.result, w.err, w.wid
}

// leave takes w out of its queue, or out of its batch's count of waiters, whose write is
// cancelled when nobody waits for it any more.
func (co *coalescer) leave(w *waiter) {
	co.mu.Lock()
	defer co.mu.Unlock()
	if w.gone {
		return
	}
	w.gone = true
	if w.b != nil {
		if w.b.live--; w.b.live == 0 {
			w.b.cancel()
		}
		return
	}
	q := w.q
	if q.left++; q.left >= compactAfter && 2*q.left >= len(q.queue) {
		q.compact()
	}
}

// compact drops the waiters that left.
func (q *itemQueue) compact() {
	rest := q.queue[:0]
	for _, w := range q.queue {
		if !w.gone {
			rest = append(rest, w)
		}
	}
	clear(q.queue[len(rest):])
	q.queue, q.left = rest, 0
}

// next takes the next batch out of q: the first waiter still waiting and, in arrival order,
// up to maxBatch-1 more compatible with it. Called with coalescer.mu held.
func (q *itemQueue) next() []*waiter {
	var ws []*waiter
	rest := q.queue[:0]
	for _, w := range q.queue {
		switch {
		case w.gone:
		case len(ws) < maxBatch && (len(ws) == 0 || compatible(ws[0], w)):
			ws = append(ws, w)
		default:
			rest = append(rest, w)
		}
	}
	clear(q.queue[len(rest):])
	q.queue, q.left = rest, 0
	return ws
}

// writeLoop writes the batches of item pk until its queue is empty. It is the only goroutine
// writing pk for this Store, so this process's writes to an item never overtake each other.
func (s *Store) writeLoop(pk string) {
	for {
		s.co.mu.Lock()
		q := s.co.items[pk]
		ws := q.next()
		if len(ws) == 0 {
			delete(s.co.items, pk)
			s.co.mu.Unlock()
			return
		}
		b := newBatch(pk, ws)
		b.ctx = context.WithValue(b.ctx, throttleCounter{}, &q.throttled)
		for _, w := range ws {
			w.b = b
		}
		s.co.mu.Unlock()

		s.m.batchCharges.Observe(float64(len(ws)))
		s.runBatch(b)
		b.cancel()
		for _, w := range ws {
			close(w.done)
		}
	}
}

// newBatch builds the batch of ws. Its writes must not end because the request that happened
// to come first left, so they run under a context that keeps the values of the waiter with
// the latest deadline but not its cancellation, carries that deadline, and is cancelled when
// every waiter has left.
func newBatch(pk string, ws []*waiter) *batch {
	w0 := ws[0]
	b := &batch{pk: pk, key: w0.c.Key, l: w0.c.Limit, cost: w0.c.N(), t: w0.t, tau: w0.tau, cur: w0.cur, ws: ws, live: len(ws)}
	switch b.l.Algorithm {
	case bucket.FixedWindow, bucket.Quota:
		b.avail = b.l.Count
	case bucket.SlidingWindow:
		b.avail = b.l.Count - w0.counts.closed()
	}
	base := w0.ctx
	var latest time.Time
	bounded := true
	for _, w := range ws {
		b.n = max(b.n, w.n)
		d, ok := w.ctx.Deadline()
		if !ok {
			bounded = false
		} else if d.After(latest) {
			latest, base = d, w.ctx
		}
	}
	if bounded {
		b.ctx, b.cancel = context.WithDeadline(context.WithoutCancel(base), latest)
	} else {
		b.ctx, b.cancel = context.WithCancel(context.WithoutCancel(base))
	}
	return b
}

// runBatch decides every charge of b with weighted conditional writes: each write applies the
// first m undecided charges (arrival order) at once, m being how many fit in what b knows of
// the item. A failed condition returns the item (ALL_OLD), which makes m exact for the next
// write; a charge is rejected only from a value DynamoDB returned. It is the bucket package's
// arithmetic applied to the charges one after another at instant b.n.
func (s *Store) runBatch(b *batch) {
	pending := b.ws
	var st itemState // what the item holds, assumed until observed
	if isGCRA(b.l) {
		if tat, ok := s.hints.get(b.key, b.n); ok {
			st = itemState{v: tat, present: true}
		}
	}
	observed := false
	fail := func(err error) {
		for _, w := range pending {
			w.err = err
		}
		pending = nil
	}
	// Only failed conditions count against maxBatchRounds: a write that is applied decides at
	// least one charge, so those are bounded by the batch's size.
	for failed := 0; len(pending) > 0; {
		m := b.fit(st, len(pending))
		if m == 0 {
			if observed {
				for _, w := range pending {
					w.result, w.decided = b.rejected(w, st), true
				}
				break
			}
			m = 1 // assumed full: one charge asks DynamoDB
		}
		if failed == maxBatchRounds {
			fail(fmt.Errorf("dynamo: update %s: %w", b.pk, ErrContention))
			break
		}
		wid := s.rnd.Marker()
		// Sent once (noRetry): re-sent after a lost answer, the batch would be counted twice.
		out, err := s.updateItem(b.ctx, opUpdate, b.pk, b.write(st, m, wid), types.ReturnValueAllNew, noRetry)
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) && isGCRA(b.l) && chainPos(ccf.Item, wid) > 0 {
			// The answer came from a second copy of our write, and the first landed: applied
			// (once). Others may have written since: the results computed from the item's
			// value then say less remains, never more.
			out, err = &dynamodb.UpdateItemOutput{Attributes: ccf.Item}, nil
		}
		switch {
		case err == nil:
			after, err := b.state(out.Attributes)
			if err == nil && !after.present {
				err = errors.New("no value after the write")
			}
			if err != nil {
				fail(fmt.Errorf("dynamo: update %s: %w", b.pk, err))
				break
			}
			before := after.v - int64(m)*b.unit()
			for i, w := range pending[:m] {
				w.applied, w.decided, w.wid = true, true, wid
				w.result = b.admitted(w, before, int64(i))
			}
			pending = pending[m:]
			st, observed = after, true
		case errors.As(err, &ccf):
			if st, err = b.state(ccf.Item); err != nil {
				fail(fmt.Errorf("dynamo: update %s: %w", b.pk, err))
				break
			}
			observed = true
			if st.sealed {
				// No write to this slot will ever be applied again: every charge still
				// pending is rejected (the ones applied by earlier writes stay applied).
				for _, w := range pending {
					w.result, w.decided = b.rejected(w, st), true
				}
				pending = nil
				break
			}
			failed++
		default:
			s.m.errors.WithLabelValues(opUpdate).Inc()
			fail(fmt.Errorf("dynamo: update %s: %w", b.pk, err))
		}
	}
	if isGCRA(b.l) && observed && st.present && st.v > b.n {
		// The next batch assumes this tat: with one writer per item it is exact unless other
		// replicas or refunds moved it, which one failed condition corrects.
		s.hints.put(b.key, st.v, st.v, b.n)
	}
}

// unit is what one charge adds to the item: cost*T for GCRA, cost for a counter.
func (b *batch) unit() int64 {
	if isGCRA(b.l) {
		return b.cost * b.t
	}
	return b.cost
}

// state reads the item's value from a write's returned attributes (nil: the item is absent).
func (b *batch) state(item map[string]types.AttributeValue) (itemState, error) {
	name := schema.Count
	if isGCRA(b.l) {
		name = schema.Tat
	}
	v, ok, err := schema.Number(item, name)
	_, sealed := item[attrSealed]
	return itemState{v: v, present: ok, sealed: sealed}, err
}

// gcraTat is the tat the bucket package's functions take for st (absent = fresh).
func (b *batch) gcraTat(st itemState) int64 {
	if !st.present {
		return b.n
	}
	return st.v
}

// fit returns how many of k charges conform one after another at b.n, given st.
func (b *batch) fit(st itemState, k int) int {
	if isGCRA(b.l) {
		tat, m := b.gcraTat(st), 0
		for ; m < k; m++ {
			next, r := bucket.GCRAN(tat, b.n, b.l, b.cost)
			if !r.Allowed {
				break
			}
			tat = next
		}
		return m
	}
	room := b.avail
	if st.present {
		room -= st.v
	}
	return int(min(max(room, 0)/b.cost, int64(k)))
}

// write returns the conditional write of m charges (u = m*cost units), given st. GCRA: SET
// tat = n + u*T when the bucket is idle (tat absent or < n; u*T <= tau by fit), else SET tat =
// tat + u*T while tat <= n + tau - u*T, leaving the marker wid. Counters: ADD count u while
// count <= avail - u.
func (b *batch) write(st itemState, m int, wid uint64) update {
	k := int64(m) * b.cost
	switch b.l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		idle := (!st.present || st.v < b.n) && k <= b.tau/b.t
		return gcraWrite(b.n, b.t, b.tau, k, !idle, wid)
	case bucket.FixedWindow, bucket.Quota:
		return countWrite(b.avail, k, schema.TTLAt(fixedEnd(b.l, b.n)), false)
	default: // SlidingWindow
		return countWrite(b.avail, k, schema.TTLAt(leaves(b.l, b.cur)), true)
	}
}

// admitted is the result of the charge at position i of a write applied to the value before.
func (b *batch) admitted(w *waiter, before, i int64) bucket.Result {
	switch u := i * b.unit(); b.l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return gcraResult(b.l, before+u, b.n, b.cost)
	case bucket.FixedWindow, bucket.Quota:
		return fixedResult(b.l, before+u, b.n, b.cost)
	default:
		c := w.counts
		c[k] = before + u
		return slidingResult(b.l, b.cur, &c, b.n, b.cost)
	}
}

// rejected is the result of a charge that does not conform to st (or whose slot is sealed).
func (b *batch) rejected(w *waiter, st itemState) bucket.Result {
	switch b.l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return gcraResult(b.l, b.gcraTat(st), b.n, b.cost)
	case bucket.FixedWindow, bucket.Quota:
		// fit found no room for cost: more than Count-cost are counted.
		return fixedResult(b.l, max(st.v, b.l.Count-b.cost+1), b.n, b.cost)
	default:
		c := w.counts
		c[k] = st.v
		if st.sealed {
			return sealedResult(b.l, b.cur, &c, b.n, b.cost)
		}
		return slidingResult(b.l, b.cur, &c, b.n, b.cost)
	}
}
