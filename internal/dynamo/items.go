package dynamo

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// The DynamoDB calls and attribute values every algorithm's writes share.

// maxBatchGet is BatchGetItem's limit of keys per call.
const maxBatchGet = 100

// readItems reads the items pks with strongly consistent reads; missing items are absent from
// the map.
func (s *Store) readItems(ctx context.Context, pks []string) (map[string]map[string]types.AttributeValue, error) {
	out := make(map[string]map[string]types.AttributeValue, len(pks))
	for start := 0; start < len(pks); start += maxBatchGet {
		keys := make([]map[string]types.AttributeValue, 0, min(maxBatchGet, len(pks)-start))
		for _, pk := range pks[start:min(start+maxBatchGet, len(pks))] {
			keys = append(keys, map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: pk}})
		}
		req := map[string]types.KeysAndAttributes{s.table: {Keys: keys, ConsistentRead: aws.Bool(true)}}
		throttles := 0
		for round := 0; len(req) > 0; round++ {
			if round == maxRounds {
				return nil, fmt.Errorf("dynamo: batch_get: unprocessed keys after %d rounds: %w", round, ErrContention)
			}
			s.m.requests.WithLabelValues(opBatchGet).Inc()
			sent := time.Now()
			res, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil && s.retryThrottled(ctx, opBatchGet, throttles, err, time.Since(sent)) {
				throttles++
				round-- // a throttled read is not a round of unprocessed keys
				continue
			}
			err = throttledErr(err)
			if err != nil {
				s.m.errors.WithLabelValues(opBatchGet).Inc()
				return nil, fmt.Errorf("dynamo: batch_get %s: %w", pks[start], err)
			}
			for _, item := range res.Responses[s.table] {
				if pk, ok := item[attrPK].(*types.AttributeValueMemberS); ok {
					out[pk.Value] = item
				}
			}
			req = res.UnprocessedKeys
		}
	}
	return out, nil
}

// update is one conditional write, in the parts UpdateItem and TransactWriteItems share.
type update struct {
	expr, cond string
	names      map[string]string
	values     map[string]types.AttributeValue
}

// noRetry makes one call a single attempt.
func noRetry(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

// updateItem sends u to item pk; u.cond may be empty (an unconditional write). op labels the
// call in the metrics. A throttled write was not applied, so it is retried (see retryThrottled),
// whatever optFns say about the SDK's own retries; so is one refused because a transaction was
// writing the item (see retryConflict).
func (s *Store) updateItem(ctx context.Context, op, pk string, u update, rv types.ReturnValue, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	in := &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: pk}},
		UpdateExpression:          aws.String(u.expr),
		ExpressionAttributeNames:  u.names,
		ExpressionAttributeValues: u.values,
		ReturnValues:              rv,
	}
	if u.cond != "" {
		in.ConditionExpression = aws.String(u.cond)
		in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	}
	for attempt := 0; ; attempt++ {
		s.m.requests.WithLabelValues(op).Inc()
		start := time.Now()
		out, err := s.api.UpdateItem(ctx, in, optFns...)
		if err == nil || !s.retryThrottled(ctx, op, attempt, err, time.Since(start)) && !s.retryConflict(ctx, attempt, err, time.Since(start)) {
			if attempt > 0 && err != nil && ctx.Err() != nil {
				// The retries of a throttled write ran into the deadline: throttling, not an
				// outage, is why the decision failed.
				return out, fmt.Errorf("%w: retried until the deadline: %w", ErrThrottled, err)
			}
			return out, throttledErr(err)
		}
	}
}

// ErrThrottled is wrapped by the errors of calls that DynamoDB kept throttling (the item's or
// the table's throughput exceeded) until the decision's deadline left no time for a retry.
var ErrThrottled = errors.New("dynamo: throttled")

// throttleCodes are DynamoDB's error codes for a call refused for throughput: the call was not
// applied, so retrying it is safe even for a write that is not idempotent.
var throttleCodes = map[string]bool{
	"ProvisionedThroughputExceededException": true,
	"ThrottlingException":                    true,
	"RequestLimitExceeded":                   true,
	"Throttling":                             true,
}

// IsThrottle reports whether err is DynamoDB refusing a call for throughput.
func IsThrottle(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return throttleCodes[ae.ErrorCode()]
	}
	var tr throttleReason
	return errors.As(err, &tr)
}

// throttleReason stands for a transaction cancelled because one of its items was throttled.
type throttleReason struct{}

func (throttleReason) Error() string { return "transaction item throttled" }

// throttledErr marks a throttling error with ErrThrottled.
func throttledErr(err error) error {
	if err != nil && IsThrottle(err) {
		return fmt.Errorf("%w: %w", ErrThrottled, err)
	}
	return err
}

// throttleCounter is the context key of a counter of throttled calls (an item's, for the
// requests queued on it).
type throttleCounter struct{}

// Throttling backoff: full jitter (a uniform wait up to base*2^attempt, at most throttleCap), so
// that replicas throttled together do not come back together.
const (
	// maxThrottleRetries bounds the retries of one call when its context has no deadline.
	maxThrottleRetries = 10
	throttleBase       = 2 * time.Millisecond
	throttleMargin     = 10 * time.Millisecond
	throttleCap        = 50 * time.Millisecond
)

// retryConflict waits before retrying a call that DynamoDB refused with
// TransactionConflictException: another replica's transaction (mode: transaction) was writing
// the item. The call was not applied, so sending it again is safe for any write; false when err
// is not such a refusal, or when the wait and another call would not end well before ctx's
// deadline (as for throttling).
func (s *Store) retryConflict(ctx context.Context, attempt int, err error, took time.Duration) bool {
	var tce *types.TransactionConflictException
	if !errors.As(err, &tce) || attempt >= maxThrottleRetries {
		return false
	}
	return s.backoff(ctx, attempt, took)
}

// backoff waits a full-jitter delay before retry attempt+1 of a call that took took and was not
// applied; false, without waiting, when the wait and another call as long would not end well
// before ctx's deadline, or when ctx ends first.
func (s *Store) backoff(ctx context.Context, attempt int, took time.Duration) bool {
	ceiling := min(throttleCap, throttleBase<<min(attempt, 8))
	d := time.Duration(s.rnd.Int64N(int64(ceiling)) + 1)
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= d+max(throttleMargin, 2*took) {
		return false
	}
	return s.sleep(ctx, d)
}

// retryThrottled counts a throttled call (that took took) and waits before its retry; false when
// err is not a throttle or the wait and another call as long would not end well before ctx's
// deadline (the caller then fails, and the decision follows on_error).
func (s *Store) retryThrottled(ctx context.Context, op string, attempt int, err error, took time.Duration) bool {
	if !IsThrottle(err) {
		return false
	}
	if c, ok := ctx.Value(throttleCounter{}).(*atomic.Int64); ok {
		c.Add(1)
	}
	if attempt >= maxThrottleRetries {
		s.m.throttled.WithLabelValues(op).Inc()
		return false
	}
	s.m.throttled.WithLabelValues(op).Inc()
	// Give up while there is still time to say why: a decision that ends on its deadline
	// reads as a store timeout (an outage, to the circuit breaker) rather than as throttling.
	return s.backoff(ctx, attempt, took)
}

// sleep waits d, or until ctx ends: false then.
func (s *Store) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	k := s.turns.Park()
	defer s.turns.Resume(k)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
