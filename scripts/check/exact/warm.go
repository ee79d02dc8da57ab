package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// warmUp writes one item straight to DynamoDB Local (outside the relay and the history) from 8
// goroutines in rounds of one second until the median write is under 10 ms, at most maxRounds.
// A cold DynamoDB Local (its JIT, on a busy machine) answers its first writes in hundreds of
// milliseconds, past store.timeout, and every replica's circuit would open on its first
// decisions: the check would then see only 503s.
func warmUp(ctx context.Context, client *dynamodb.Client, table string, maxRounds int) (time.Duration, int, error) {
	for round := 1; ; round++ {
		p50, err := warmRound(ctx, client, table)
		if err != nil {
			return 0, round, err
		}
		if p50 < 10*time.Millisecond || round >= maxRounds {
			return p50, round, nil
		}
	}
}

func warmRound(ctx context.Context, client *dynamodb.Client, table string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs int
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				t := time.Now()
				_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName:                 aws.String(table),
					Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "check-exact-warm-up"}},
					UpdateExpression:          aws.String("ADD #n :one"),
					ExpressionAttributeNames:  map[string]string{"#n": "n"},
					ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
				})
				mu.Lock()
				if err != nil && ctx.Err() == nil {
					errs++
				} else {
					lat = append(lat, time.Since(t)) // one cut off by the round's end took at least this
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); errs > 0 || len(lat) == 0 {
		return 0, fmt.Errorf("warm-up: %d UpdateItems to DynamoDB Local failed (%v)", errs, err)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], nil
}
