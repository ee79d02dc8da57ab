package dynamo_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// t0 is a fixed decision instant; each test uses its own keys, so tests sharing the table and
// the instant never share state.
var t0 = time.Unix(1_700_000_000, 0)

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts dynamo.Options
	}{
		{"Refund", dynamo.Options{Mode: dynamo.Refund}},
		{"RefundDenyCache", dynamo.Options{Mode: dynamo.Refund, DenyCache: true}},
		{"Transaction", dynamo.Options{Mode: dynamo.Transaction}},
		{"TransactionDenyCache", dynamo.Options{Mode: dynamo.Transaction, DenyCache: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, table := localTable(t)
			o := tc.opts
			o.Table = table
			buckettest.Run(t, func(t *testing.T) bucket.Store { return dynamo.New(api, o) })
			buckettest.RunRelease(t, func(t *testing.T) bucket.Releaser {
				s := dynamo.New(api, o)
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}

// countingAPI wraps the real client and counts the calls that reach it.
type countingAPI struct {
	api                          dynamo.API
	updates, batchGets, transact atomic.Int64
}

func (c *countingAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.updates.Add(1)
	return c.api.UpdateItem(ctx, in, o...)
}

func (c *countingAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	c.batchGets.Add(1)
	return c.api.BatchGetItem(ctx, in, o...)
}

func (c *countingAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	c.transact.Add(1)
	return c.api.TransactWriteItems(ctx, in, o...)
}

func (c *countingAPI) calls() int64 { return c.updates.Load() + c.batchGets.Load() + c.transact.Load() }

func newKey(t *testing.T) bucket.Key { return buckettest.NewKey(t) }

// TestReplicasShareExactCount runs two stores (two replicas, each with its own caches) against
// one table, hammered from many goroutines at one instant: together they admit exactly the limit
// (for a quota, exactly limit in the period; for a weighted charge, exactly floor(limit/cost)).
// Each request also charges a roomy token bucket, so a rejected group must give its charge back:
// that bucket ends with at least one request spent per admitted group, never less.
func TestReplicasShareExactCount(t *testing.T) {
	api, table := localTable(t)
	const goroutines, each = 32, 6 // 192 requests per case
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	limits := []struct {
		name  string
		limit bucket.Limit
		cost  int64
		want  int64
	}{
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 40}, 1, 40},
		{"LeakyBucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 40}, 1, 41},
		{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 40, Window: time.Minute}, 1, 40},
		{"SlidingWindow", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 40, Window: time.Minute}, 1, 40},
		{"Quota", bucket.Limit{Algorithm: bucket.Quota, Count: 40, Period: bucket.Month, Zone: tokyo}, 1, 40},
		// Weighted: exactly floor(limit/cost) requests fit.
		{"TokenBucket/cost3", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 40}, 3, 13},
		{"FixedWindow/cost4", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 40, Window: time.Minute}, 4, 10},
		{"SlidingWindow/cost3", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 40, Window: time.Minute}, 3, 13},
		{"Quota/cost5", bucket.Limit{Algorithm: bucket.Quota, Count: 42, Period: bucket.Week, Offset: 1}, 5, 8},
	}
	roomy := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1000}
	for _, mode := range []dynamo.Mode{dynamo.Refund, dynamo.Transaction} {
		for _, tc := range limits {
			t.Run(mode.String()+"/"+tc.name, func(t *testing.T) {
				replicas := []*dynamo.Store{
					dynamo.New(api, dynamo.Options{Table: table, Mode: mode, DenyCache: true}),
					dynamo.New(api, dynamo.Options{Table: table, Mode: mode, DenyCache: true}),
				}
				charges := []bucket.Charge{{Key: newKey(t), Limit: tc.limit, Cost: tc.cost}, {Key: newKey(t), Limit: roomy}}
				var admitted atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, goroutines)
				for g := range goroutines {
					s := replicas[g%len(replicas)]
					wg.Go(func() {
						r := make([]bucket.Result, len(charges))
						for range each {
							ok, err := s.Take(context.Background(), t0, charges, r)
							if err != nil {
								errs <- err
								return
							}
							if ok {
								admitted.Add(1)
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("Take: %v", err)
				}
				if got := admitted.Load(); got != tc.want {
					t.Errorf("two replicas, %d requests at one instant: got %d admitted, want %d", goroutines*each, got, tc.want)
				}
				// The roomy bucket paid only for admitted groups.
				r := make([]bucket.Result, 1)
				if _, err := replicas[0].Take(context.Background(), t0, charges[1:], r); err != nil {
					t.Fatalf("Take: %v", err)
				}
				// A give-back is exact or stricter: a rejected group's charge goes back whole
				// unless more than the chain of last writes came after it (see refund.go).
				if want := roomy.Burst - tc.want - 1; r[0].Remaining > want {
					t.Errorf("roomy bucket after the hammer: got Remaining %d, want at most %d (a give-back never leaves more than a bucket without the rejected groups)", r[0].Remaining, want)
				} else if r[0].Remaining < want {
					t.Logf("roomy bucket after the hammer: Remaining %d of %d: %d rejected groups' charges could not be given back exactly", r[0].Remaining, want, want-r[0].Remaining)
				}
			})
		}
	}
}

// TestItemsCarryTTLAndDigestsOnly scans the table after requests of every kind: every item is
// named by a hex key digest and a kind suffix, holds only known attributes, and carries a ttl
// after the instant it was last written for.
func TestItemsCarryTTLAndDigestsOnly(t *testing.T) {
	api, table := localTable(t)
	s := dynamo.New(api, dynamo.Options{Table: table})
	t.Cleanup(func() { s.Close() })
	charges := []bucket.Charge{
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}},
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 2}},
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Minute}},
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 2, Window: time.Minute}},
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 5}},
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 4}, Lease: bucket.Lease{Shards: 2, TTL: time.Second}},
		{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 4, Window: time.Minute}, Lease: bucket.Lease{Shards: 2}},
	}
	defer s.CloseLeases(context.Background())
	// A leased charge is refused until its first lease has arrived, asynchronously, and a
	// refused group writes nothing: taken in one group, every item could be missing (run alone,
	// the test found none; in a loaded make test, 5 of 7). So the unleased charges go as one
	// group and each leased one alone, until each has been admitted.
	r := make([]bucket.Result, len(charges))
	at := 0 // seconds after t0
	for _, group := range [][]bucket.Charge{charges[:5], charges[5:6], charges[6:7]} {
		deadline := time.Now().Add(10 * time.Second)
		for admitted := 0; admitted < 2; at++ {
			ok, err := s.Take(context.Background(), t0.Add(time.Duration(at)*time.Second), group, r[:len(group)])
			if err != nil {
				t.Fatalf("Take: %v", err)
			}
			if ok {
				admitted++
			} else if time.Now().After(deadline) {
				t.Fatalf("%s never admitted within 10s: %+v", group[0].Key, r[:len(group)])
			} else {
				time.Sleep(20 * time.Millisecond) // polling the lease's arrival with a deadline
			}
		}
	}
	pkRE := regexp.MustCompile(`^[0-9a-f]{32}#(g|w-?[0-9]+|s-?[0-9]+|q-?[0-9]+|c)(#l[0-9]+)?$`)
	slotRE := regexp.MustCompile(`^l[0-9a-f]{1,16}$`) // a concurrency slot's lease: a random id
	chainRE := regexp.MustCompile(`^[wc][1-8]$`)      // a GCRA item's chain of last writes
	// A counter's give-backs: ids (g) and epoch (e); a leased token bucket's last write (lv).
	allowed := map[string]bool{"pk": true, "tat": true, "count": true, "ttl": true, "sealed": true, "g": true, "e": true, "lv": true}
	ours := map[string]bool{}
	for _, c := range charges {
		ours[c.Key.String()] = false
	}
	p := dynamodb.NewScanPaginator(local.client, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	items := 0
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("Scan: %v", err)
		}
		for _, item := range page.Items {
			items++
			pk := item["pk"].(*types.AttributeValueMemberS).Value
			if !pkRE.MatchString(pk) {
				t.Errorf("item pk %q: want <32 hex digits>#<kind>", pk)
			}
			if _, ok := ours[pk[:32]]; ok {
				ours[pk[:32]] = true
			}
			for name := range item {
				if !allowed[name] && !(strings.HasSuffix(pk, "#c") && slotRE.MatchString(name)) &&
					!(strings.HasSuffix(pk, "#g") && chainRE.MatchString(name)) {
					t.Errorf("item %s: unexpected attribute %q", pk, name)
				}
			}
			ttl, ok := item["ttl"].(*types.AttributeValueMemberN)
			if !ok {
				t.Errorf("item %s: no numeric ttl", pk)
				continue
			}
			// Every item written here matters at least until t0; ttl is at least an hour later.
			if v, _ := strconv.ParseInt(ttl.Value, 10, 64); strings.HasPrefix(pk, charges[0].Key.String()) && v <= t0.Add(time.Hour).Unix() {
				t.Errorf("item %s: got ttl %s, want > %d", pk, ttl.Value, t0.Add(time.Hour).Unix())
			}
		}
	}
	for k, seen := range ours {
		if !seen {
			t.Errorf("no item for key %s in the table", k)
		}
	}
	if items == 0 {
		t.Fatalf("scan found no items")
	}
}

// TestDenyCacheAvoidsCalls: once a window is exhausted, rejections until its end are answered
// without DynamoDB, with the same Result a call would give.
func TestDenyCacheAvoidsCalls(t *testing.T) {
	api, table := localTable(t)
	counting := &countingAPI{api: api}
	reg := prometheus.NewRegistry()
	s := dynamo.New(counting, dynamo.Options{Table: table, DenyCache: true, Registerer: reg})
	l := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Minute}
	c := []bucket.Charge{{Key: newKey(t), Limit: l}}
	r := make([]bucket.Result, 1)
	start := time.Unix(1_700_000_040, 0) // a window starts here
	take := func(at time.Duration) bool {
		t.Helper()
		ok, err := s.Take(context.Background(), start.Add(at), c, r)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		return ok
	}
	for range 3 {
		if !take(time.Second) {
			t.Fatalf("take within Count: got rejected, want admitted")
		}
	}
	if take(time.Second) {
		t.Fatalf("take past Count: got admitted, want rejected")
	}
	if got := counting.calls(); got != 4 {
		t.Fatalf("calls for 4 takes: got %d, want 4", got)
	}
	for i := range 100 {
		if take(time.Second + time.Duration(i)*100*time.Millisecond) {
			t.Fatalf("cached denial %d: got admitted, want rejected", i)
		}
	}
	if got := counting.calls(); got != 4 {
		t.Errorf("calls after 100 cached denials: got %d, want 4", got)
	}
	if got := metricValue(t, reg, "ratelimit_deny_cache_hits_total", ""); got != 100 {
		t.Errorf("ratelimit_deny_cache_hits_total: got %v, want 100", got)
	}
	// A cached denial carries the same Result as a decided one.
	take(50 * time.Second)
	want := bucket.Result{Limit: 3, RetryAfter: 10 * time.Second, Reset: 10 * time.Second}
	if r[0] != want {
		t.Errorf("cached denial: got %+v, want %+v", r[0], want)
	}
	// At the window's end the cache lets go and DynamoDB decides again.
	if !take(time.Minute) {
		t.Errorf("take in the next window: got rejected, want admitted")
	}
	if got := counting.calls(); got != 5 {
		t.Errorf("calls after the window ended: got %d, want 5", got)
	}
}

// TestRejectedGroupRefunds: in Refund mode a rejected group's applied writes are given back, and
// the refunds are counted; in Transaction mode nothing is written and nothing refunded.
func TestRejectedGroupRefunds(t *testing.T) {
	api, table := localTable(t)
	for _, tc := range []struct {
		mode                   dynamo.Mode
		refunds, transactCalls float64
	}{{dynamo.Refund, 2, 0}, {dynamo.Transaction, 0, 2}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := dynamo.New(api, dynamo.Options{Table: table, Mode: tc.mode, Registerer: reg})
			bucketCharge := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}}
			windowCharge := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Minute}}
			strict := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 1, Window: time.Minute}}
			group := []bucket.Charge{bucketCharge, windowCharge, strict}
			r := make([]bucket.Result, len(group))
			for i, want := range []bool{true, false} {
				ok, err := s.Take(context.Background(), t0, group, r)
				if err != nil {
					t.Fatalf("Take %d: %v", i, err)
				}
				if ok != want {
					t.Fatalf("Take %d: got admitted=%v, want %v", i, ok, want)
				}
			}
			// Only the admitted group was spent: the next requests report 2 spent, not 3.
			for _, c := range group[:2] {
				one := make([]bucket.Result, 1)
				if _, err := s.Take(context.Background(), t0, []bucket.Charge{c}, one); err != nil {
					t.Fatalf("Take: %v", err)
				}
				if one[0].Remaining != 8 {
					t.Errorf("algorithm %d after a rejected group: got Remaining %d, want 8", c.Limit.Algorithm, one[0].Remaining)
				}
			}
			if got := metricValue(t, reg, "ratelimit_store_requests_total", "refund"); got != tc.refunds {
				t.Errorf("refund calls: got %v, want %v", got, tc.refunds)
			}
			if got := metricValue(t, reg, "ratelimit_store_requests_total", "transact"); got != tc.transactCalls {
				t.Errorf("transact calls: got %v, want %v", got, tc.transactCalls)
			}
		})
	}
}

// TestCreateTableIdempotent creates a table twice and checks its key schema, billing mode and TTL.
func TestCreateTableIdempotent(t *testing.T) {
	api, _ := localTable(t)
	ctx := context.Background()
	name := randomName("ratelimit-create")
	for i := range 2 {
		if err := dynamo.CreateTable(ctx, api, name); err != nil {
			t.Fatalf("CreateTable call %d: %v", i+1, err)
		}
	}
	t.Cleanup(func() {
		_, _ = api.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	d, err := api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatalf("DescribeTable: %v", err)
	}
	ks := d.Table.KeySchema
	if len(ks) != 1 || aws.ToString(ks[0].AttributeName) != "pk" || ks[0].KeyType != types.KeyTypeHash {
		t.Errorf("key schema: got %+v, want pk HASH only", ks)
	}
	if d.Table.BillingModeSummary == nil || d.Table.BillingModeSummary.BillingMode != types.BillingModePayPerRequest {
		t.Errorf("billing mode: got %+v, want PAY_PER_REQUEST", d.Table.BillingModeSummary)
	}
	ttl, err := api.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(name)})
	if err != nil {
		t.Fatalf("DescribeTimeToLive: %v", err)
	}
	if got := ttl.TimeToLiveDescription; got == nil || aws.ToString(got.AttributeName) != "ttl" || got.TimeToLiveStatus != types.TimeToLiveStatusEnabled {
		t.Errorf("TTL: got %+v, want enabled on ttl", got)
	}
}

// metricValue returns the value of counter name (with label op="op" when op is not empty).
func metricValue(t *testing.T, reg *prometheus.Registry, name, op string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := op == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "op" && lp.GetValue() == op {
					match = true
				}
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s{op=%q} not found", name, op)
	return 0
}

// TestDenyCacheFollowsReloadedLimit: a denial is cached per key AND limit: after
// a reload raises the limit of the same key, the cached denial of the old limit no longer
// answers, and the store admits what the new limit allows.
func TestDenyCacheFollowsReloadedLimit(t *testing.T) {
	api, table := localTable(t)
	for _, tc := range []struct {
		name        string
		old, raised bucket.Limit
	}{
		{"fixed", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour},
			bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}},
		{"token", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 1},
			bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := dynamo.New(api, dynamo.Options{Table: table, DenyCache: true})
			key := newKey(t)
			if ok, _ := mustTake(t, s, t0, bucket.Charge{Key: key, Limit: tc.old}); !ok {
				t.Fatalf("first request: got rejected, want admitted")
			}
			if ok, _ := mustTake(t, s, t0, bucket.Charge{Key: key, Limit: tc.old}); ok {
				t.Fatalf("second request under the old limit: got admitted, want rejected")
			}
			ok, r := mustTake(t, s, t0, bucket.Charge{Key: key, Limit: tc.raised})
			if !ok {
				t.Errorf("request under the raised limit: got rejected (%+v), want admitted", r[0])
			}
		})
	}
}

// TestWarmReadsAndReportsTheStore: Warm answers nil from a working table and writes nothing to
// it; a failing store's error and a hung store's deadline come back from it, within the deadline.
func TestWarmReadsAndReportsTheStore(t *testing.T) {
	client, table := localTable(t)
	counted := &countingAPI{api: client}
	s := dynamo.New(counted, dynamo.Options{Table: table})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Warm(ctx, 4); err != nil {
		t.Fatalf("Warm on DynamoDB Local: %v", err)
	}
	// The write path warms too (a cold DynamoDB Local's first conditional update can take
	// longer than store.timeout): one update, whose condition never holds.
	if got := counted.updates.Load(); got != 1 {
		t.Errorf("Warm sent %d updates, want 1 (the write path warmed before the first decision)", got)
	}
	if got := counted.batchGets.Load(); got != 4 {
		t.Errorf("Warm sent %d reads, want 4", got)
	}
	if err := s.Probe(ctx, 1); err != nil || counted.updates.Load() != 1 {
		t.Errorf("Probe: %v, %d updates in all; want nil and no update of its own", err, counted.updates.Load())
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "ratelimit-proxy#warm"}}})
	if err != nil || len(out.Item) != 0 {
		t.Errorf("after Warm the table holds %v (err %v), want no item", out.Item, err)
	}
	// Even an item someone did write there is left as it was.
	planted := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "ratelimit-proxy#warm"}, "warm": &types.AttributeValueMemberN{Value: "7"}}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: planted}); err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(ctx, 1); err != nil {
		t.Fatalf("Warm beside a planted item: %v", err)
	}
	out, err = client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "ratelimit-proxy#warm"}}})
	if w, _ := out.Item["warm"].(*types.AttributeValueMemberN); err != nil || w == nil || w.Value != "7" || len(out.Item) != 2 {
		t.Errorf("Warm changed a planted item: %v (err %v)", out.Item, err)
	}

	boom := errors.New("no route to host")
	if err := dynamo.New(&fakeAPI{err: boom}, dynamo.Options{Table: "t"}).Warm(ctx, 4); !errors.Is(err, boom) {
		t.Errorf("Warm on a failing store: got %v, want %v", err, boom)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer hcancel()
	start := time.Now()
	err = dynamo.New(&fakeAPI{block: true}, dynamo.Options{Table: "t"}).Warm(hctx, 4)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Errorf("Warm on a hung store: got %v after %v, want the 30ms deadline", err, time.Since(start))
	}
}
