package memstore

import (
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// takeOne is Take for a group of one charge, the common case, without the group bookkeeping.
// Each algorithm has its own branch so that no pending value (about 100 bytes, mostly the
// sliding window's counters) is zeroed and copied per decision: for a token bucket that copy
// was about a third of the decision's cost.
func (m *Store) takeOne(c *bucket.Charge, now int64, r *bucket.Result) bool {
	sh := &m.shards[m.shardOf(c.Key)]
	sh.mu.Lock()
	switch c.Limit.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		i, existed := sh.gcra.find(&c.Key)
		var e gcraEntry
		if existed {
			e = sh.gcra.slots[i].st
		}
		e.tat, e.room = bucket.GCRAInto(e.tat, now, c.Limit.Rate, c.Limit.Burst, c.Limit.Algorithm, c.N(), r)
		if r.Allowed {
			stored := true
			if existed {
				sh.gcra.slots[i].st = e
			} else if e.meta, stored = m.admitNew(&sh.shard, c, now, r); stored {
				sh.gcra.insertNew(&c.Key, &e)
			}
			if stored {
				r.Token = m.gcraToken(e.meta, e.tat)
			}
		}
	case bucket.FixedWindow, bucket.Quota:
		// A quota's state is a FixedState that ends at the next period start: it shares the
		// fixed windows' table (keys of different policies never collide).
		i, existed := sh.fixed.find(&c.Key)
		var e fixedEntry
		if existed {
			e = sh.fixed.slots[i].st
		}
		if c.Limit.Algorithm == bucket.Quota {
			e.FixedState, *r = bucket.QuotaN(e.FixedState, now, c.Limit, c.N())
		} else {
			e.FixedState, *r = bucket.FixedN(e.FixedState, now, c.Limit, c.N())
		}
		if r.Allowed {
			e.room = c.Limit.Count - c.N()
			stored := true
			if existed {
				sh.fixed.slots[i].st = e
			} else if e.meta, stored = m.admitNew(&sh.shard, c, now, r); stored {
				sh.fixed.insertNew(&c.Key, &e)
			}
			if stored {
				r.Token = genToken(e.meta)
			}
		}
	default: // SlidingWindow; Take has checked the algorithm and sent Concurrency to takeSlot
		m.takeSliding(&sh.shard, c, now, r)
	}
	sh.mu.Unlock()
	return r.Allowed || c.Shadow
}

// takeSlot is takeOne for a concurrency charge. A slot count needs no clock: now is converted
// only when a new key is stored (a sweep that makes room for it needs the instant), not on
// every request. With Release's giveBackSlot this is the whole limiter cost of a request under
// a concurrency limit, so it is kept to one lookup and one write under the shard's lock.
func (m *Store) takeSlot(c *bucket.Charge, now time.Time, r *bucket.Result) bool {
	sh := &m.shards[m.shardOf(c.Key)]
	sh.mu.Lock()
	i, existed := sh.conc.find(&c.Key)
	e := concEntry{n: concStored, count: c.Limit.Count}
	if existed {
		e.n, e.meta = sh.conc.slots[i].st.n, sh.conc.slots[i].st.meta
	}
	if bucket.ConcurrentInto(e.n-concStored, c.Limit.Count, r) {
		e.n++
		if existed {
			sh.conc.slots[i].st = e
			r.Token = genToken(e.meta)
		} else if meta, ok := m.admitNew(&sh.shard, c, now.UnixNano(), r); ok {
			e.meta = meta
			sh.conc.insertNew(&c.Key, &e)
			r.Token = genToken(meta)
		}
	}
	sh.mu.Unlock()
	return r.Allowed || c.Shadow
}

// takeSliding is takeOne for a sliding window. The common case, a key in compact form (or a new
// key) under a Count that fits it, is decided in the compact table; the rest goes through a
// SlidingState. The caller holds sh.mu.
//
// A stored key of the same width is decided where it lies. When now is in its newest slot (or
// before it, after a clock stepped back) the ring needs no moving, and decide writes it only to
// count a request it takes: nothing is copied out and back. Otherwise the ring is moved to
// now's slot on a copy, which replaces the stored state only if the request is taken (a ring
// moved for a rejected request would forget slots that a clock stepping back still counts);
// when every counted request has left, which is where a key of many clients (each seen now and
// then) usually is, the copy is a fresh ring and the old counters are not read at all.
func (m *Store) takeSliding(sh *shard, c *bucket.Charge, now int64, r *bucket.Result) {
	if c.Limit.Count > maxCompactCount {
		m.takeWide(sh, c, now, r)
		return
	}
	w, count, n := bucket.SlotWidth(c.Limit.Window), c.Limit.Count, c.N()
	room := uint16(max(count-n, 0)) // count <= 65535 here
	i, existed := sh.sliding.find(&c.Key)
	if existed {
		if p := &sh.sliding.slots[i].st; p.width() == w {
			p.room = room
			if now-p.slot*w < w {
				bucket.SlidingDecide(&p.counts, p.slot, now, w, count, n, r)
				if r.Allowed {
					r.Token = genToken(p.meta())
				}
				return
			}
			cur := bucket.FloorDiv(now, w)
			if cur-p.slot >= bucket.SlidingRing && n <= count {
				meta := p.meta()
				*p = admitFresh(cur, now, w, count, n, p.tag, r)
				p.room = room
				p.setMeta(meta)
				r.Token = genToken(meta)
				return
			}
			st := compactSliding{slot: cur, tag: p.tag, room: room, gen: p.gen, pool: p.pool}
			if cur-p.slot < bucket.SlidingRing {
				st = *p
				bucket.SlidingRotate(&st.counts, &st.slot, cur)
			}
			bucket.SlidingDecide(&st.counts, st.slot, now, w, count, n, r)
			if r.Allowed {
				*p = st
				r.Token = genToken(st.meta())
			}
			return
		}
	}
	// A fresh state, as SlidingState.take starts one for a new key or another width; a key
	// kept wide must be read from there instead, and a width without a tag stays wide.
	tag, ok := widthTag(w)
	if !ok {
		m.takeWide(sh, c, now, r)
		return
	}
	if _, wide := sh.wide[c.Key]; !existed && wide {
		m.takeWide(sh, c, now, r)
		return
	}
	cur := bucket.FloorDiv(now, w)
	if n > count {
		st := compactSliding{slot: cur, tag: tag}
		bucket.SlidingDecide(&st.counts, st.slot, now, w, count, n, r) // a rejection: nothing to store
		return
	}
	st := admitFresh(cur, now, w, count, n, tag, r)
	st.room = room
	if existed {
		st.setMeta(sh.sliding.slots[i].st.meta())
		sh.sliding.slots[i].st = st
	} else if meta, ok := m.admitNew(sh, c, now, r); ok {
		st.setMeta(meta)
		sh.sliding.insertNew(&c.Key, &st)
	} else {
		return
	}
	r.Token = genToken(st.meta())
}

// admitFresh is decide on an empty ring (every counter 0) at slot cur of width w, for a request
// that fits (n <= count): it returns the ring with n counted in slot cur and sets r, without
// summing eleven zeros.
func admitFresh(cur, now, w, count, n int64, tag uint16, r *bucket.Result) compactSliding {
	st := compactSliding{slot: cur, tag: tag}
	st.counts[bucket.SlidingIndex(cur)] = uint16(n)
	*r = bucket.Result{Allowed: true, Limit: count, Remaining: count - n, Reset: time.Duration((cur+bucket.SlidingRing)*w - now)}
	return st
}

// admitNew makes room for c's new key in sh and returns the new entry's meta, counted in c's
// pool: after making room (the pool's share first: a pool at its share makes room from its own
// keys, so that the shard's sweep does not take it from another pool's). When the sketch still
// counts c's key, or the pool's share or the shard has no room (every key that could go is at
// its limit), c is judged in the sketch instead, r becomes that verdict, and admitNew reports
// false. A sweep moves a table's keys: the caller inserts with insertNew, which probes again.
// The caller holds sh.mu.
func (m *Store) admitNew(sh *shard, c *bucket.Charge, now int64, r *bucket.Result) (uint64, bool) {
	if m.sk.active(kindOf(c.Limit.Algorithm), now) {
		m.sk.mu.Lock()
		in := m.inSketch(c, now)
		m.sk.mu.Unlock()
		if in {
			m.takeSketch(c, now, r)
			return 0, false
		}
	}
	p := m.poolIndex(c.Pool)
	if n := m.Pools(); !sh.poolRoom(now, p, n) || !sh.makeRoom(now, share(sh.maxKeys, n)) {
		m.takeSketch(c, now, r)
		return 0, false
	}
	return sh.admit(p), true
}

// takeWide decides a sliding-window charge through a SlidingState, whichever map holds the key,
// and stores the new state in the form it fits. The caller holds sh.mu.
func (m *Store) takeWide(sh *shard, c *bucket.Charge, now int64, r *bucket.Result) {
	st, meta, existed := sh.slidingState(c.Key)
	st.TakeInto(now, &c.Limit, c.N(), r)
	if !r.Allowed {
		return
	}
	if !existed {
		var ok bool
		if meta, ok = m.admitNew(sh, c, now, r); !ok {
			return
		}
	}
	sh.storeSliding(c.Key, &st, c.Limit.Count, c.Limit.Count-c.N(), meta)
	r.Token = genToken(meta)
}
