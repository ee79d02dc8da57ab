package dynamo

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/lease"
)

// leaseTable is the Store as its lease pools' table: their writes sent once, under the op
// labels lease and lease_refund, with the Store's throttling, liveness and give-back ids.
type leaseTable struct{ s *Store }

var _ lease.Table = leaseTable{}

func (t leaseTable) Lease(ctx context.Context, pk string, u lease.Update, rv types.ReturnValue) (map[string]types.AttributeValue, error) {
	out, err := t.s.updateItem(ctx, opLease, pk, fromLease(u), rv, noRetry)
	if err != nil {
		t.failed(opLease, err)
		return nil, err
	}
	return out.Attributes, nil
}

func (t leaseTable) GiveBack(ctx context.Context, pk string, u lease.Update) error {
	_, err := t.s.updateItem(ctx, opLeaseRefund, pk, fromLease(u), types.ReturnValueNone, noRetry)
	if err != nil {
		t.failed(opLeaseRefund, err)
	}
	return err
}

// failed counts a call that failed with an error other than its condition.
func (t leaseTable) failed(op string, err error) {
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		t.s.m.errors.WithLabelValues(op).Inc()
	}
}

func (t leaseTable) CountGiveBack(pk string, units int64, cond string) lease.CountGive {
	return leaseCountGive{t.s.newCountGive(opLeaseRefund, pk, units, cond)}
}

func (t leaseTable) Read(ctx context.Context, pk string) (map[string]types.AttributeValue, error) {
	items, err := t.s.readItems(ctx, []string{pk})
	if err != nil {
		return nil, err
	}
	return items[pk], nil
}

func (t leaseTable) RTT() int64   { return t.s.live.rtt.Load() }
func (t leaseTable) Silent() bool { return t.s.live.silent() }

func (t leaseTable) CountThrottles(ctx context.Context, c *atomic.Int64) context.Context {
	return context.WithValue(ctx, throttleCounter{}, c)
}

// leaseCountGive is a counter give-back of a lease's units (see countGive.attempt).
type leaseCountGive struct{ g *countGive }

func (c leaseCountGive) Attempt(ctx context.Context) (done, landed, again bool) {
	done, landed, err := c.g.attempt(ctx)
	if !done {
		c.g.s.m.errors.WithLabelValues(opLeaseRefund).Inc()
	}
	return done, landed, !done && !errors.Is(err, errGiveBackUnknown)
}

// fromLease is the Store's form of a lease write.
func fromLease(u lease.Update) update {
	return update{expr: u.Expr, cond: u.Cond, names: u.Names, values: u.Values}
}
