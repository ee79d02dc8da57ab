package dynamo

import (
	"context"
	"sync"
)

// Refund mode: every charge written on its own (or coalesced), applied writes undone when the
// group is rejected.

// each runs f on every op that still needs its write, concurrently when there are several.
func (s *Store) each(ops []op, want func(*op) bool, f func(*op)) {
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
		s.turns.GoWG(&wg, func() { f(o) })
	}
	s.turns.Wait(&wg)
}

func undecided(o *op) bool { return !o.done && o.err == nil }

// takeRefund writes every charge concurrently and refunds the applied ones when the group is
// rejected or a write failed. In Refund mode the writes are coalesced per item; Transaction
// mode sends the groups it does not transact one write per charge.
func (s *Store) takeRefund(ctx context.Context, ops []op, n int64) (bool, error) {
	if s.mode == Refund {
		s.applyCoalesced(ctx, ops, n)
	} else {
		s.each(ops, undecided, func(o *op) { s.apply(ctx, o, n) })
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

// refund gives back the applied writes of a group that is not admitted (see giveback.go): each
// give-back is idempotent and retried within the decision's context, so a decision never
// outlives its deadline and leaves nothing running behind it; a decision that ran out of time
// therefore leaves what it could not give back spent, which is stricter, never looser.
func (s *Store) refund(ctx context.Context, ops []op) {
	s.each(ops, func(o *op) bool { return o.applied }, func(o *op) {
		o.applied = false // given back once
		switch {
		case isSlot(o):
			s.slotGiveBack(ctx, opRefund, o.pk, o.slot)
		case isGCRA(o.c.Limit):
			if o.wid != 0 { // else its write is unknown: stricter
				s.gcraGiveBack(ctx, opRefund, o.pk, o.c.N()*o.t, o.wid)
			}
		default:
			s.countGiveBack(ctx, opRefund, o.pk, o.c.N(), "attribute_exists(#count)")
		}
	})
}
