package dynamo

import (
	"context"
	"errors"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Refund mode: every charge written on its own (or coalesced), applied writes undone when the
// group is rejected.

// refundWrite undoes an applied counter or slot write of o (GCRA writes: see gcraGiveBack).
func (o *op) refundWrite() update {
	if isSlot(o) {
		return slotRelease(o.slot)
	}
	return update{
		expr:   "ADD #count :minus",
		cond:   "attribute_exists(#count)",
		names:  map[string]string{"#count": attrCount},
		values: map[string]types.AttributeValue{":minus": num(-o.c.N())},
	}
}

// The give-back rule of a token or leaky bucket. A charge A of cost N added d = N*T to tat.
// Every later write i at instant t_i did tat = max(tat, t_i) + m_i*T. In a bucket that never saw
// A, the same writes leave tat lower by d_i = min(d_{i-1}, max(0, tat_{i-1} - t_i)) (tat_{i-1}
// the real tat before write i): the difference shrinks whenever a write found the A-less bucket
// idle, which a write that found the real bucket busy does not show (the example: A at
// 0 s, B at 0.5 s with burst 2 at 1/s leaves 2 s where a bucket without A has 1.5 s). So taking
// d off tat is exact only while nothing wrote since A; after other writes, exactly the smallest
// of d and their slacks tat_{i-1} - t_i can go back.
//
// Each GCRA item keeps a chain of its last chainLen charge writes (pushChain): w1 the marker of
// the latest, c1 its slack (tat - now before it; idleCert when it found the bucket idle), w2 and
// c2 the one before, and so on. A give-back of A finds A's write in the chain at position j and
// gives back g = min(d, c1, ..., c_{j-1}) in one write conditioned on A still being at j and
// those slacks still at least g: SET tat = tat - g, and c_i = c_i - d for the later writes
// (their slacks in the bucket without A are at least that much smaller: d at most, so
// subtracting d keeps every later give-back on the safe side). A charge whose write left the
// chain, or came before a write that found the bucket idle, gives nothing back: stricter,
// never looser. The charges of one coalesced write are one write at one instant: each can be
// given back, in any order.

// gcraRefund is the give-back of g of a charge of d = N*T whose write (marker wid) is at
// position pos of the chain.
func gcraRefund(d, g int64, pos int, wid uint64) update {
	u := update{
		expr:   "SET #tat = #tat - :t",
		cond:   "#wp = :w",
		names:  map[string]string{"#tat": attrTat, "#wp": chainW(pos)},
		values: map[string]types.AttributeValue{":t": num(g), ":w": unum(wid)},
	}
	if pos > 1 {
		u.values[":d"] = num(d)
	}
	for i := 1; i < pos; i++ {
		c := "#" + chainC(i)
		u.names[c] = chainC(i)
		u.cond += " AND " + c + " >= :t"
		u.expr += ", " + c + " = " + c + " - :d"
	}
	return u
}

// refundable finds the write wid in item's chain and what of d can go back (see the rule
// above); ok is false when nothing can.
func refundable(item map[string]types.AttributeValue, wid uint64, d int64) (pos int, g int64, ok bool) {
	g = d
	for i := 1; i <= chainLen; i++ {
		if w, _, err := number(item, chainW(i)); err == nil && w != 0 && uint64(w) == wid {
			return i, g, g > 0
		}
		c, present, err := number(item, chainC(i))
		if err != nil || !present {
			return 0, 0, false
		}
		g = min(g, c)
	}
	return 0, 0, false
}

// gcraGiveBack gives back what is exact of a GCRA charge of d = N*T applied by the write
// marked wid on item pk: first assuming nothing wrote since (one write), else from the chain
// its failed condition returned. It returns what it gave back; a failed condition that leaves
// nothing to give back is not an error.
func (s *Store) gcraGiveBack(ctx context.Context, op, pk string, d int64, wid uint64, optFns ...func(*dynamodb.Options)) (int64, error) {
	pos, g := 1, d
	for round := 0; round < maxRounds; round++ {
		_, err := s.updateItem(ctx, op, pk, gcraRefund(d, g, pos, wid), types.ReturnValueNone, optFns...)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return g, nil
		case errors.As(err, &ccf):
			var ok bool
			if pos, g, ok = refundable(ccf.Item, wid, d); !ok {
				return 0, nil
			}
		default:
			return 0, err
		}
	}
	return 0, nil // the chain kept moving under us: stricter
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
		var err error
		switch {
		case isGCRA(o.c.Limit):
			if o.wid == 0 {
				return // its write is unknown: stricter
			}
			_, err = s.gcraGiveBack(ctx, opRefund, o.pk, o.c.N()*o.t, o.wid, noRetry)
		default:
			_, err = s.updateItem(ctx, opRefund, o.pk, o.refundWrite(), types.ReturnValueNone, noRetry)
		}
		if err != nil {
			s.m.errors.WithLabelValues(opRefund).Inc()
		}
	})
}
