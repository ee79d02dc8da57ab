package dynamo_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// wruAPI counts what DynamoDB bills: a write request unit per UpdateItem (applied or failing its
// condition: both consume capacity), two per item of a TransactWriteItems, and read request
// units of strongly consistent reads (one per item of up to 4 KB).
type wruAPI struct {
	api      dynamo.API
	wru, rru atomic.Int64
}

func (c *wruAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.wru.Add(1)
	return c.api.UpdateItem(ctx, in, o...)
}

func (c *wruAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	for _, ka := range in.RequestItems {
		c.rru.Add(int64(len(ka.Keys)))
	}
	return c.api.BatchGetItem(ctx, in, o...)
}

func (c *wruAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	c.wru.Add(2 * int64(len(in.TransactItems)))
	return c.api.TransactWriteItems(ctx, in, o...)
}

// The on-demand prices used for dollars, us-east-1, standard table class (USD per million
// request units), as published since the November 2024 reduction.
const (
	usdPerMillionWRU = 0.625
	usdPerMillionRRU = 0.125
)

// BenchmarkCostPerMillion measures what DynamoDB bills per admitted request for the account tier
// on DynamoDB Local: eight replicas (Stores), an account pool offered twice its rate, alone and
// under two more layers (per-ip over 500 addresses, per-api-key over 20 keys, both roomy), in
// refund mode, transaction mode and lease mode with one and four shards (the pool leased, the
// cold layers written as usual). Time is simulated (request i at i/offered s), so the result does
// not depend on the machine's speed; concurrency (32 goroutines) still lets writes coalesce as
// on a busy replica. It reports write request units per admitted request and dollars per
// million admitted requests. One iteration is one run: use -benchtime 1x.
func BenchmarkCostPerMillion(b *testing.B) {
	api, table := localTable(b)
	perIP := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 5, Burst: 10}
	perKey := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 3000, Window: time.Minute}
	for _, tc := range []struct {
		name     string
		pool     bucket.Limit
		layers   int
		requests int64
	}{
		// The account pool alone, at bench-scale's ratios: 2,000/s, burst 1,000, 5 s.
		{"pool2000", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 2000, Burst: 1000}, 1, 20000},
		// The account pool under two cold layers, scaled down so refund mode's three writes
		// per request fit DynamoDB Local: 200/s, burst 100, 15 s.
		{"pool200+ip+key", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 200, Burst: 100}, 3, 6000},
	} {
		pool, layers, requests := tc.pool, tc.layers, tc.requests
		offered := 2 * pool.Rate
		for _, mode := range []string{"refund", "transaction", "lease", "lease4"} {
			b.Run(tc.name+"/"+mode, func(b *testing.B) {
				for range b.N {
					counting := &wruAPI{api: api}
					m := dynamo.Refund
					if mode == "transaction" {
						m = dynamo.Transaction
					}
					stores := make([]*dynamo.Store, 8)
					for i := range stores {
						stores[i] = dynamo.New(counting, dynamo.Options{Table: table, Mode: m, DenyCache: true})
					}
					lease := bucket.Lease{}
					switch mode {
					case "lease":
						lease = bucket.Lease{Shards: 1}
					case "lease4":
						lease = bucket.Lease{Shards: 4}
					}
					run := time.Now().UnixNano()
					account := bucket.Key{9, byte(layers), byte(run), byte(run >> 8), byte(run >> 16)}
					start := time.Unix(1_900_000_000, 0)
					var next, admitted atomic.Int64
					var wg sync.WaitGroup
					for range 32 {
						wg.Go(func() {
							r := make([]bucket.Result, 3)
							for {
								i := next.Add(1) - 1
								if i >= requests {
									return
								}
								now := start.Add(time.Duration(float64(i) / offered * 1e9))
								charges := []bucket.Charge{{Key: account, Limit: pool, Lease: lease}}
								if layers == 3 {
									ip := i % 500
									key := i % 20
									charges = append(charges,
										bucket.Charge{Key: bucket.Key{10, byte(ip), byte(ip >> 8), byte(run), byte(run >> 8), byte(run >> 16)}, Limit: perIP},
										bucket.Charge{Key: bucket.Key{11, byte(key), byte(run), byte(run >> 8), byte(run >> 16)}, Limit: perKey})
								}
								ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
								ok, err := stores[i%8].Take(ctx, now, charges, r[:len(charges)])
								cancel()
								if err != nil {
									b.Errorf("Take: %v", err)
									return
								}
								if ok {
									admitted.Add(1)
								}
							}
						})
					}
					wg.Wait()
					for _, s := range stores {
						_ = s.CloseLeases(context.Background())
					}
					a := float64(admitted.Load())
					wru, rru := float64(counting.wru.Load()), float64(counting.rru.Load())
					b.ReportMetric(a, "admitted")
					b.ReportMetric(wru/a, "WRU/admitted")
					b.ReportMetric(rru/a, "RRU/admitted")
					b.ReportMetric((wru*usdPerMillionWRU+rru*usdPerMillionRRU)/a, "USD/Madmitted")
				}
			})
		}
	}
}
