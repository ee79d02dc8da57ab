package dynamo_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// failReadAPI passes every call on, except the first BatchGetItem of an item of key, which fails
// without being sent: a transaction's read-back that did not answer.
type failReadAPI struct {
	dynamo.API
	key    bucket.Key
	failed atomic.Bool
}

func (f *failReadAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	for _, ka := range in.RequestItems {
		for _, k := range ka.Keys {
			if strings.HasPrefix(pkOf(k), f.key.String()) && f.failed.CompareAndSwap(false, true) {
				return nil, errors.New("injected: the read-back failed")
			}
		}
	}
	return f.API.BatchGetItem(ctx, in, o...)
}

// TestGCRAGiveBackAfterAnotherWriteIsNotLooser is the example on DynamoDB, for each
// kind of non-lease give-back of a token-bucket charge: burst 2 at 1/s; A at 0 s is given back
// after B's write at 0.5 s has landed; then C at 0.501 s and E at 1.0 s. A bucket that never saw
// A admits two of B, C and E (B leaves tat 1.5 s, C 2.5 s, and E at 1.0 s finds no room). With A
// applied, B's write found the bucket busy (tat 1 s >= 0.5 s: a form (b) write that leaves since
// alone) and set tat 2 s, where without A it would have started from 0.5 s: B's write already
// absorbed half of A. A give-back conditioned on since takes the whole T off (tat 1 s) and
// admits all three. Only a give-back conditioned on "nothing wrote since A" is exact.
func TestGCRAGiveBackAfterAnotherWriteIsNotLooser(t *testing.T) {
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	// Each path takes A at 0 s, writes B at 0.5 s before A's give-back lands, and returns the
	// store to decide C and E with.
	paths := []struct {
		name string
		run  func(t *testing.T, gcra bucket.Charge) *dynamo.Store
	}{
		{"refund of a rejected group", func(t *testing.T, gcra bucket.Charge) *dynamo.Store {
			api, table := localTable(t)
			window := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
			gate := newHoldAPI(api)
			gate.holdUpdate = updateOf(gcra.Key, "#tat - :t")
			s := dynamo.New(gate, dynamo.Options{Table: table})
			if ok, _ := mustTake(t, s, at(0), window); !ok {
				t.Fatalf("first window request: got rejected, want admitted")
			}
			rejected := asyncTake(context.Background(), s, at(0), gcra, window) // A, refunded (held)
			gate.waitHeld(t)
			if ok, _ := mustTake(t, s, at(500), gcra); !ok {
				t.Fatalf("B at 0.5s: got rejected, want admitted")
			}
			close(gate.release)
			if o := outcome(t, rejected); o.err != nil || o.ok {
				t.Fatalf("A's group: got admitted=%v err=%v, want rejected by the window", o.ok, o.err)
			}
			return s
		}},
		{"transaction refund after a failed read", func(t *testing.T, gcra bucket.Charge) *dynamo.Store {
			api, table := localTable(t)
			window := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Hour}}
			// A form (a) write's result is known without reading: the window's read fails.
			gate := newHoldAPI(&failReadAPI{API: api, key: window.Key})
			gate.holdUpdate = updateOf(gcra.Key, "#tat - :t")
			s := dynamo.New(gate, dynamo.Options{Table: table, Mode: dynamo.Transaction})
			failed := asyncTake(context.Background(), s, at(0), gcra, window) // A, committed, read fails, refunded (held)
			gate.waitHeld(t)
			if ok, _ := mustTake(t, s, at(500), gcra); !ok {
				t.Fatalf("B at 0.5s: got rejected, want admitted")
			}
			close(gate.release)
			if o := outcome(t, failed); o.err == nil {
				t.Fatalf("A's group: got admitted=%v and no error, want the read-back's error", o.ok)
			}
			return s
		}},
		{"charge_on release", func(t *testing.T, gcra bucket.Charge) *dynamo.Store {
			api, table := localTable(t)
			s := dynamo.New(api, dynamo.Options{Table: table})
			gcra.MayGiveBack = true
			ok, r := mustTake(t, s, at(0), gcra)
			if !ok {
				t.Fatalf("A at 0s: got rejected, want admitted")
			}
			if ok, _ := mustTake(t, s, at(500), gcra); !ok {
				t.Fatalf("B at 0.5s: got rejected, want admitted")
			}
			if err := s.Release(context.Background(), at(501), []bucket.Taken{{Charge: gcra, At: at(0), Token: r[0].Token}}); err != nil {
				t.Fatalf("Release of A: %v", err)
			}
			return s
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			gcra := bucket.Charge{Key: newKey(t), Limit: limit}
			s := p.run(t, gcra)
			admitted := 1 // B
			for _, ms := range []int{501, 1000} {
				if ok, _ := mustTake(t, s, at(ms), gcra); ok {
					admitted++
				}
			}
			if admitted > 2 {
				t.Errorf("B, C and E admitted after A was given back: got %d, want at most 2 (as if A had never been taken)", admitted)
			}
		})
	}
}

// TestGiveBackAdversary runs the bucket package's give-back adversary (random histories of takes
// and charge_on give-backs at random later instants, each verdict checked against a store that
// never saw the charges given back) on the DynamoDB store. Its charges are single, so both modes
// take the same path: one is enough, with fewer histories than in memory (each call is a round
// trip to DynamoDB Local).
func TestGiveBackAdversary(t *testing.T) {
	api, table := localTable(t)
	buckettest.RunGiveBack(t, func(t *testing.T) bucket.Releaser {
		s := dynamo.New(api, dynamo.Options{Table: table})
		t.Cleanup(func() { s.Close() })
		return s
	}, buckettest.GiveBackOptions{Histories: 50})
}

// refundFailsAPI passes every call on, except the give-backs (UpdateItem with "#tat - :t" or
// "ADD #count :minus"), which fail every time without being sent.
type refundFailsAPI struct {
	dynamo.API
	attempts atomic.Int64
}

func (f *refundFailsAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if e := aws.ToString(in.UpdateExpression); strings.Contains(e, "#tat - :t") || strings.Contains(e, "ADD #count :minus") {
		f.attempts.Add(1)
		return nil, errors.New("injected: the give-back failed")
	}
	return f.API.UpdateItem(ctx, in, o...)
}

// TestGiveBackFailureCountedAndLogged: a give-back that never lands is retried a bounded number
// of times, then counted in ratelimit_dynamodb_giveback_failures_total and logged, never lost
// silently; the limit stays stricter (the charge stays spent).
func TestGiveBackFailureCountedAndLogged(t *testing.T) {
	api, table := localTable(t)
	f := &refundFailsAPI{API: api}
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.WarnLevel)
	s := dynamo.New(f, dynamo.Options{Table: table, Registerer: reg, Logger: zap.New(core)})
	gcra := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}}
	window := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
	if ok, _ := mustTake(t, s, t0, window); !ok {
		t.Fatalf("first window request: rejected, want admitted")
	}
	if ok, _ := mustTake(t, s, t0, gcra, window); ok {
		t.Fatalf("group with the used-up window: admitted, want rejected")
	}
	if got := f.attempts.Load(); got < 2 || got > 4 {
		t.Errorf("give-back attempts: got %d, want 2 to 4 (retried, within a bound)", got)
	}
	if got := testutil.ToFloat64(counterOf(t, reg, "ratelimit_dynamodb_giveback_failures_total", "op", "refund")); got != 1 {
		t.Errorf("ratelimit_dynamodb_giveback_failures_total{op=refund}: got %v, want 1", got)
	}
	if got := logs.FilterMessageSnippet("give-back failed").Len(); got != 1 {
		t.Errorf("log lines about the failed give-back: got %d, want 1", got)
	}
	// Stricter, never looser: the charge stays spent.
	if got := admits(t, s, t0, gcra, 2); got != 1 {
		t.Errorf("admitted after the failed give-back (burst 2): got %d, want 1", got)
	}
}
