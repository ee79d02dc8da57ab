package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simddb"
)

// The simulated network between the replicas and the simulated DynamoDB. Every call a replica
// makes waits in the world's pending list until the driver delivers it, answers it with a fault,
// or leaves it there (reordering, delay); a call whose client gave up stays there too, and may
// still be applied later. The SDK's own retry of a call that got no answer (its client makes two
// attempts) is modelled here: the store sees what it sees from a real client.

// call is one request on the wire.
type call struct {
	rep   *replica
	inc   int // the replica's incarnation that sent it
	op    string
	in    any
	desc  string // its masked description: the sort key and the history's record
	reply chan answer
	// orphan: nobody waits for the answer any more (the client gave up or the answer was
	// lost); delivering it still applies it.
	orphan bool
	sent   time.Time
	pk     string // the keys of the items it reads or writes: the first sort key
	quiet  int    // the quiet reset it belongs to, if any
}

// callKeys lists the item keys of a call.
func callKeys(in any) string {
	var keys []string
	add := func(k map[string]types.AttributeValue) {
		if s, ok := k["pk"].(*types.AttributeValueMemberS); ok {
			keys = append(keys, s.Value)
		}
	}
	switch in := in.(type) {
	case redisCmds:
		keys = in.keys()
	case *dynamodb.UpdateItemInput:
		add(in.Key)
	case *dynamodb.BatchGetItemInput:
		for _, ka := range in.RequestItems {
			for _, k := range ka.Keys {
				add(k)
			}
		}
	case *dynamodb.TransactWriteItemsInput:
		for _, ti := range in.TransactItems {
			if ti.Update != nil {
				add(ti.Update.Key)
			}
		}
	}
	slices.Sort(keys)
	return strings.Join(keys, " ")
}

type answer struct {
	out any
	err error
}

// errTransport stands for a connection that broke before the answer was read.
var errTransport = errors.New("simulated network: connection reset by peer")

func transportErr(op string) error {
	return &smithy.OperationError{ServiceID: "DynamoDB", OperationName: op, Err: errTransport}
}

// api is replica r's DynamoDB client: its calls go through the world's network.
type api struct {
	w   *world
	rep *replica
	inc int
}

var _ dynamo.API = (*api)(nil)

func (a *api) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	out, err := a.send(ctx, "UpdateItem", in, optFns)
	o, _ := out.(*dynamodb.UpdateItemOutput)
	return o, err
}

func (a *api) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	out, err := a.send(ctx, "BatchGetItem", in, optFns)
	o, _ := out.(*dynamodb.BatchGetItemOutput)
	return o, err
}

func (a *api) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	out, err := a.send(ctx, "TransactWriteItems", in, optFns)
	o, _ := out.(*dynamodb.TransactWriteItemsOutput)
	return o, err
}

// send makes the call's attempts: a second one when the first got no answer, as the client's
// retryer does unless optFns make it one attempt.
func (a *api) send(ctx context.Context, op string, in any, optFns []func(*dynamodb.Options)) (any, error) {
	o := dynamodb.Options{RetryMaxAttempts: 2}
	for _, f := range optFns {
		f(&o)
	}
	for attempt := 1; ; attempt++ {
		out, err := a.attempt(ctx, op, in)
		if err == nil || !errors.Is(err, errTransport) || attempt >= o.RetryMaxAttempts || ctx.Err() != nil {
			return out, err
		}
		// The standard retryer's backoff (at most 20 ms, jittered): drawn from the call itself
		// and the seed, not from a source that concurrent goroutines draw from in the order
		// the scheduler runs them.
		if !a.w.sleep(ctx, jitter(a.w.cfg.Seed, a.w.describe(&call{in: in}), attempt, 20*time.Millisecond)) {
			return nil, &smithy.OperationError{ServiceID: "DynamoDB", OperationName: op, Err: ctx.Err()}
		}
	}
}

func (w *world) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	k := w.turns.Park()
	defer w.turns.Resume(k)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (a *api) attempt(ctx context.Context, op string, in any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, &smithy.OperationError{ServiceID: "DynamoDB", OperationName: op, Err: err}
	}
	c := &call{rep: a.rep, inc: a.inc, op: op, in: in, reply: make(chan answer, 1), sent: time.Now()}
	c.desc = a.w.describe(c)
	c.pk = callKeys(in)
	if q, ok := ctx.Value(quietKey{}).(int); ok {
		c.quiet = q
	}
	if !a.w.enqueue(c) {
		return nil, transportErr(op) // this incarnation is dead
	}
	k := a.w.turns.Park()
	select {
	case r := <-c.reply:
		a.w.turns.Resume(k)
		return r.out, r.err
	case <-ctx.Done():
		a.w.turns.Resume(k)
		a.w.mu.Lock()
		c.orphan = true
		a.w.mu.Unlock()
		return nil, &smithy.OperationError{ServiceID: "DynamoDB", OperationName: op, Err: ctx.Err()}
	}
}

// enqueue adds c to the pending calls; false when its incarnation is dead.
func (w *world) enqueue(c *call) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.rep.inc != c.inc || !c.rep.alive {
		return false
	}
	w.pending = append(w.pending, c)
	return true
}

// sortedPending returns the pending calls in a deterministic order: by replica, then by their
// description (the order they arrived in depends on the Go scheduler).
func (w *world) sortedPending() []*call {
	w.mu.Lock()
	defer w.mu.Unlock()
	slices.SortStableFunc(w.pending, func(a, b *call) int {
		if a.rep.id != b.rep.id {
			return a.rep.id - b.rep.id
		}
		if a.orphan != b.orphan {
			if a.orphan {
				return 1
			}
			return -1
		}
		if c := strings.Compare(a.pk, b.pk); c != 0 {
			return c
		}
		return strings.Compare(a.desc, b.desc)
	})
	return slices.Clone(w.pending)
}

func (w *world) removePending(c *call) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.pending, c); i >= 0 {
		w.pending = slices.Delete(w.pending, i, i+1)
	}
}

// fault is what the network does with one delivered call.
type fault uint8

const (
	deliverOK   fault = iota
	lostAnswer        // applied; the client sees a broken connection
	lostRequest       // not applied; the client sees a broken connection
	applyLater        // the client sees a broken connection; the call stays in flight, to land later
	throttled         // refused for throughput, not applied
	conflicted        // refused: a transaction was writing the item, not applied
	dropped           // an orphan that never lands
)

var faultNames = [...]string{"ok", "lost-answer", "lost-request", "apply-later", "throttled", "conflict", "dropped"}

// deliver hands c to the store (or not) as f says and answers its client.
func (w *world) deliver(c *call, f fault) {
	if w.outage && f != dropped {
		f = lostRequest
	}
	if f != applyLater {
		w.removePending(c)
	}
	var a answer
	switch f {
	case deliverOK, lostAnswer:
		a.out, a.err = w.exec(c)
		if f == lostAnswer {
			a = answer{err: c.broken()}
		}
	case lostRequest, applyLater:
		a.err = c.broken()
	case throttled:
		a.err = &types.ProvisionedThroughputExceededException{Message: aws.String("simulated: throughput exceeded")}
		if c.op == "TransactWriteItems" {
			a.err = cancelAll(c, "ThrottlingError")
		}
	case conflicted:
		a.err = &types.TransactionConflictException{Message: aws.String("simulated: transaction conflict")}
		if c.op == "TransactWriteItems" {
			a.err = cancelAll(c, "TransactionConflict")
		}
	case dropped:
		return
	}
	w.record("net r%d %s %s: %s", c.rep.id, faultNames[f], c.desc, outcome(a))
	w.mu.Lock()
	orphan := c.orphan
	if f == applyLater {
		c.orphan = true
	}
	w.mu.Unlock()
	if !orphan {
		c.reply <- a
	}
}

func cancelAll(c *call, code string) error {
	in := c.in.(*dynamodb.TransactWriteItemsInput)
	rs := make([]types.CancellationReason, len(in.TransactItems))
	for i := range rs {
		rs[i] = types.CancellationReason{Code: aws.String("None")}
	}
	rs[0].Code = aws.String(code)
	return &types.TransactionCanceledException{Message: aws.String("simulated: cancelled"), CancellationReasons: rs}
}

// exec applies c to the simulated table.
func (w *world) exec(c *call) (any, error) {
	ctx := context.Background()
	switch in := c.in.(type) {
	case redisCmds:
		return w.execRedis(c)
	case *dynamodb.UpdateItemInput:
		if w.cfg.Mutant == leaseTwice && isLeaseGrant(c) {
			// The grant lands and is answered, and the table keeps its units for the next.
			pk := in.Key["pk"].(*types.AttributeValueMemberS).Value
			old := w.db.Item(table, pk)
			out, err := w.db.UpdateItem(ctx, in)
			if err == nil {
				w.db.Restore(table, pk, old)
			}
			return out, err
		}
		return w.db.UpdateItem(ctx, in)
	case *dynamodb.BatchGetItemInput:
		return w.db.BatchGetItem(ctx, in)
	case *dynamodb.TransactWriteItemsInput:
		return w.db.TransactWriteItems(ctx, in)
	}
	return nil, fmt.Errorf("sim: call %T", c.in)
}

func outcome(a answer) string {
	var attrs simddb.Item
	switch o := a.out.(type) {
	case []rueidis.RedisResult:
		return redisOutcome(o)
	case *dynamodb.UpdateItemOutput:
		if o != nil {
			attrs = o.Attributes
		}
	case *dynamodb.BatchGetItemOutput:
		if o != nil {
			n := 0
			for _, l := range o.Responses {
				n += len(l)
			}
			return fmt.Sprintf("ok %d items", n)
		}
	}
	return mask(simddb.Outcome(attrs, a.err))
}

// describe is c's masked description.
func (w *world) describe(c *call) string {
	switch in := c.in.(type) {
	case redisCmds:
		return describeRedis(in)
	case *dynamodb.UpdateItemInput:
		var b strings.Builder
		b.WriteString("update ")
		b.WriteString(simddb.Format(in.Key))
		b.WriteByte(' ')
		b.WriteString(deref(in.UpdateExpression))
		b.WriteString(" if ")
		b.WriteString(deref(in.ConditionExpression))
		b.WriteByte(' ')
		b.WriteString(names(in.ExpressionAttributeNames))
		b.WriteByte(' ')
		return mask(b.String()) + maskItem(in.ExpressionAttributeValues) + " rv=" + string(in.ReturnValues)
	case *dynamodb.BatchGetItemInput:
		var keys []string
		for _, ka := range in.RequestItems {
			for _, k := range ka.Keys {
				keys = append(keys, simddb.Format(k))
			}
		}
		slices.Sort(keys)
		return mask("batchget " + strings.Join(keys, " "))
	case *dynamodb.TransactWriteItemsInput:
		var b strings.Builder
		b.WriteString("transact")
		for _, ti := range in.TransactItems {
			if u := ti.Update; u != nil {
				fmt.Fprintf(&b, " [%s %s if %s %s %s]", simddb.Format(u.Key), deref(u.UpdateExpression), deref(u.ConditionExpression),
					names(u.ExpressionAttributeNames), maskItem(u.ExpressionAttributeValues))
			}
		}
		return mask(b.String())
	}
	return fmt.Sprintf("%T", c.in)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func names(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, mask(k+"="+m[k]))
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}
