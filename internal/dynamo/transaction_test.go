package dynamo_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// TestTransactionCommittedGroupStaysAdmitted: in Transaction mode a committed group's GCRA
// results come from a read after the commit. When another replica wrote the bucket in between
// (here a request one second later, legitimately admitted), the value read says "no room", yet
// the transaction committed the charge: the group stays admitted and is not refunded, its Reset
// says when the bucket as read is full, and a leaky bucket's Wait is no shorter than the
// request's true place in the queue (the transaction's condition bounds it).
func TestTransactionCommittedGroupStaysAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     bucket.Limit
		wait      time.Duration
		remaining int64
	}{
		// Burst 2: t0's requests take tat to t0+2s, the one at +1s to t0+3s.
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}, 0, 0},
		// Queue of 1: the group's request waits 1s behind the first one (t0+1s..t0+2s).
		{"LeakyBucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 1}, time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, table := localTable(t)
			gcra := bucket.Charge{Key: newKey(t), Limit: tc.limit}
			window := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Hour}}

			gate := newHoldAPI(api)
			gate.holdRead = func(*dynamodb.BatchGetItemInput) bool { return true } // A's read-back
			a := dynamo.New(gate, dynamo.Options{Table: table, Mode: dynamo.Transaction})
			b := dynamo.New(api, dynamo.Options{Table: table, Mode: dynamo.Transaction})

			if ok, _ := mustTake(t, a, t0, gcra); !ok { // tat = t0+1s
				t.Fatalf("first request: got rejected, want admitted")
			}
			group := asyncTake(context.Background(), a, t0, gcra, window) // commits tat = t0+2s, read-back held
			gate.waitHeld(t)
			if ok, _ := mustTake(t, b, t0.Add(time.Second), gcra); !ok { // tat = t0+3s
				t.Fatalf("replica B at +1s: got rejected, want admitted")
			}
			close(gate.release)
			o := outcome(t, group)
			if o.err != nil {
				t.Fatalf("group: %v", o.err)
			}
			if !o.ok || !o.r.Allowed {
				t.Fatalf("group committed at t0: got admitted=%v (result %+v), want admitted", o.ok, o.r)
			}
			if o.r.Wait < tc.wait {
				t.Errorf("Wait of the committed request: got %v, want at least %v (its place in the queue)", o.r.Wait, tc.wait)
			}
			if o.r.Remaining != tc.remaining {
				t.Errorf("Remaining: got %d, want %d", o.r.Remaining, tc.remaining)
			}
			if want := 3 * time.Second; o.r.Reset != want {
				t.Errorf("Reset: got %v, want %v (the bucket as read, tat = t0+3s)", o.r.Reset, want)
			}
			// Not refunded: at +1s the bucket (tat = t0+3s) has no room left.
			if ok, r := mustTake(t, b, t0.Add(time.Second), gcra); ok {
				t.Errorf("request at +1s after the committed group: got admitted (%+v), want rejected", r[0])
			}
		})
	}
}

// conflictAPI refuses the first updates UpdateItem calls and the first transacts
// TransactWriteItems calls with TransactionConflictException, without sending them: what
// DynamoDB answers while another replica's transaction is writing the item. Then it passes
// every call on.
type conflictAPI struct {
	dynamo.API
	updates, transacts atomic.Int32
}

func (c *conflictAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if c.updates.Add(-1) >= 0 {
		return nil, &types.TransactionConflictException{Message: aws.String("injected: transaction ongoing for the item")}
	}
	return c.API.UpdateItem(ctx, in, o...)
}

func (c *conflictAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	if c.transacts.Add(-1) >= 0 {
		return nil, &types.TransactionConflictException{Message: aws.String("injected: transaction ongoing for the item")}
	}
	return c.API.TransactWriteItems(ctx, in, o...)
}

// TestTransactionConflictRetried: in transaction mode a write refused with
// TransactionConflictException (another replica's transaction held the item) was not applied,
// so it is sent again rather than failing the decision: a single charge's UpdateItem, a
// group's TransactWriteItems, and a give-back. Each charge is counted once.
func TestTransactionConflictRetried(t *testing.T) {
	api, table := localTable(t)
	window := func() bucket.Charge {
		return bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}, MayGiveBack: true}
	}
	t.Run("update", func(t *testing.T) {
		f := &conflictAPI{API: api}
		f.updates.Store(2)
		s := dynamo.New(f, dynamo.Options{Table: table, Mode: dynamo.Transaction})
		w := window()
		if ok, _ := mustTake(t, s, t0, w); !ok {
			t.Fatalf("a charge refused twice for a transaction conflict: rejected, want admitted")
		}
		if got := admits(t, s, t0, w, 2); got != 1 {
			t.Errorf("admitted after it (limit 2): got %d, want 1 (counted once)", got)
		}
	})
	t.Run("transact", func(t *testing.T) {
		f := &conflictAPI{API: api}
		f.transacts.Store(2)
		s := dynamo.New(f, dynamo.Options{Table: table, Mode: dynamo.Transaction})
		w, g := window(), bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}}
		if ok, _ := mustTake(t, s, t0, w, g); !ok {
			t.Fatalf("a group refused twice for a transaction conflict: rejected, want admitted")
		}
		if got := admits(t, s, t0, w, 2); got != 1 {
			t.Errorf("window admitted after the group (limit 2): got %d, want 1 (counted once)", got)
		}
	})
	t.Run("give-back", func(t *testing.T) {
		f := &conflictAPI{API: api}
		s := dynamo.New(f, dynamo.Options{Table: table, Mode: dynamo.Transaction})
		w := window()
		if got := admits(t, s, t0, w, 2); got != 2 {
			t.Fatalf("first two: got %d admitted, want 2", got)
		}
		f.updates.Store(2)
		if err := s.Release(context.Background(), t0, []bucket.Taken{{Charge: w, At: t0}}); err != nil {
			t.Errorf("a give-back refused twice for a transaction conflict: %v, want it given back", err)
		}
		if got := admits(t, s, t0, w, 2); got != 1 {
			t.Errorf("admitted after the give-back (limit 2, 2 taken, 1 given back): got %d, want 1", got)
		}
	})
}
