package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.uber.org/goleak"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// exactLimits are limits of 50 requests at one instant (rates negligible over a test).
var exactLimits = []struct {
	name  string
	limit bucket.Limit
	want  int64
}{
	{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e-3, Burst: 50}, 50},
	{"LeakyBucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1e-3, Burst: 50}, 51},
	{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 50, Window: time.Hour}, 50},
	{"SlidingWindow", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 50, Window: time.Hour}, 50},
	{"Quota", bucket.Limit{Algorithm: bucket.Quota, Count: 50, Period: bucket.Day}, 50},
}

// position is what tells admitted requests of one instant apart: the leaky bucket's Wait (in
// units of T), everyone else's Remaining.
func position(l bucket.Limit, r bucket.Result) int64 {
	if l.Algorithm == bucket.LeakyBucket {
		t, _ := bucket.GCRAParams(l)
		return int64(r.Wait) / t
	}
	return r.Remaining
}

// checkPositions fails unless got holds each of 0..want-1 exactly once: the admitted requests
// were charged one after another, none twice at the same place.
func checkPositions(t *testing.T, got []int64, want int64) {
	t.Helper()
	slices.Sort(got)
	for i, p := range got {
		if p != int64(i) {
			t.Errorf("positions of the admitted requests: got %v, want each of 0..%d once", got, want-1)
			return
		}
	}
}

// TestExactUnderConcurrency: 200 requests at one instant on one key admit exactly the limit, each
// at its own place in the bucket or window, with one Store and with two sharing the table.
func TestExactUnderConcurrency(t *testing.T) {
	api, table := localTable(t)
	const requests = 200
	for _, replicas := range []int{1, 2} {
		for _, tc := range exactLimits {
			t.Run(fmt.Sprintf("%s/%dstores", tc.name, replicas), func(t *testing.T) {
				stores := make([]*dynamo.Store, replicas)
				for i := range stores {
					stores[i] = dynamo.New(api, dynamo.Options{Table: table})
				}
				charges := []bucket.Charge{{Key: newKey(t), Limit: tc.limit}}
				var mu sync.Mutex
				var positions []int64
				var wg sync.WaitGroup
				errs := make(chan error, requests)
				for g := range requests {
					wg.Go(func() {
						r := make([]bucket.Result, 1)
						ok, err := stores[g%replicas].Take(context.Background(), t0, charges, r)
						if err != nil {
							errs <- err
							return
						}
						if ok != r[0].Allowed {
							errs <- fmt.Errorf("admitted %v but Allowed %v", ok, r[0].Allowed)
						}
						if ok {
							mu.Lock()
							positions = append(positions, position(tc.limit, r[0]))
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("Take: %v", err)
				}
				if got := int64(len(positions)); got != tc.want {
					t.Fatalf("%d requests at one instant: got %d admitted, want %d", requests, got, tc.want)
				}
				checkPositions(t, positions, tc.want)
			})
		}
	}
}

// gateAPI passes calls through to api, but holds the first UpdateItem until open is closed.
type gateAPI struct {
	dynamo.API
	entered, open chan struct{}
	first         sync.Once
}

func newGateAPI(api dynamo.API) *gateAPI {
	return &gateAPI{API: api, entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *gateAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	g.first.Do(func() {
		close(g.entered)
		<-g.open
	})
	return g.API.UpdateItem(ctx, in, o...)
}

// queuedCtx reports when the Take it is given starts waiting on it: a Take waits on its
// context's Done channel once its charges are queued behind their items' writes (the tests
// use warm caches, so no call to DynamoDB asks for Done before that).
type queuedCtx struct {
	context.Context
	once   sync.Once
	queued chan struct{}
}

func newQueuedCtx(parent context.Context) *queuedCtx {
	return &queuedCtx{Context: parent, queued: make(chan struct{})}
}

func (c *queuedCtx) Done() <-chan struct{} {
	c.once.Do(func() { close(c.queued) })
	return c.Context.Done()
}

// TestCoalescingSavesWrites holds the first write of a hot key in flight while 99 more requests
// queue behind it: they go out together, so 100 requests cost a few writes, admit exactly the
// limit, and the admitted ones hold every place of the bucket or window once.
func TestCoalescingSavesWrites(t *testing.T) {
	api, table := localTable(t)
	const requests = 100
	for _, tc := range exactLimits {
		t.Run(tc.name, func(t *testing.T) {
			gate := newGateAPI(api)
			counting := &countingAPI{api: gate}
			s := dynamo.New(counting, dynamo.Options{Table: table})
			charges := []bucket.Charge{{Key: newKey(t), Limit: tc.limit}}
			results := make([][]bucket.Result, requests)
			oks := make([]bool, requests)
			errs := make([]error, requests)
			var wg sync.WaitGroup
			take := func(ctx context.Context, i int) {
				results[i] = make([]bucket.Result, 1)
				wg.Go(func() { oks[i], errs[i] = s.Take(ctx, t0, charges, results[i]) })
			}
			take(context.Background(), 0)
			<-gate.entered
			for i := 1; i < requests; i++ {
				ctx := newQueuedCtx(context.Background())
				take(ctx, i)
				<-ctx.queued
			}
			close(gate.open)
			wg.Wait()
			var positions []int64
			for i := range requests {
				if errs[i] != nil {
					t.Fatalf("Take %d: %v", i, errs[i])
				}
				if oks[i] {
					positions = append(positions, position(tc.limit, results[i][0]))
				}
			}
			if got := int64(len(positions)); got != tc.want {
				t.Fatalf("%d requests at one instant: got %d admitted, want %d", requests, got, tc.want)
			}
			checkPositions(t, positions, tc.want)
			// The first write, then the 99 queued charges as one batch: at most one round to learn
			// the item's value and one to apply what fits.
			if got := counting.updates.Load(); got > 3 {
				t.Errorf("UpdateItem calls for %d requests on one key: got %d, want <= 3", requests, got)
			}
			if tc.limit.Algorithm == bucket.TokenBucket {
				// The Store knows the tat its first write left, so the batch fits in one write.
				if got := counting.updates.Load(); got != 2 {
					t.Errorf("token bucket: UpdateItem calls got %d, want 2", got)
				}
			}
		})
	}
}

// scriptedAPI is one token-bucket item in memory whose UpdateItem calls wait for the test: each
// call is announced on calls and proceeds when the test answers it (nil: evaluate the write;
// an error: fail with it), or fails when its context ends first, as the SDK would.
type scriptedAPI struct {
	fakeAPI
	calls chan scriptedCall
	mu    sync.Mutex
	tat   int64
	has   bool
	n     atomic.Int64
}

type scriptedCall struct {
	ctx    context.Context
	in     *dynamodb.UpdateItemInput
	answer chan error
}

func newScriptedAPI() *scriptedAPI { return &scriptedAPI{calls: make(chan scriptedCall)} }

func (f *scriptedAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	f.n.Add(1)
	c := scriptedCall{ctx: ctx, in: in, answer: make(chan error, 1)}
	select {
	case f.calls <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case err := <-c.answer:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return f.eval(in)
}

// eval applies the GCRA write forms of the store's token-bucket writes.
func (f *scriptedAPI) eval(in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error) {
	v := func(name string) int64 {
		n, _ := strconv.ParseInt(in.ExpressionAttributeValues[name].(*types.AttributeValueMemberN).Value, 10, 64)
		return n
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := v(":now")
	var ok bool
	var next int64
	if strings.Contains(aws.ToString(in.UpdateExpression), ":next") {
		ok, next = !f.has || f.tat < now, v(":next")
	} else {
		ok, next = f.has && f.tat >= now && f.tat <= v(":last"), f.tat+v(":t")
	}
	if !ok {
		var item map[string]types.AttributeValue
		if f.has {
			item = map[string]types.AttributeValue{"tat": &types.AttributeValueMemberN{Value: strconv.FormatInt(f.tat, 10)}}
		}
		return nil, &types.ConditionalCheckFailedException{Message: aws.String("condition"), Item: item}
	}
	f.tat, f.has = next, true
	return &dynamodb.UpdateItemOutput{Attributes: map[string]types.AttributeValue{
		"tat": &types.AttributeValueMemberN{Value: strconv.FormatInt(next, 10)},
	}}, nil
}

// call receives the next UpdateItem, or fails the test after a generous bound.
func (f *scriptedAPI) call(t *testing.T) scriptedCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("no UpdateItem call within 10s")
		return scriptedCall{}
	}
}

type takeOutcome struct {
	ok  bool
	err error
	r   bucket.Result
}

// startTake runs one Take of charge at t0 and returns where its outcome will arrive.
func startTake(ctx context.Context, s *dynamo.Store, charge bucket.Charge) <-chan takeOutcome {
	out := make(chan takeOutcome, 1)
	go func() {
		r := make([]bucket.Result, 1)
		ok, err := s.Take(ctx, t0, []bucket.Charge{charge}, r)
		out <- takeOutcome{ok, err, r[0]}
	}()
	return out
}

// outcome waits for a Take's outcome, or fails the test after a generous bound.
func outcome(t *testing.T, ch <-chan takeOutcome) takeOutcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(10 * time.Second):
		t.Fatalf("Take did not return within 10s")
		return takeOutcome{}
	}
}

var scriptedLimit = bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}

// queueBehind starts a Take that starts the item's write and waits until that write is in
// flight, then queues one Take per context behind it.
func queueBehind(t *testing.T, s *dynamo.Store, api *scriptedAPI, charge bucket.Charge, ctxs ...*queuedCtx) (first scriptedCall, firstOut <-chan takeOutcome, outs []<-chan takeOutcome) {
	t.Helper()
	firstOut = startTake(context.Background(), s, charge)
	first = api.call(t)
	for _, ctx := range ctxs {
		outs = append(outs, startTake(ctx, s, charge))
		<-ctx.queued
	}
	return first, firstOut, outs
}

// TestQueuedWaiterLeaves: a request whose context ends while its charge waits behind a write in
// flight returns at once with the context's error, and its charge is never written.
func TestQueuedWaiterLeaves(t *testing.T) {
	before := ignoreNow()
	api := newScriptedAPI()
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	charge := bucket.Charge{Key: newKey(t), Limit: scriptedLimit}
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaving := newQueuedCtx(cctx)
	first, firstOut, outs := queueBehind(t, s, api, charge, leaving)

	cancel()
	if o := outcome(t, outs[0]); o.ok || !errors.Is(o.err, context.Canceled) {
		t.Errorf("queued Take whose context ended: got admitted=%v err=%v, want false and context.Canceled", o.ok, o.err)
	}
	first.answer <- nil
	if o := outcome(t, firstOut); !o.ok || o.err != nil || o.r.Remaining != 9 {
		t.Errorf("first Take: got admitted=%v err=%v Remaining=%d, want true, nil, 9", o.ok, o.err, o.r.Remaining)
	}
	// The writer finds nobody left in the queue and ends (goleak waits for that) without
	// another write.
	goleak.VerifyNone(t, append(before, ignorePools...)...)
	if got := api.n.Load(); got != 1 {
		t.Errorf("UpdateItem calls: got %d, want 1 (the charge that left must not be written)", got)
	}
}

// TestBatchOutlivesItsFirstWaiter: a batch's write goes on when some of its waiters leave (each
// of those returns at once) and serves the others; it is cancelled only when all have left.
func TestBatchOutlivesItsFirstWaiter(t *testing.T) {
	defer goleak.VerifyNone(t, append(ignoreNow(), ignorePools...)...)
	api := newScriptedAPI()
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	charge := bucket.Charge{Key: newKey(t), Limit: scriptedLimit}
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	a, b := newQueuedCtx(ctxA), newQueuedCtx(context.Background())
	first, firstOut, outs := queueBehind(t, s, api, charge, a, b)
	first.answer <- nil
	if o := outcome(t, firstOut); !o.ok {
		t.Fatalf("first Take: got admitted=%v err=%v, want admitted", o.ok, o.err)
	}
	batch := api.call(t) // a's and b's charges, one write

	cancelA()
	if o := outcome(t, outs[0]); o.ok || !errors.Is(o.err, context.Canceled) {
		t.Errorf("Take that left its batch: got admitted=%v err=%v, want false and context.Canceled", o.ok, o.err)
	}
	if err := batch.ctx.Err(); err != nil {
		t.Fatalf("batch write's context after one of two waiters left: got %v, want still live", err)
	}
	batch.answer <- nil
	if o := outcome(t, outs[1]); !o.ok || o.err != nil {
		t.Errorf("Take that stayed: got admitted=%v err=%v, want admitted", o.ok, o.err)
	}
	// Both charges were written: the stricter side of a waiter leaving.
	if got, want := batch.in.ExpressionAttributeValues[":t"].(*types.AttributeValueMemberN).Value, strconv.FormatInt(2e9, 10); got != want {
		t.Errorf("batch write adds %s ns to tat, want %s (two charges of T = 1s)", got, want)
	}

	// Now a batch whose waiters all leave: its write is cancelled.
	ctxC, cancelC := context.WithCancel(context.Background())
	defer cancelC()
	c := newQueuedCtx(ctxC)
	out := startTake(c, s, charge)
	<-c.queued
	lone := api.call(t)
	cancelC()
	if o := outcome(t, out); !errors.Is(o.err, context.Canceled) {
		t.Errorf("lone waiter that left: got err=%v, want context.Canceled", o.err)
	}
	select {
	case <-lone.ctx.Done():
	case <-time.After(10 * time.Second):
		t.Errorf("write of a batch whose waiters all left: context not cancelled within 10s")
	}
}

// TestBatchWriteFailureFailsAll: when a batch's write fails, every request in it gets the error.
func TestBatchWriteFailureFailsAll(t *testing.T) {
	defer goleak.VerifyNone(t, append(ignoreNow(), ignorePools...)...)
	api := newScriptedAPI()
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	charge := bucket.Charge{Key: newKey(t), Limit: scriptedLimit}
	ctxs := []*queuedCtx{newQueuedCtx(context.Background()), newQueuedCtx(context.Background()), newQueuedCtx(context.Background())}
	first, firstOut, outs := queueBehind(t, s, api, charge, ctxs...)
	first.answer <- nil
	if o := outcome(t, firstOut); !o.ok {
		t.Fatalf("first Take: got admitted=%v err=%v, want admitted", o.ok, o.err)
	}
	boom := &types.InternalServerError{Message: aws.String("boom")}
	api.call(t).answer <- boom
	for i, out := range outs {
		if o := outcome(t, out); o.ok || !errors.Is(o.err, boom) {
			t.Errorf("Take %d of the failed batch: got admitted=%v err=%v, want false and the write's error", i, o.ok, o.err)
		}
	}
	if got := api.n.Load(); got != 2 {
		t.Errorf("UpdateItem calls: got %d, want 2 (one write for the three queued charges)", got)
	}
}

// TestBatchCap: charges queued behind a write go out in batches of at most 128, in order.
func TestBatchCap(t *testing.T) {
	defer goleak.VerifyNone(t, append(ignoreNow(), ignorePools...)...)
	api := newScriptedAPI()
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	charge := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1000}}
	ctxs := make([]*queuedCtx, 200)
	for i := range ctxs {
		ctxs[i] = newQueuedCtx(context.Background())
	}
	first, firstOut, outs := queueBehind(t, s, api, charge, ctxs...)
	first.answer <- nil
	outcome(t, firstOut)
	for i, want := range []int64{128, 72} {
		c := api.call(t)
		got, _ := strconv.ParseInt(c.in.ExpressionAttributeValues[":t"].(*types.AttributeValueMemberN).Value, 10, 64)
		if got != want*1e9 {
			t.Errorf("write %d after the first: got %d charges (:t = %d ns), want %d", i+1, got/1e9, got, want)
		}
		c.answer <- nil
	}
	for i, out := range outs {
		if o := outcome(t, out); !o.ok || o.r.Remaining != 998-int64(i) {
			t.Errorf("queued Take %d: got admitted=%v Remaining=%d err=%v, want admitted with Remaining %d", i, o.ok, o.r.Remaining, o.err, 998-i)
		}
	}
}

// TestBatchOutlastsRivalWrites: another replica's writes land before each of a batch's writes
// five times in a row, each time leaving room for fewer charges than the batch asked for. Every
// failed condition tells the batch the item's value, so it asks for fewer and finally gets what
// is left: exact, and no ErrContention while others are making progress.
func TestBatchOutlastsRivalWrites(t *testing.T) {
	defer goleak.VerifyNone(t, append(ignoreNow(), ignorePools...)...)
	api := newScriptedAPI()
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	const burst = 100
	charge := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e-3, Burst: burst}}
	ctxs := make([]*queuedCtx, 10)
	for i := range ctxs {
		ctxs[i] = newQueuedCtx(context.Background())
	}
	first, firstOut, outs := queueBehind(t, s, api, charge, ctxs...)
	first.answer <- nil
	outcome(t, firstOut)
	// The batch of 10 asks for 10, 9, 8, 7, 6 while a rival leaves 9, 8, 7, 6, 5 places.
	value := func(c scriptedCall, name string) int64 {
		v, _ := strconv.ParseInt(c.in.ExpressionAttributeValues[name].(*types.AttributeValueMemberN).Value, 10, 64)
		return v
	}
	tVal := func(c scriptedCall) int64 { return value(c, ":t") }
	var emission int64
	for round, left := range []int64{9, 8, 7, 6, 5} {
		c := api.call(t)
		if round == 0 {
			emission = tVal(c) / 10
		}
		if got, want := tVal(c)/emission, left+1; got != want {
			t.Fatalf("write %d: got %d charges, want %d", round+1, got, want)
		}
		api.mu.Lock()
		api.tat = value(c, ":now") + (burst-left)*emission
		api.mu.Unlock()
		c.answer <- nil
	}
	c := api.call(t)
	if got := tVal(c) / emission; got != 5 {
		t.Fatalf("last write: got %d charges, want the 5 left", got)
	}
	c.answer <- nil
	admitted := 0
	for i, out := range outs {
		o := outcome(t, out)
		if o.err != nil {
			t.Fatalf("queued Take %d: got error %v, want a decision", i, o.err)
		}
		if o.ok {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("got %d of 10 admitted, want the 5 places the rival left", admitted)
	}
}
