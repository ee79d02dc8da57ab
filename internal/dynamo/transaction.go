package dynamo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Transaction mode: the non-shadow charges of a group in one TransactWriteItems.

// transactable reports whether the group has at least two non-shadow writes, each on its own
// item (a transaction may touch an item only once), and no more than a transaction takes.
func transactable(ops []op) bool {
	seen := map[string]bool{}
	for i := range ops {
		o := &ops[i]
		if !undecided(o) || o.c.Shadow {
			continue
		}
		if seen[o.pk] {
			return false
		}
		seen[o.pk] = true
	}
	return len(seen) >= 2 && len(seen) <= 100
}

// takeTransaction writes the non-shadow charges in one TransactWriteItems and the shadow charges
// beside it.
func (s *Store) takeTransaction(ctx context.Context, ops []op, n int64) (bool, error) {
	// Pick the shadow charges before the transaction starts changing the other ops.
	shadow := make([]bool, len(ops))
	for i := range ops {
		shadow[i] = undecided(&ops[i]) && ops[i].c.Shadow
	}
	var wg sync.WaitGroup
	s.turns.GoWG(&wg, func() {
		s.each(ops, func(o *op) bool { return shadow[o.index] }, func(o *op) { s.apply(ctx, o, n) })
	})
	err := s.transact(ctx, ops, n)
	s.turns.Wait(&wg)
	if err != nil {
		s.refund(ctx, ops)
		return false, err
	}
	return s.settle(ctx, ops)
}

func (s *Store) transact(ctx context.Context, ops []op, n int64) error {
	var group []*op
	for i := range ops {
		// Shadow first: the shadow ops are being written concurrently, so their state must
		// not be read here.
		if o := &ops[i]; !o.c.Shadow && undecided(o) {
			group = append(group, o)
		}
	}
	throttles, conflicts := 0, 0
	for round := 0; round < maxRounds; round++ {
		items := make([]types.TransactWriteItem, len(group))
		wids := make([]uint64, len(group))
		for i, o := range group {
			wids[i] = s.rnd.Marker()
			u := o.write(n, wids[i])
			items[i].Update = &types.Update{
				TableName:                           aws.String(s.table),
				Key:                                 map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: o.pk}},
				UpdateExpression:                    aws.String(u.expr),
				ConditionExpression:                 aws.String(u.cond),
				ExpressionAttributeNames:            u.names,
				ExpressionAttributeValues:           u.values,
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
		}
		s.m.requests.WithLabelValues(opTransact).Inc()
		start := time.Now()
		_, err := s.api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		took := time.Since(start)
		if err != nil && s.retryThrottled(ctx, opTransact, throttles, err, took) {
			throttles++
			round-- // nothing was written: not a round of conflicts
			continue
		}
		if err != nil && s.retryConflict(ctx, conflicts, err, took) {
			conflicts++
			continue // refused while another transaction wrote an item: nothing was written
		}
		err = throttledErr(err)
		if err == nil {
			for i, o := range group {
				o.applied, o.wid = true, wids[i]
			}
			return s.readBack(ctx, group, n)
		}
		var tce *types.TransactionCanceledException
		if !errors.As(err, &tce) || len(tce.CancellationReasons) != len(group) {
			s.m.errors.WithLabelValues(opTransact).Inc()
			return fmt.Errorf("dynamo: transact %s: %w", group[0].pk, err)
		}
		again, rejected, conflicted := false, false, false
		for i, reason := range tce.CancellationReasons {
			switch code := aws.ToString(reason.Code); code {
			case "", "None":
			case "ConditionalCheckFailed":
				retry, cerr := group[i].conditionFailed(reason.Item, n)
				if cerr != nil {
					return fmt.Errorf("dynamo: transact %s: %w", group[i].pk, cerr)
				}
				again = again || retry
				rejected = rejected || !retry
			case "TransactionConflict":
				// Another transaction was writing the item: nothing was written, safe to
				// send again after a short wait (below).
				conflicted = true
				again = true
			case "ThrottlingError", "ProvisionedThroughputExceeded":
				// Nothing was written; wait as for a throttled call, within the deadline.
				if !s.retryThrottled(ctx, opTransact, throttles, throttleReason{}, took) {
					return fmt.Errorf("dynamo: transact %s: %s: %w: %w", group[i].pk, code, ErrThrottled, err)
				}
				throttles++
				again = true
			default:
				s.m.errors.WithLabelValues(opTransact).Inc()
				return fmt.Errorf("dynamo: transact %s: %s: %w", group[i].pk, code, err)
			}
		}
		if rejected {
			// The charges whose conditions held were not written and their state not returned.
			for _, o := range group {
				if !o.done {
					o.done = true
					o.result = bucket.Result{Allowed: true, Limit: limitValue(o.c.Limit)}
				}
			}
			return nil
		}
		if !again {
			return fmt.Errorf("dynamo: transact %s: cancelled without a reason: %w", group[0].pk, err)
		}
		if conflicted {
			if !s.backoff(ctx, conflicts, took) {
				return fmt.Errorf("dynamo: transact %s: transaction conflict until the deadline: %w", group[0].pk, err)
			}
			conflicts++
		}
	}
	return fmt.Errorf("dynamo: transact %s: %w", group[0].pk, ErrContention)
}

// readBack sets the results of a committed transaction from a consistent read of its items.
func (s *Store) readBack(ctx context.Context, group []*op, n int64) error {
	pks := make([]string, 0, len(group))
	for _, o := range group {
		if isGCRA(o.c.Limit) && !o.formB {
			continue // SET tat = now + T: the result is known
		}
		pks = append(pks, o.pk)
	}
	var items map[string]map[string]types.AttributeValue
	if len(pks) > 0 {
		var err error
		if items, err = s.readItems(ctx, pks); err != nil {
			return err
		}
	}
	for _, o := range group {
		item := items[o.pk]
		if isGCRA(o.c.Limit) && !o.formB {
			item = map[string]types.AttributeValue{schema.Tat: schema.Num(n + o.c.N()*o.t)}
		}
		if err := o.admit(item, n); err != nil {
			return fmt.Errorf("dynamo: read %s: %w", o.pk, err)
		}
		if !o.result.Allowed {
			r, err := o.committed(item, n)
			if err != nil {
				return fmt.Errorf("dynamo: read %s: %w", o.pk, err)
			}
			o.result = r
		}
	}
	return nil
}

// committed is the result of a charge that a transaction committed but whose value read back
// (item) includes other replicas' later writes, so that the arithmetic on it says "rejected":
// the charge stays admitted, with nothing left. For GCRA form (b) the condition held tat <=
// n+tau-T before the write, which bounds the leaky bucket's Wait (our turn came no later), and
// the bucket is full again when the tat read has passed.
func (o *op) committed(item map[string]types.AttributeValue, n int64) (bucket.Result, error) {
	l := o.c.Limit
	if !isGCRA(l) {
		return bucket.Result{Allowed: true, Limit: limitValue(l), Reset: o.result.Reset}, nil
	}
	tat, _, err := schema.Number(item, schema.Tat)
	if err != nil {
		return bucket.Result{}, err
	}
	w := o.c.N()
	r := gcraResult(l, min(tat-w*o.t, n+o.tau-w*o.t), n, w)
	r.Reset = max(r.Reset, time.Duration(tat-n))
	return r, nil
}
