// Command dynprobe measures, against a DynamoDB-API endpoint (DynamoDB Local in `make bench`),
// the latency a rate-limit decision on the DynamoDB store adds compared with the floor: one raw
// UpdateItem round trip (an atomic ADD on one item, the cheapest write a store can make). It
// runs the calls one after another from one goroutine, so each sample is one round trip and
// nothing queues, and prints a markdown table with medians, p99s and the ratios.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

func main() {
	endpoint := flag.String("endpoint", "", "DynamoDB endpoint URL (required)")
	table := flag.String("table", "bench-probe", "table to create and use")
	n := flag.Int("n", 2000, "samples per measurement")
	flag.Parse()
	if *endpoint == "" {
		log.Fatal("dynprobe: -endpoint is required")
	}
	ctx := context.Background()
	// The gateway's client settings with DynamoDB Local's dummy credentials.
	client, err := dynamolocal.NewClient(ctx, *endpoint)
	if err != nil {
		log.Fatal(err)
	}
	if err := dynamo.CreateTable(ctx, client, *table); err != nil {
		log.Fatal(err)
	}

	raw := func(i int) error {
		_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 table,
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "raw-" + strconv.Itoa(i%1000)}},
			UpdateExpression:          aws.String("ADD #c :one"),
			ExpressionAttributeNames:  map[string]string{"#c": "c"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
			ReturnValues:              types.ReturnValueAllNew,
		})
		return err
	}
	store := dynamo.New(client, dynamo.Options{Table: *table, DenyCache: true})
	bucketLimit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e6, Burst: 1e6}
	take := func(charges int) func(int) error {
		cs := make([]bucket.Charge, charges)
		rs := make([]bucket.Result, charges)
		return func(i int) error {
			for j := range cs {
				cs[j] = bucket.Charge{Limit: bucketLimit}
				cs[j].Key[0], cs[j].Key[1], cs[j].Key[2] = byte(j), byte(i%1000), byte(i%1000>>8)
			}
			_, err := store.Take(ctx, time.Now(), cs, rs)
			return err
		}
	}
	// The three calls take turns, one of each per iteration, so that drifts of the shared machine
	// and of DynamoDB Local's JIT weigh on all three alike.
	calls := []func(int) error{raw, take(1), take(3)}
	for i := range *n / 10 { // warm-up: connections, JIT of the server
		for _, f := range calls {
			if err := f(i); err != nil {
				log.Fatal(err)
			}
		}
	}
	lat := make([][]time.Duration, len(calls))
	for i := range *n {
		for c, f := range calls {
			t := time.Now()
			if err := f(i); err != nil {
				log.Fatal(err)
			}
			lat[c] = append(lat[c], time.Since(t))
		}
	}
	measure := func(c int) (p50, p99 time.Duration) {
		slices.Sort(lat[c])
		return lat[c][len(lat[c])/2], lat[c][len(lat[c])*99/100]
	}
	r50, r99 := measure(0)
	fmt.Println("| call (serial, one at a time) | p50 µs | p99 µs | p50 vs raw UpdateItem |")
	fmt.Println("|---|---:|---:|---:|")
	row := func(name string, p50, p99 time.Duration) {
		fmt.Printf("| %s | %d | %d | %.2fx |\n", name, p50.Microseconds(), p99.Microseconds(), float64(p50)/float64(r50))
	}
	row("raw UpdateItem (ADD, ALL_NEW)", r50, r99)
	d50, d99 := measure(1)
	row("decision, 1 token-bucket charge (Store.Take)", d50, d99)
	t50, t99 := measure(2)
	row("decision, 3 charges, refund mode (concurrent writes)", t50, t99)
}
