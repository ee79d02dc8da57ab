package dynamo

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Give-back: the unspent units of a grant returned to its item where that is exact.

// refundTimeout bounds a background refund of a lease.
const refundTimeout = 2 * time.Second

// refundLater gives the unspent units of gs back in the background, newest grant first: a token
// bucket's grant can go back only while it is the last lease of its shard, so giving back the
// newest first lets the one before it go back too (the caller holds p.mu and has taken the
// units out of the pool).
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
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(units))
	}
}

// refundAll gives the unspent units of gs (in the order they were taken) back, newest first. A
// chunk that is not its write's last can go back only once the chunk after it went back whole
// (its places then end where tat is): otherwise it is counted expired without a write.
func (p *pool) refundAll(ctx context.Context, gs []grant) {
	next := map[uint64]bool{} // write -> the chunk after the one at hand went back whole
	for i := len(gs) - 1; i >= 0; i-- {
		g := gs[i]
		if !g.last && !next[g.write] {
			p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
			continue
		}
		next[g.write] = p.refundGrant(ctx, g) && g.units == g.size
	}
}

// Give-backs are retried, within refundTimeout, at most refundAttempts times: each attempt is
// idempotent (see refundGrant), so a re-sent one whose first answer was lost changes nothing.
const (
	refundAttempts = 4
	refundBackoff  = 20 * time.Millisecond
)

// refundGrant gives g's unspent units back to its item, exactly or not at all, and counts them
// refunded or expired. A window's units are taken off its count (ADD -m on the window's own item:
// exact at any time). A token bucket's units are the last m places before g.end: they are given
// back only while tat is still g.end and since unchanged (nobody leased after us: GCRA forgets
// idle time, so after any other write, moving tat back could return refill the bucket had already
// lost to its cap, or hand out places another lease holds), by setting tat to g.tail - m*T,
// exactly as if they had never been leased. Otherwise the units are lost (counted as expired),
// which costs the pool capacity, never exactness.
//
// Sending it twice is safe. The token bucket's write is conditional on the tat it replaces, which
// it changes. The window's carries a marker: the attribute r<store id> holds the sequence number
// of this Store's last give-back applied to the item, and the write applies only while that is
// lower than its own (a pool's give-backs are serial: p.giveMu). A re-sent give-back whose first
// attempt landed then fails its condition, and the item it returns (ALL_OLD) shows whether ours
// landed: the marker is our number (window), tat is where we set it with our since (token bucket).
func (p *pool) refundGrant(ctx context.Context, g grant) bool {
	if g.units <= 0 {
		return true
	}
	p.giveMu.Lock()
	defer p.giveMu.Unlock()
	var u update
	var landed func(old map[string]types.AttributeValue) bool
	if p.gcra {
		t := p.shards[g.shard].t // immutable after newPool
		to := g.tail - g.units*t
		u = update{
			expr:   "SET #tat = :to",
			cond:   "#tat = :end AND attribute_not_exists(#since)",
			names:  map[string]string{"#tat": attrTat, "#since": attrSince},
			values: map[string]types.AttributeValue{":to": num(to), ":end": num(g.end)},
		}
		if g.epoch.present {
			u.cond = "#tat = :end AND #since = :since"
			u.values[":since"] = num(g.epoch.v)
		}
		landed = func(old map[string]types.AttributeValue) bool {
			tat, ok, _ := number(old, attrTat)
			e, _ := epochOf(old)
			return ok && tat == to && e.present == g.epoch.present && (!e.present || e.v == g.epoch.v)
		}
	} else {
		seq := p.ls.giveSeq.Add(1)
		u = update{
			expr:   "ADD #count :minus SET #r = :seq",
			cond:   "attribute_exists(#count) AND (attribute_not_exists(#r) OR #r < :seq)",
			names:  map[string]string{"#count": attrCount, "#r": p.ls.marker},
			values: map[string]types.AttributeValue{":minus": num(-g.units), ":seq": num(seq)},
		}
		landed = func(old map[string]types.AttributeValue) bool {
			r, ok, _ := number(old, p.ls.marker)
			return ok && r == seq
		}
	}
	m := p.ls.s.m
	for attempt := 1; ; attempt++ {
		_, err := p.ls.s.updateItem(ctx, opLeaseRefund, g.pk, u, types.ReturnValueNone)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil || errors.As(err, &ccf) && landed(ccf.Item):
			m.leaseUnits.WithLabelValues(unitsRefunded).Add(float64(g.units))
			if p.gcra {
				p.mu.Lock()
				if sh := &p.shards[g.shard]; sh.tat == g.end {
					sh.tat = g.tail - g.units*sh.t
				}
				p.mu.Unlock()
			}
			return true
		case errors.As(err, &ccf):
			m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
			return false
		}
		m.errors.WithLabelValues(opLeaseRefund).Inc()
		if attempt == refundAttempts || !sleepCtx(ctx, time.Duration(rand.Int64N(int64(refundBackoff)<<attempt))) {
			// Never lost silently: counted as expired (it may have landed: then the table is
			// roomier than we count, never the other way) and as an error.
			m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
			return false
		}
	}
}

// sleepCtx waits d, or until ctx ends: false then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
