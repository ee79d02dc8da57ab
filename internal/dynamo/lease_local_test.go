package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// Leases against DynamoDB Local under concurrent load, and the lease arithmetic's benchmark.

// TestLeasesOnDynamoDBLocal: replicas (Stores with their own clocks, sweepers and leases) hammer
// one leased pool on DynamoDB Local from many goroutines: renewals race, rejected groups give
// units back, a replica that falls quiet has its leases given back by its sweeper while the
// others lease on, and Close returns the rest. Over the run the fleet never admits more than one
// bucket would (burst + rate × duration), a decision fails only when its deadline has passed,
// and afterwards the pool still admits: leases do not starve it.
func TestLeasesOnDynamoDBLocal(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	for _, tc := range []struct {
		name  string
		limit bucket.Limit
		lease bucket.Lease
	}{
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 150, Burst: 60}, bucket.Lease{Shards: 2, TTL: 100 * time.Millisecond}},
		{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 40, Window: 250 * time.Millisecond}, bucket.Lease{Shards: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const replicas, workers = 4, 6
			reg := prometheus.NewRegistry()
			stores := make([]*dynamo.Store, replicas)
			for i := range stores {
				// The deny cache answers the gate's rejections, as in production (deny_cache is on
				// by default): without it every gated request waits for a write, and under a
				// loaded test machine a replica's leases then expire before its requests come.
				stores[i] = dynamo.New(api, dynamo.Options{Table: table, Registerer: reg, DenyCache: true})
				// DynamoDB Local on a loaded machine stalls for over a second at times: slow,
				// not down. With the default grace (a second) every request that needs a
				// renewal then fails at once, rightly (on_error decides; TestLeaseOnHungStoreIsAnError
				// covers it), but not because of anything this test checks. A grace past the
				// requests' deadline leaves the deadline as the only way a decision fails.
				dynamo.SetLiveness(stores[i], time.Minute, time.Now)
			}
			key, gate := newKey(t), newKey(t)
			gateLimit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
			var admitted, errs atomic.Int64 // errs: deadline exceeded only
			start := time.Now()
			deadline := start.Add(1200 * time.Millisecond)
			quiet := start.Add(400 * time.Millisecond) // replica 0 stops here
			done := make(chan struct{})
			var running atomic.Int64
			for r := range replicas {
				for w := range workers {
					running.Add(1)
					go func() {
						defer func() {
							if running.Add(-1) == 0 {
								close(done)
							}
						}()
						for i := 0; ; i++ {
							now := time.Now()
							if now.After(deadline) || r == 0 && now.After(quiet) {
								return
							}
							charges := []bucket.Charge{{Key: key, Limit: tc.limit, Lease: tc.lease}}
							if (w+i)%5 == 0 {
								charges = append(charges, bucket.Charge{Key: gate, Limit: gateLimit})
							}
							ctx, cancel := context.WithTimeout(context.Background(), time.Second)
							ok, err := stores[r].Take(ctx, now, charges, make([]bucket.Result, len(charges)))
							expired := ctx.Err() != nil
							cancel()
							switch {
							case errors.Is(err, context.DeadlineExceeded) && !expired:
								t.Errorf("Take failed %v after it started, before its 1s deadline: %v", time.Since(now), err)
								return
							case errors.Is(err, context.DeadlineExceeded):
								errs.Add(1)
							case err != nil:
								t.Errorf("Take: %v", err)
								return
							case ok:
								admitted.Add(1)
							}
						}
					}()
				}
			}
			<-done
			elapsed := time.Since(start)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, s := range stores {
				if err := s.CloseLeases(ctx); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
			var bound float64
			if tc.limit.Algorithm == bucket.TokenBucket {
				bound = float64(tc.limit.Burst) + tc.limit.Rate*elapsed.Seconds()
			} else {
				windows := float64(elapsed/tc.limit.Window) + 2 // the run touches at most this many
				bound = float64(tc.limit.Count) * windows
			}
			got := float64(admitted.Load())
			t.Logf("admitted %v in %v (bound %.0f), errors %d, leased %v, spent %v, refunded %v, expired %v, throttled 0",
				got, elapsed.Round(time.Millisecond), bound, errs.Load(),
				testutil.ToFloat64(leaseUnits(t, reg, "leased")), testutil.ToFloat64(leaseUnits(t, reg, "spent")),
				testutil.ToFloat64(leaseUnits(t, reg, "refunded")), testutil.ToFloat64(leaseUnits(t, reg, "expired")))
			if got > bound {
				t.Errorf("admitted %v in %v, want at most %.0f (one exact bucket)", got, elapsed, bound)
			}
			// How much the fleet admits, and how close to the bound it gets, is measured where
			// the machine's load cannot stall the replicas for a good part of a window:
			// TestLeasesNeverOverAdmit (simulated time) and scripts/bench/scale. Here, on a
			// loaded machine, a run may admit next to nothing (DynamoDB Local stalled, leases
			// expired before the workers ran). That the pool is not starved is shown after it:
			// a new replica's requests are admitted within a deadline, once the store answers.
			admittedAfter(t, dynamo.New(api, dynamo.Options{Table: table}), []bucket.Charge{{Key: key, Limit: tc.limit, Lease: tc.lease}})
		})
	}
}

// admittedAfter fails t unless one of s's requests for charges is admitted within 20 s of
// wall-clock time (each at its own instant, with a deadline of its own), then closes s's leases.
func admittedAfter(t *testing.T, s *dynamo.Store, charges []bucket.Charge) {
	t.Helper()
	defer closeLeases(t, s)
	tries := 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tries++
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok, err := s.Take(ctx, time.Now(), charges, make([]bucket.Result, len(charges)))
		cancel()
		if ok && err == nil {
			return
		}
	}
	t.Errorf("after the run, none of %d requests over 20 s admitted: leases starve the pool", tries)
}

// BenchmarkLeasesSimulated: eight replicas lease from one pool of 2,000/s with a burst of 1,000,
// offered twice its rate (Poisson arrivals spread evenly over the replicas) for 20 simulated
// seconds, on a table that applies writes at once: the lease arithmetic alone, without the
// network. It reports the share of one exact bucket admitted and DynamoDB calls per admitted
// request. One iteration is one run: use -benchtime 1x.
func BenchmarkLeasesSimulated(b *testing.B) {
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 2000, Burst: 1000}
	for _, shards := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			for range b.N {
				api := newMemAPI()
				stores := make([]*dynamo.Store, 8)
				reads := &countingReads{memAPI: api}
				for i := range stores {
					stores[i] = dynamo.New(reads, dynamo.Options{Table: "t", Now: frozen})
				}
				key := bucket.Key{42, byte(shards)}
				rng := rand.New(rand.NewPCG(1, 2))
				at, end := t0.UnixNano(), t0.Add(20*time.Second).UnixNano()
				var admitted int
				for at < end {
					r := make([]bucket.Result, 1)
					c := []bucket.Charge{{Key: key, Limit: limit, Lease: bucket.Lease{Shards: shards}}}
					ok, err := stores[rng.IntN(len(stores))].Take(context.Background(), time.Unix(0, at), c, r)
					if err != nil {
						b.Fatal(err)
					}
					if ok {
						admitted++
					}
					at += int64(rng.ExpFloat64() / (2 * limit.Rate) * 1e9)
				}
				for _, s := range stores {
					_ = s.CloseLeases(context.Background())
				}
				exact := float64(limit.Burst) + 20*limit.Rate
				b.ReportMetric(float64(admitted)/exact, "of-exact")
				b.ReportMetric(float64(api.writes())/float64(admitted), "writes/admitted")
				b.ReportMetric(float64(reads.reads.Load())/float64(admitted), "reads/admitted")
			}
		})
	}
}

// countingReads counts the items memAPI reads.
type countingReads struct {
	*memAPI
	reads atomic.Int64
}

func (c *countingReads) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	for _, ka := range in.RequestItems {
		c.reads.Add(int64(len(ka.Keys)))
	}
	return c.memAPI.BatchGetItem(ctx, in, o...)
}
