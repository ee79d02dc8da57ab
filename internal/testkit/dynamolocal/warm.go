package dynamolocal

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

// WarmUp writes item pk of table (one no gateway uses) straight to DynamoDB Local from 8
// goroutines, in rounds of one second, until a round's median write is under 10 ms or maxRounds
// rounds have run, and returns the last round's median and the rounds run. A cold DynamoDB Local
// (its JIT, on a busy machine) answers its first writes in hundreds of milliseconds, past a
// gateway's store.timeout, and every replica's circuit would open on its first decisions.
func WarmUp(ctx context.Context, client *dynamodb.Client, table, pk string, maxRounds int) (time.Duration, int, error) {
	for round := 1; ; round++ {
		p50, err := warmRound(ctx, client, table, pk)
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return 0, round, err
		}
		if p50 < 10*time.Millisecond || round >= maxRounds {
			return p50, round, nil
		}
	}
}

// warmRound is one second of writes; it returns their median latency.
func warmRound(ctx context.Context, client *dynamodb.Client, table, pk string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs int
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				t := time.Now()
				_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
					TableName:                 aws.String(table),
					Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}},
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
		})
	}
	wg.Wait()
	if errs > 0 || len(lat) == 0 {
		return 0, fmt.Errorf("warm-up: %d UpdateItems to DynamoDB Local failed", errs)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], nil
}
