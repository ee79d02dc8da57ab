package dynamo

import (
	"context"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Refund mode: every charge written on its own (or coalesced), applied writes undone when the
// group is rejected.

// refundWrite undoes an applied write of o; false when it cannot be undone safely (a GCRA write
// whose epoch is unknown), which leaves the limit stricter.
func (o *op) refundWrite() (update, bool) {
	if isSlot(o) {
		return slotRelease(o.slot), true
	}
	if isGCRA(o.c.Limit) {
		// A form (a) write since ours discarded our charge with the old tat: then the refund
		// must not take T off the charges after it.
		u := update{
			expr:   "SET #tat = #tat - :t",
			cond:   "attribute_exists(#tat) AND attribute_not_exists(#since)",
			names:  map[string]string{"#tat": attrTat, "#since": attrSince},
			values: map[string]types.AttributeValue{":t": num(o.c.N() * o.t)},
		}
		if o.epoch.present {
			u.cond = "attribute_exists(#tat) AND #since = :since"
			u.values[":since"] = num(o.epoch.v)
		}
		return u, o.epoch.known
	}
	return update{
		expr:   "ADD #count :minus",
		cond:   "attribute_exists(#count)",
		names:  map[string]string{"#count": attrCount},
		values: map[string]types.AttributeValue{":minus": num(-o.c.N())},
	}, true
}

// each runs f on every op that still needs its write, concurrently when there are several.
func each(ops []op, want func(*op) bool, f func(*op)) {
	var pending []*op
	for i := range ops {
		if want(&ops[i]) {
			pending = append(pending, &ops[i])
		}
	}
	if len(pending) == 1 {
		f(pending[0])
		return
	}
	var wg sync.WaitGroup
	for _, o := range pending {
		wg.Go(func() { f(o) })
	}
	wg.Wait()
}

func undecided(o *op) bool { return !o.done && o.err == nil }

// takeRefund writes every charge concurrently and refunds the applied ones when the group is
// rejected or a write failed. In Refund mode the writes are coalesced per item; Transaction
// mode sends the groups it does not transact one write per charge.
func (s *Store) takeRefund(ctx context.Context, ops []op, n int64) (bool, error) {
	if s.mode == Refund {
		s.applyCoalesced(ctx, ops, n)
	} else {
		each(ops, undecided, func(o *op) { s.apply(ctx, o, n) })
	}
	return s.settle(ctx, ops)
}

// settle decides the group from its ops' outcomes and refunds applied writes of a group that is
// not admitted.
func (s *Store) settle(ctx context.Context, ops []op) (bool, error) {
	admitted := true
	var firstErr error
	for i := range ops {
		o := &ops[i]
		if o.err != nil && firstErr == nil {
			firstErr = o.err
		}
		if !o.c.Shadow && !o.result.Allowed {
			admitted = false
		}
	}
	if firstErr != nil || !admitted {
		s.refund(ctx, ops)
	}
	return admitted && firstErr == nil, firstErr
}

// refund undoes the applied writes, best effort, each with one attempt (no SDK retry: a refund
// is not idempotent, and a 500 or a reset connection may follow an applied write; a refund lost
// instead only leaves the limit stricter). The refunds run under the decision's context, so a
// decision never outlives its deadline and leaves nothing running behind it; a decision that
// ran out of time therefore leaves its applied charges spent, which is stricter, never looser.
func (s *Store) refund(ctx context.Context, ops []op) {
	each(ops, func(o *op) bool { return o.applied }, func(o *op) {
		o.applied = false // tried once, never twice
		u, ok := o.refundWrite()
		if !ok {
			return
		}
		if _, err := s.updateItem(ctx, opRefund, o.pk, u, types.ReturnValueNone, noRetry); err != nil {
			s.m.errors.WithLabelValues(opRefund).Inc()
		}
	})
}
