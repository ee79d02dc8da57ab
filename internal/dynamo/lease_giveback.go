package dynamo

import (
	"context"
	"errors"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Give-back: the unspent units of a grant returned to its item where that is exact.

// refundTimeout bounds a background refund of a lease.
const refundTimeout = 2 * time.Second

// refundLater gives g's unspent units back in the background (the caller holds p.mu and has
// taken them out of the pool).
func (p *pool) refundLater(g grant) {
	if !p.ls.goTracked(func() {
		ctx, cancel := context.WithTimeout(context.Background(), refundTimeout)
		defer cancel()
		p.refundGrant(ctx, g)
	}) {
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
	}
}

// refundGrant gives g's unspent units back to its item. A window's units are taken off its count
// (ADD -m on the window's own item: exact at any time). A token bucket's units are the last m
// places before g.end: they are given back only while tat is still g.end (nobody leased after
// us; since unchanged), by setting tat to g.end - m*T, exactly as if they had never been leased.
// Otherwise other leasePools sit after them and moving tat back would hand their places out twice;
// the units are then lost (counted as expired), which costs the pool capacity, never exactness.
func (p *pool) refundGrant(ctx context.Context, g grant) {
	var u update
	if p.gcra {
		t := p.shards[g.shard].t // immutable after newPool
		u = update{
			expr:   "SET #tat = :to",
			cond:   "#tat = :end AND attribute_not_exists(#since)",
			names:  map[string]string{"#tat": attrTat, "#since": attrSince},
			values: map[string]types.AttributeValue{":to": num(g.tail - g.units*t), ":end": num(g.end)},
		}
		if g.epoch.present {
			u.cond = "#tat = :end AND #since = :since"
			u.values[":since"] = num(g.epoch.v)
		}
	} else {
		u = update{
			expr:   "ADD #count :minus",
			cond:   "attribute_exists(#count)",
			names:  map[string]string{"#count": attrCount},
			values: map[string]types.AttributeValue{":minus": num(-g.units)},
		}
	}
	// The GCRA refund is conditional on the value it replaces, so a retry cannot apply twice;
	// the window's ADD is not, so it gets one attempt (throttling aside: a throttled write was
	// not applied).
	var err error
	if p.gcra {
		_, err = p.ls.s.updateItem(ctx, opLeaseRefund, g.pk, u, types.ReturnValueNone)
	} else {
		_, err = p.ls.s.updateItem(ctx, opLeaseRefund, g.pk, u, types.ReturnValueNone, noRetry)
	}
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		p.ls.s.m.leaseUnits.WithLabelValues(unitsRefunded).Add(float64(g.units))
		if p.gcra {
			p.mu.Lock()
			if sh := &p.shards[g.shard]; sh.tat == g.end {
				sh.tat = g.tail - g.units*sh.t
			}
			p.mu.Unlock()
		}
	case errors.As(err, &ccf):
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
	default:
		p.ls.s.m.errors.WithLabelValues(opLeaseRefund).Inc()
		p.ls.s.m.leaseUnits.WithLabelValues(unitsExpired).Add(float64(g.units))
	}
}
