package lease

import (
	"context"
	"errors"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Give-back: the unspent units of a grant returned to its item where that is exact.

// refundTimeout bounds a background refund of a lease.
const refundTimeout = 2 * time.Second

// refundLater gives the unspent units of gs back in the background, newest grant first: a token
// bucket's grant can go back only while nothing but our own give-backs wrote to its shard after
// it, so giving back the newest first lets the one before it go back too (the caller holds p.mu
// and has taken the units out of the pool).
func (p *pool) refundLater(gs ...grant) {
	var units int64
	for _, g := range gs {
		units += g.units
	}
	if units == 0 {
		return
	}
	if !p.ls.goTracked(func() {
		ctx, cancel := context.WithTimeout(context.Background(), refundTimeout)
		defer cancel()
		p.refundAll(ctx, gs)
	}) {
		p.ls.m.Units.WithLabelValues(unitsExpired).Add(float64(units))
	}
}

// refundAll gives the unspent units of gs (in the order they were taken) back, newest first. A
// token bucket's grant can go back only while the last write to its shard is its own lease
// write, or the give-back of the grant after it that went back whole (whose places then end
// where tat is): that give-back's id, left in lv, is what the next one conditions on. A chunk
// that is not its write's last, without such a give-back after it, is counted expired without
// a write.
func (p *pool) refundAll(ctx context.Context, gs []grant) {
	after := map[int]uint64{} // shard -> lv left by the give-back just made there, whole
	for i := len(gs) - 1; i >= 0; i-- {
		g := gs[i]
		mark, chained := after[g.shard]
		delete(after, g.shard)
		if chained {
			g.mark = mark
		} else if !g.last {
			p.ls.m.Units.WithLabelValues(unitsExpired).Add(float64(g.units))
			continue
		}
		if gid, ok := p.refundGrant(ctx, g); ok && p.gcra && g.units == g.size {
			after[g.shard] = gid
		}
	}
}

// Give-backs are retried, within refundTimeout, at most refundAttempts times: each attempt is
// sent once (no SDK retry), and re-sent with the same id, so a copy whose first answer was lost
// changes nothing (see refundGrant).
const (
	refundAttempts = 4
	refundBackoff  = 20 * time.Millisecond
)

// refundGrant gives g's unspent units back to its item, exactly or not at all, and counts them
// refunded or expired; for a token bucket it also returns the give-back's id, which it leaves in
// lv. A window's units are taken off its count (a counter's give-back, exact at any time: see
// Table.CountGiveBack). A token bucket's units are the last m places before g.end: they are given back
// only while lv still holds g.mark, the marker of our lease write (or of the give-back of the
// chunk after g), so that nothing wrote after us (GCRA forgets idle time, so after any other
// write, moving tat back could return refill the bucket had already lost to its cap, or hand out
// places another lease holds), by setting tat to g.tail - m*T, exactly as if they had never been
// leased, and lv to the give-back's own id. Otherwise the units are lost (counted as expired),
// which costs the pool capacity, never exactness.
//
// The outcome is settled by the give-back's own id only. Markers are unique and never written
// twice, so once anything wrote after our lease (a give-back of ours included), no copy of this
// give-back can land: a condition on tat alone could hold again (another lease of as many units
// puts tat back where ours ended). A failed condition whose item shows our id in lv says that an
// earlier attempt landed; one that shows another marker after an attempt whose answer was lost
// cannot tell (a later write replaced ours): the units are counted expired though they may have
// gone back, so the table is then roomier than counted, never the other way.
func (p *pool) refundGrant(ctx context.Context, g grant) (uint64, bool) {
	if g.units <= 0 {
		return g.mark, true
	}
	k := p.ls.turns.Park()
	p.give <- struct{}{}
	p.ls.turns.Resume(k)
	defer func() { <-p.give }()
	m := p.ls.m
	if !p.gcra {
		cg := p.ls.t.CountGiveBack(g.pk, g.units, "attribute_exists(#count)")
		for attempt := 1; ; attempt++ {
			done, landed, again := cg.Attempt(ctx)
			if done && landed {
				m.Units.WithLabelValues(unitsRefunded).Add(float64(g.units))
				return 0, true
			}
			if done || !again || attempt == refundAttempts || !p.sleep(ctx, time.Duration(p.ls.rnd.Int64N(int64(refundBackoff)<<attempt))) {
				m.Units.WithLabelValues(unitsExpired).Add(float64(g.units))
				return 0, false
			}
		}
	}
	t := p.shards[g.shard].t // immutable after newPool
	to := g.tail - g.units*t
	gid := p.ls.rnd.Marker()
	u := Update{
		Expr:   "SET #tat = :to, #lv = :gid",
		Cond:   "#tat = :end AND #lv = :lv",
		Names:  map[string]string{"#tat": schema.Tat, "#lv": schema.LeaseWrite},
		Values: map[string]types.AttributeValue{":to": schema.Num(to), ":end": schema.Num(g.end), ":lv": schema.Unum(g.mark), ":gid": schema.Unum(gid)},
	}
	for attempt := 1; ; attempt++ {
		err := p.ls.t.GiveBack(ctx, g.pk, u)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil || errors.As(err, &ccf) && leaseMark(ccf.Item) == gid:
			m.Units.WithLabelValues(unitsRefunded).Add(float64(g.units))
			p.mu.Lock()
			if sh := &p.shards[g.shard]; sh.tat == g.end {
				sh.tat = to
			}
			p.mu.Unlock()
			return gid, true
		case errors.As(err, &ccf):
			m.Units.WithLabelValues(unitsExpired).Add(float64(g.units))
			return 0, false
		}
		if attempt == refundAttempts || !p.sleep(ctx, time.Duration(p.ls.rnd.Int64N(int64(refundBackoff)<<attempt))) {
			// Never lost silently: counted as expired (it may have landed: then the table is
			// roomier than we count, never the other way).
			m.Units.WithLabelValues(unitsExpired).Add(float64(g.units))
			return 0, false
		}
	}
}

// leaseMark is the marker in a shard item's lv (0 when there is none).
func leaseMark(item map[string]types.AttributeValue) uint64 {
	v, _, _ := schema.Number(item, schema.LeaseWrite)
	return uint64(v)
}

// sleep waits d, or until ctx ends: false then.
func (p *pool) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	k := p.ls.turns.Park()
	defer p.ls.turns.Resume(k)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
