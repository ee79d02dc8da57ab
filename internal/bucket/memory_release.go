package bucket

import (
	"context"
	"time"
)

// Release implements Releaser: each charge is given back under its shard's lock (see
// Store.Release for what is given back, and GCRARefundN for a token bucket's rule). A key that is
// no longer stored (idle and swept, or evicted) has nothing to give back. It never fails, and
// ignores ctx: a slot must come back even when the request's context has ended, and the work is
// a few lock-protected writes.
//
// A rejected group needs no give-back here: Take evaluates a whole group under the locks of all
// its shards and commits nothing unless the group is admitted.
func (m *Memory) Release(_ context.Context, _ time.Time, taken []Taken) error {
	for i := range taken {
		tk := &taken[i]
		sh := &m.shards[m.shardOf(tk.Charge.Key)]
		sh.mu.Lock()
		// A concurrency slot, the release of every request under a concurrency limit, is
		// given back here; refunds (charge_on, rarer and heavier) go through release.
		if tk.Charge.Limit.Algorithm == Concurrency {
			sh.releaseSlot(&tk.Charge.Key)
		} else {
			sh.release(tk)
		}
		// A key at its limit may no longer be: a full shard must look again before it refuses
		// a new key.
		sh.fullUntil = 0
		sh.mu.Unlock()
	}
	return nil
}

// releaseSlot frees one concurrency slot of k. The caller holds sh.mu.
func (sh *shard) releaseSlot(k *Key) {
	if i, ok := sh.conc.find(k); ok {
		// A key with nothing in flight stays until the next sweep (it is idle then): a busy
		// key is not deleted and inserted again on every request.
		e := &sh.conc.slots[i].st
		e.n = ConcurrentRelease(e.n-concStored) + concStored
	}
}

// release refunds one charge of an algorithm other than Concurrency. The caller holds sh.mu.
func (sh *shard) release(tk *Taken) {
	c := &tk.Charge
	switch c.Limit.Algorithm {
	case TokenBucket:
		if i, ok := sh.gcra.find(&c.Key); ok {
			e := &sh.gcra.slots[i].st
			e.tat, _ = GCRARefundN(e.tat, int64(tk.Token), c.Limit, c.N())
		}
	case FixedWindow:
		if i, ok := sh.fixed.find(&c.Key); ok {
			e := &sh.fixed.slots[i].st
			e.FixedState, _ = FixedRefundN(e.FixedState, tk.At.UnixNano(), c.Limit, c.N())
		}
	case Quota:
		if i, ok := sh.fixed.find(&c.Key); ok {
			e := &sh.fixed.slots[i].st
			e.FixedState, _ = QuotaRefundN(e.FixedState, tk.At.UnixNano(), c.Limit, c.N())
		}
	case SlidingWindow:
		st, ok := sh.slidingState(c.Key)
		if ok && st.refund(tk.At.UnixNano(), &c.Limit, c.N()) {
			sh.storeSliding(c.Key, &st, c.Limit.Count, c.Limit.Count-c.N())
		}
	}
}
