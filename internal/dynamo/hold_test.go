package dynamo_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.uber.org/goleak"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// holdAPI passes every call to the real client, except the first UpdateItem (or BatchGetItem)
// that holdUpdate (or holdRead) matches: that call is held before it is sent until release is
// closed or its context ends, and held is closed when it arrives. It stands for a write (or read) that is slow on the network, so a test
// can order another replica's calls around it without sleeping.
type holdAPI struct {
	api        dynamo.API
	holdUpdate func(*dynamodb.UpdateItemInput) bool
	holdRead   func(*dynamodb.BatchGetItemInput) bool

	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func newHoldAPI(api dynamo.API) *holdAPI {
	return &holdAPI{api: api, held: make(chan struct{}), release: make(chan struct{})}
}

func (g *holdAPI) hold(ctx context.Context) {
	caught := false
	g.once.Do(func() { caught = true })
	if !caught {
		return
	}
	close(g.held)
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

func (g *holdAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if g.holdUpdate != nil && g.holdUpdate(in) {
		g.hold(ctx)
	}
	return g.api.UpdateItem(ctx, in, o...)
}

func (g *holdAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	if g.holdRead != nil && g.holdRead(in) {
		g.hold(ctx)
	}
	return g.api.BatchGetItem(ctx, in, o...)
}

func (g *holdAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return g.api.TransactWriteItems(ctx, in, o...)
}

// waitHeld fails the test unless g caught its call within a generous bound.
func (g *holdAPI) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-g.held:
	case <-time.After(10 * time.Second):
		t.Fatalf("the gated call never arrived")
	}
}

// updateOf matches UpdateItem calls on items whose pk starts with key's hex and whose update
// expression contains expr.
func updateOf(key bucket.Key, expr string) func(*dynamodb.UpdateItemInput) bool {
	return func(in *dynamodb.UpdateItemInput) bool {
		return strings.HasPrefix(pkOf(in.Key), key.String()) && strings.Contains(aws.ToString(in.UpdateExpression), expr)
	}
}

// mustTake runs one Take and fails the test on an error.
func mustTake(t *testing.T, s *dynamo.Store, now time.Time, charges ...bucket.Charge) (bool, []bucket.Result) {
	t.Helper()
	r := make([]bucket.Result, len(charges))
	ok, err := s.Take(context.Background(), now, charges, r)
	if err != nil {
		t.Fatalf("Take at %v: %v", now.Sub(t0), err)
	}
	return ok, r
}

// asyncTake runs one Take under ctx in a goroutine; the returned channel yields its outcome
// (with the first charge's result).
func asyncTake(ctx context.Context, s *dynamo.Store, now time.Time, charges ...bucket.Charge) <-chan takeOutcome {
	out := make(chan takeOutcome, 1)
	go func() {
		r := make([]bucket.Result, len(charges))
		ok, err := s.Take(ctx, now, charges, r)
		out <- takeOutcome{ok: ok, err: err, r: r[0]}
	}()
	return out
}

// pkOf returns the string partition key of an item key.
func pkOf(key map[string]types.AttributeValue) string {
	if s, ok := key["pk"].(*types.AttributeValueMemberS); ok {
		return s.Value
	}
	return ""
}

// ignoreNow is goleak's snapshot of the goroutines running now, as a slice to extend.
func ignoreNow() []goleak.Option { return []goleak.Option{goleak.IgnoreCurrent()} }

// ignorePools leaves out HTTP keep-alive connections: other tests' clients against DynamoDB
// Local start dials that, on a loaded machine (the whole suite runs packages in parallel), can
// complete seconds later, while a leak check of a later test is running. Such a connection is
// the client's pool, not a writer that outlived its queue, which is what these checks are for.
var ignorePools = []goleak.Option{
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreAnyFunction("net/http.(*Transport).dialConnFor"),
}
