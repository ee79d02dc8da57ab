package dynamo_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// fakeAPI answers every call with err, or, when block is set, waits for the context to end.
type fakeAPI struct {
	err   error
	block bool
}

func (f *fakeAPI) wait(ctx context.Context) error {
	if f.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.err
}

func (f *fakeAPI) UpdateItem(ctx context.Context, _ *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return nil, f.wait(ctx)
}

func (f *fakeAPI) BatchGetItem(ctx context.Context, _ *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return nil, f.wait(ctx)
}

func (f *fakeAPI) TransactWriteItems(ctx context.Context, _ *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return nil, f.wait(ctx)
}

var allAlgorithms = []bucket.Limit{
	{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 5},
	{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 5},
	{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Minute},
	{Algorithm: bucket.SlidingWindow, Count: 5, Window: time.Minute},
	{Algorithm: bucket.Quota, Count: 5, Period: bucket.Month},
}

// TestThrottlingIsAnError: a throttled store never decides "allowed"; the caller's on_error rule
// decides, and it can recognise the SDK's error.
func TestThrottlingIsAnError(t *testing.T) {
	throttles := []error{
		&types.ProvisionedThroughputExceededException{Message: aws.String("slow down")},
		&types.RequestLimitExceeded{Message: aws.String("slow down")},
		&types.ThrottlingException{Message: aws.String("slow down")},
	}
	for _, mode := range []dynamo.Mode{dynamo.Refund, dynamo.Transaction} {
		for _, throttle := range throttles {
			s := dynamo.New(&fakeAPI{err: throttle}, dynamo.Options{Table: "t", Mode: mode})
			for _, l := range allAlgorithms {
				charges := []bucket.Charge{{Key: newKey(t), Limit: l}, {Key: newKey(t), Limit: allAlgorithms[0]}}
				r := make([]bucket.Result, len(charges))
				admitted, err := s.Take(context.Background(), t0, charges, r)
				if admitted || !errors.Is(err, throttle) {
					t.Errorf("%v, algorithm %d, %T: got admitted=%v err=%v, want false and the throttling error",
						mode, l.Algorithm, throttle, admitted, err)
				}
			}
		}
	}
}

// TestDeadlineReturnsPromptly: a store that does not answer costs the caller its deadline, not
// more, and the error says why.
func TestDeadlineReturnsPromptly(t *testing.T) {
	for _, mode := range []dynamo.Mode{dynamo.Refund, dynamo.Transaction} {
		s := dynamo.New(&fakeAPI{block: true}, dynamo.Options{Table: "t", Mode: mode})
		for _, l := range allAlgorithms {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			charges := []bucket.Charge{{Key: newKey(t), Limit: l}, {Key: newKey(t), Limit: allAlgorithms[2]}}
			r := make([]bucket.Result, len(charges))
			start := time.Now()
			admitted, err := s.Take(ctx, t0, charges, r)
			elapsed := time.Since(start)
			cancel()
			if admitted || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%v, algorithm %d: got admitted=%v err=%v, want false and context.DeadlineExceeded", mode, l.Algorithm, admitted, err)
			}
			if elapsed > time.Second {
				t.Errorf("%v, algorithm %d: returned after %v, want about the 20ms deadline", mode, l.Algorithm, elapsed)
			}
		}
	}
}
