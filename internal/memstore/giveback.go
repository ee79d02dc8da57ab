package memstore

import (
	"context"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Release implements Releaser: each charge is given back under its shard's lock (see
// Store.Release for what is given back, and GCRAGiveBackN for a token bucket's rule). A key that is
// no longer stored (idle and swept, or evicted) has nothing to give back. It never fails, and
// ignores ctx: a slot must come back even when the request's context has ended, and the work is
// a few lock-protected writes.
//
// A rejected group needs no give-back here: Take evaluates a whole group under the locks of all
// its shards and commits nothing unless the group is admitted.
func (m *Store) Release(_ context.Context, _ time.Time, taken []bucket.Taken) error {
	for i := range taken {
		tk := &taken[i]
		if tk.Token&sketchToken != 0 {
			m.giveBackSketch(tk)
			continue
		}
		sh := &m.shards[m.shardOf(tk.Charge.Key)]
		sh.mu.Lock()
		// A concurrency slot, given back by every request under a concurrency limit, goes
		// back here; the other give-backs (charge_on, rarer and heavier) go through giveBack.
		if tk.Charge.Limit.Algorithm == bucket.Concurrency {
			sh.giveBackSlot(&tk.Charge.Key, tk.Token)
		} else {
			m.giveBack(&sh.shard, tk)
		}
		// A key at its limit may no longer be: a full shard must look again before it sends
		// a new key to the sketch.
		sh.fullUntil = 0
		clear(sh.poolFull)
		sh.mu.Unlock()
	}
	return nil
}

// giveBackSlot frees one concurrency slot of k, taken in the entry whose generation token
// names: a slot of an entry since evicted (and perhaps created again) is not taken from the new
// one's count. The caller holds sh.mu.
func (sh *shard) giveBackSlot(k *bucket.Key, token uint64) {
	if i, ok := sh.conc.find(k); ok && genToken(sh.conc.slots[i].st.meta) == token {
		// A key with nothing in flight stays until the next sweep (it is idle then): a busy
		// key is not deleted and inserted again on every request.
		e := &sh.conc.slots[i].st
		e.n = bucket.ConcurrentGiveBack(e.n-concStored) + concStored
	}
}

// giveBack gives back one charge of an algorithm other than Concurrency, only to the entry it was
// counted in: the token carries the entry's generation (and a token bucket's, the tat its write
// left), so a give-back after the entry was evicted and created again finds another generation
// and gives nothing, where it once subtracted from a count it never added. The caller holds
// sh.mu.
func (m *Store) giveBack(sh *shard, tk *bucket.Taken) {
	c := &tk.Charge
	switch c.Limit.Algorithm {
	case bucket.TokenBucket:
		if i, ok := sh.gcra.find(&c.Key); ok {
			if e := &sh.gcra.slots[i].st; m.gcraToken(e.meta, e.tat) == tk.Token {
				e.tat, _ = bucket.GCRAGiveBackN(e.tat, e.tat, c.Limit, c.N())
			}
		}
	case bucket.FixedWindow:
		if i, ok := sh.fixed.find(&c.Key); ok && genToken(sh.fixed.slots[i].st.meta) == tk.Token {
			e := &sh.fixed.slots[i].st
			e.FixedState, _ = bucket.FixedGiveBackN(e.FixedState, tk.At.UnixNano(), c.Limit, c.N())
		}
	case bucket.Quota:
		if i, ok := sh.fixed.find(&c.Key); ok && genToken(sh.fixed.slots[i].st.meta) == tk.Token {
			e := &sh.fixed.slots[i].st
			e.FixedState, _ = bucket.QuotaGiveBackN(e.FixedState, tk.At.UnixNano(), c.Limit, c.N())
		}
	case bucket.SlidingWindow:
		if st, meta, ok := sh.slidingState(c.Key); ok && genToken(meta) == tk.Token {
			if st, ok = bucket.SlidingGiveBackN(st, tk.At.UnixNano(), c.Limit, c.N()); ok {
				sh.storeSliding(c.Key, &st, c.Limit.Count, c.Limit.Count-c.N(), meta)
			}
		}
	}
}
