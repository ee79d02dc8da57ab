package dynamo

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
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
		for round := 0; len(req) > 0; round++ {
			if round == maxRounds {
				return nil, fmt.Errorf("dynamo: batch_get: unprocessed keys after %d rounds: %w", round, ErrContention)
			}
			s.m.requests.WithLabelValues(opBatchGet).Inc()
			res, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
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

// number returns the numeric attribute name of item, and whether it is there.
func number(item map[string]types.AttributeValue, name string) (int64, bool, error) {
	av, ok := item[name]
	if !ok {
		return 0, false, nil
	}
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false, fmt.Errorf("attribute %s is %T, want a number", name, av)
	}
	v, err := strconv.ParseInt(nv.Value, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("attribute %s: %w", name, err)
	}
	return v, true, nil
}

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// ttlAt is the ttl attribute for an item that can affect decisions until instant ns.
func ttlAt(ns int64) types.AttributeValue {
	sec := (ns + int64(time.Second) - 1) / int64(time.Second)
	return num(sec + int64(ttlMargin/time.Second))
}

// update is one conditional write, in the parts UpdateItem and TransactWriteItems share.
type update struct {
	expr, cond string
	names      map[string]string
	values     map[string]types.AttributeValue
}

// noRetry makes one call a single attempt.
func noRetry(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

// updateItem sends u to item pk; u.cond may be empty (an unconditional write).
func (s *Store) updateItem(ctx context.Context, pk string, u update, rv types.ReturnValue, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
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
	return s.api.UpdateItem(ctx, in, optFns...)
}
