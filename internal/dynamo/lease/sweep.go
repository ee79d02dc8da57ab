package lease

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// Sweeping: grants expire, idle pools give their units back and are forgotten, and close gives
// everything back.

// leaseIdle is how long a pool that has neither demand nor grants is kept, in TTLs.
const leaseIdle = 20

// expire drops the grants past their TTL at n; their unspent units are given back to the
// table where that is still exact (see refundGrant). A spent grant stays until it expires, so
// that a unit of a rejected group can still go back to it (giveBack).
func (p *pool) expire(n int64) {
	keep := p.grants[:0]
	for _, g := range p.grants {
		switch {
		case g.expires >= n:
			keep = append(keep, g)
		case g.units > 0 && !g.last:
			// A chunk with later ones of its write still live: their places follow its
			// own, so its units cannot go back.
			p.hold(-g.units)
			p.ls.m.Units.WithLabelValues(unitsExpired).Add(float64(g.units))
		case g.units > 0:
			p.hold(-g.units)
			p.refundLater(g)
		}
	}
	clear(p.grants[len(keep):])
	p.grants = keep
}

// sweeper gives back the units of pools that stopped seeing demand (a policy reloaded away, a
// client gone quiet) before their grants expire, and forgets pools idle for long.
func (ls *Pools) sweeper() {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		k := ls.turns.Park()
		select {
		case <-ls.stop:
			ls.turns.Resume(k)
			return
		case <-tick.C:
			ls.turns.Resume(k)
			ls.sweep(ls.now().UnixNano())
		}
	}
}

// sweepEvery is how often the sweeper looks at the pools.
const sweepEvery = 25 * time.Millisecond

// sweep is one pass of the sweeper at instant n.
func (ls *Pools) sweep(n int64) {
	for _, p := range ls.list() {
		p.mu.Lock()
		p.expire(n)
		// Requests waiting for a slow renewal are demand, not idleness: their grant must not
		// be given back before they wake to spend it. A TTL without a request is idleness.
		idle := p.waiting == 0 && !p.renewing() && n-p.lastUse > p.ttl
		if idle && p.units > 0 {
			p.releaseAll()
		}
		if n-p.lastUse > leaseIdle*max(p.ttl, int64(time.Second)) && len(p.grants) == 0 && !p.renewing() {
			// Marked under p.mu, so that a request that found the pool before it was removed
			// (and waits for p.mu) looks again rather than lease into a pool nobody sweeps
			// or closes any more. p.mu before ls.mu, as in startRenewal.
			p.forgotten = true
			ls.mu.Lock()
			if ls.pools[p.key] == p {
				delete(ls.pools, p.key)
			}
			ls.mu.Unlock()
		}
		p.mu.Unlock()
	}
}

// list returns the pools as they are now, oldest first: the sweeps and the close then give
// back in the same order every run (the simulator, internal/testkit/sim, repeats a seed only
// so), not in a map's.
func (ls *Pools) list() []*pool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	pools := make([]*pool, 0, len(ls.pools))
	for _, p := range ls.pools {
		pools = append(pools, p)
	}
	slices.SortFunc(pools, func(a, b *pool) int { return cmp.Compare(a.seq, b.seq) })
	return pools
}

// releaseAll takes every grant out of the pool and gives its units back (the caller holds p.mu).
func (p *pool) releaseAll() {
	var gs []grant
	for _, g := range p.grants {
		if g.units > 0 {
			p.hold(-g.units)
			gs = append(gs, g)
		}
	}
	p.refundLater(gs...)
	clear(p.grants)
	p.grants = p.grants[:0]
}

// Close stops the sweeper, waits for the renewals in flight and gives every unspent unit back,
// bounded by ctx. Leased charges after it fail.
func (ls *Pools) Close(ctx context.Context) error {
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		return nil
	}
	ls.closed = true
	close(ls.stop)
	ls.mu.Unlock()
	pools := ls.list() // complete: no pool is created once closed
	// Renewals in flight first (no new one starts once closed): their grants join the pools',
	// so that each pool's grants go back newest first (see refundLater).
	for _, p := range pools {
		p.mu.Lock()
		inflight := slices.Clone(p.inflight)
		p.mu.Unlock()
		for _, r := range inflight {
			k := ls.turns.Park()
			select {
			case <-r.done:
			case <-ctx.Done():
			}
			ls.turns.Resume(k)
		}
	}
	for _, p := range pools {
		p.mu.Lock()
		p.releaseAll()
		p.mu.Unlock()
	}
	ls.mu.Lock()
	ls.draining = true
	ls.mu.Unlock()
	done := make(chan struct{})
	ls.turns.Go(func() {
		ls.turns.Wait(&ls.wg)
		// Renewals that were in flight may have added grants since.
		for _, p := range pools {
			p.mu.Lock()
			grants := p.grants
			p.grants = nil
			p.hold(-p.units)
			p.mu.Unlock()
			var gs []grant
			for _, g := range grants {
				if g.units > 0 {
					gs = append(gs, g)
				}
			}
			rctx, cancel := context.WithTimeout(context.Background(), refundTimeout)
			p.refundAll(rctx, gs)
			cancel()
		}
		close(done)
	})
	k := ls.turns.Park()
	select {
	case <-done:
		ls.turns.Resume(k)
		return nil
	case <-ctx.Done():
		ls.turns.Resume(k)
		return fmt.Errorf("dynamo: close: giving Pools back: %w", ctx.Err())
	}
}
