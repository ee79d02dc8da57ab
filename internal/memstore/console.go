package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Peek returns a key's state at instant now without charging it: what an operator's console
// shows. The Result reads as a charge's would, but describes the key before any request:
// Remaining is how many requests of cost 1 would conform at now (what X-RateLimit-Remaining said
// to the last request answered at now), Allowed whether one more would, RetryAfter (when it would
// not) when it will, and Reset when the key is full again. c.Cost is ignored: the peek is for a
// request of cost 1. A key the store does not hold is full, unless the sketch still counts it
// (then it reads as the sketch would judge it). It never fails but for a canceled ctx.
func (m *Store) Peek(ctx context.Context, now time.Time, c bucket.Charge) (bucket.Result, error) {
	if err := ctx.Err(); err != nil {
		return bucket.Result{}, fmt.Errorf("memstore: peek: %w", err)
	}
	if a := c.Limit.Algorithm; a < bucket.TokenBucket || a > bucket.Quota {
		return bucket.Result{}, fmt.Errorf("memstore: peek: unknown algorithm %d", a)
	}
	c.Cost = 1
	ns := now.UnixNano()
	sh := &m.shards[m.shardOf(c.Key)]
	var (
		p   pending
		r   bucket.Result
		tat int64
	)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.has(&c) && m.sk.active(kindOf(c.Limit.Algorithm), ns) {
		// A key judged in the sketch shows what the sketch would judge it by.
		m.sk.mu.Lock()
		var idx [sketchDepth]int
		st := m.sk.read(&c, m.poolIndex(c.Pool), ns, &idx)
		m.sk.mu.Unlock()
		if !st.fresh(&c, ns) {
			judge(&c, st, ns, &r)
			return peeked(&c, r, st.v, ns), nil
		}
	}
	sh.eval(&c, ns, &p, nil, &r)
	if c.Limit.Algorithm == bucket.TokenBucket || c.Limit.Algorithm == bucket.LeakyBucket {
		e, _ := sh.gcra.get(&c.Key)
		tat = e.tat
	}
	return peeked(&c, r, tat, ns), nil
}

// peeked turns the verdict of a cost-1 charge evaluated (not committed) at now into the key's
// state before it: an admitted charge's Remaining counted itself out, and a GCRA key's Reset is
// its tat (the charge's would be one emission interval later). tat is the stored GCRA state, 0
// for other algorithms.
func peeked(c *bucket.Charge, r bucket.Result, tat, now int64) bucket.Result {
	r.Token, r.Wait = 0, 0
	if r.Allowed {
		r.Remaining++
		r.RetryAfter = 0
	}
	if a := c.Limit.Algorithm; a == bucket.TokenBucket || a == bucket.LeakyBucket {
		r.Reset = time.Duration(max(tat-now, 0))
	}
	return r
}

// Reset forgets c's key (every kind of state the memory store keeps for it: bucket, window,
// sliding window and concurrency slots), so that its next request finds it full. Requests in
// flight under a concurrency limit at the reset give their slots back to nothing (the key starts
// from zero): until they end, the key may have up to Count more in flight. A charge_on give-back
// of a charge taken before the reset is lost, which never makes the key roomier than full. A key
// judged in the sketch (see sketch.go) is not reset: its cells are shared with other
// keys, and lowering them could let those past their limits. It never fails but for a canceled
// ctx.
func (m *Store) Reset(ctx context.Context, _ time.Time, c bucket.Charge) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: reset: %w", err)
	}
	sh := &m.shards[m.shardOf(c.Key)]
	sh.mu.Lock()
	// Every entry removed gives its place in its pool's share back (issue 32 item 5: a reset
	// that did not left the pool counting keys it no longer held, until its new keys all
	// overflowed).
	if i, ok := sh.gcra.find(&c.Key); ok {
		sh.leave(sh.gcra.slots[i].st.meta)
		sh.gcra.deleteAt(i)
	}
	if i, ok := sh.fixed.find(&c.Key); ok {
		sh.leave(sh.fixed.slots[i].st.meta)
		sh.fixed.deleteAt(i)
	}
	if i, ok := sh.sliding.find(&c.Key); ok {
		sh.leave(sh.sliding.slots[i].st.meta())
		sh.sliding.deleteAt(i)
	}
	if e, ok := sh.wide[c.Key]; ok {
		sh.leave(e.meta)
		delete(sh.wide, c.Key)
	}
	if i, ok := sh.conc.find(&c.Key); ok {
		sh.leave(sh.conc.slots[i].st.meta)
		sh.conc.deleteAt(i)
	}
	sh.mu.Unlock()
	return nil
}

// leave uncounts an entry that leaves the shard other than by a sweep (which records itself
// when the shard or the pool is full): the shard and the entry's pool may have room again, so
// neither may go on reading full until an instant a sweep computed. The caller holds sh.mu and
// deletes the entry.
func (sh *shard) leave(meta uint64) {
	sh.forget(meta)
	sh.fullUntil = 0
	delete(sh.poolFull, metaPool(meta))
}
