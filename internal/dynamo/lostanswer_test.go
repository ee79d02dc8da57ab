package dynamo_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The give-back paths of issue 23, each under the fault that broke it: a write lands, its
// answer is lost, another replica (or another give-back of the same process) writes to the
// item, and only then does the retry go out, the SDK's or the store's. Each test counts what a
// bucket admits afterwards against one that saw the give-back once.

// loseThenDoer is a replica's HTTP client to DynamoDB Local that loses the answer of the first
// request matching op and match: it sends the request (DynamoDB applies it), throws the answer
// away, runs between (another replica's writes), and only then returns a connection reset to
// the SDK, which retries the call when its options allow and otherwise hands the error to the
// store.
type loseThenDoer struct {
	inner   *awshttp.BuildableClient
	op      string // X-Amz-Target's operation
	match   string // a piece of the request body
	between func()

	mu   sync.Mutex
	lost bool
	sent int // matching requests sent
}

func (d *loseThenDoer) Do(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	matches := strings.HasSuffix(req.Header.Get("X-Amz-Target"), "."+d.op) && strings.Contains(string(body), d.match)
	d.mu.Lock()
	lose := matches && !d.lost
	if matches {
		d.sent++
	}
	if lose {
		d.lost = true
	}
	d.mu.Unlock()
	if !lose {
		return d.inner.Do(req)
	}
	resp, err := d.inner.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if d.between != nil {
		d.between()
	}
	return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}

// check fails the test unless d lost an answer: else it tested nothing.
func (d *loseThenDoer) check(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.lost {
		t.Fatalf("no %s answer containing %q was lost: the test tested nothing", d.op, d.match)
	}
}

// lossyReplica is a Store on the suite's table (with the gateway's retrying client) whose
// client loses one answer as d says.
func lossyReplica(t *testing.T, d *loseThenDoer, o dynamo.Options) *dynamo.Store {
	t.Helper()
	api, table := localTable(t)
	d.inner = awshttp.NewBuildableClient()
	client := dynamodb.New(api.Options(), func(do *dynamodb.Options) { do.HTTPClient = d })
	o.Table = table
	s := dynamo.New(client, o)
	t.Cleanup(func() { s.Close() })
	return s
}

// plainReplica is another replica on the same table, with a client that loses nothing.
func plainReplica(t *testing.T, o dynamo.Options) *dynamo.Store {
	t.Helper()
	api, table := localTable(t)
	o.Table = table
	s := dynamo.New(api, o)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestGCRAGiveBackLostAnswerThenAnotherWrite: burst 2 at 1/s. X takes one at 0 s. A's charge at
// 0 s is given back (a rejected group's refund, or a charge_on release); the give-back lands
// but its answer is lost; before the retry, another replica's charge B lands on the busy bucket.
// A bucket that never saw A holds X and B at 0 s and nothing more; a retry that applies the
// give-back a second time (recomputed from the chain after B moved it) admits a third.
func TestGCRAGiveBackLostAnswerThenAnotherWrite(t *testing.T) {
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}
	for _, path := range []string{"refund", "charge_on release"} {
		t.Run(path, func(t *testing.T) {
			gcra := bucket.Charge{Key: newKey(t), Limit: limit, MayGiveBack: path != "refund"}
			b := plainReplica(t, dynamo.Options{})
			d := &loseThenDoer{op: "UpdateItem", match: "#tat - :t", between: func() {
				if ok, _ := mustTake(t, b, t0, gcra); !ok {
					t.Errorf("B at 0 s, after A's give-back landed: rejected, want admitted")
				}
			}}
			a := lossyReplica(t, d, dynamo.Options{})
			if ok, _ := mustTake(t, b, t0, gcra); !ok {
				t.Fatalf("X at 0 s: rejected, want admitted")
			}
			switch path {
			case "refund":
				full := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
				if ok, _ := mustTake(t, a, t0, full); !ok {
					t.Fatalf("the window's only request: rejected, want admitted")
				}
				if ok, _ := mustTake(t, a, t0, gcra, full); ok {
					t.Fatalf("A's group with the used-up window: admitted, want rejected")
				}
			default:
				ok, r := mustTake(t, a, t0, gcra)
				if !ok {
					t.Fatalf("A at 0 s: rejected, want admitted")
				}
				_ = a.Release(context.Background(), t0, []bucket.Taken{{Charge: gcra, At: t0, Token: r[0].Token}})
			}
			d.check(t)
			if got := admits(t, b, t0, gcra, 3); got != 0 {
				t.Errorf("admitted at 0 s after X, B and A's give-back (burst 2): got %d more, want 0 (A given back once)", got)
			}
		})
	}
}

// TestCounterGiveBackOvertakenBySameProcess: limit 3 per window (or quota period), three
// charge_on charges admitted. Give-back #1 lands and its answer is lost; give-back #2 of the
// same process lands before the retry of #1. Two were given back: one more is admitted, not
// two (which would make four in the window).
func TestCounterGiveBackOvertakenBySameProcess(t *testing.T) {
	for _, limit := range []bucket.Limit{
		{Algorithm: bucket.FixedWindow, Count: 3, Window: time.Hour},
		{Algorithm: bucket.Quota, Count: 3, Period: bucket.Month},
	} {
		t.Run(fmt.Sprint(limit.Algorithm), func(t *testing.T) {
			c := bucket.Charge{Key: newKey(t), Limit: limit, MayGiveBack: true}
			var a *dynamo.Store
			d := &loseThenDoer{op: "UpdateItem", match: ":minus", between: func() {
				// Give-back #2, of the same process, lands first.
				if err := a.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0}}); err != nil {
					t.Errorf("give-back #2: %v", err)
				}
			}}
			a = lossyReplica(t, d, dynamo.Options{})
			if got := admits(t, a, t0, c, 3); got != 3 {
				t.Fatalf("first three: got %d admitted, want 3", got)
			}
			_ = a.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0}}) // #1
			d.check(t)
			b := plainReplica(t, dynamo.Options{})
			if got := admits(t, b, t0, c, 4); got > 2 {
				t.Errorf("admitted after two give-backs (limit 3, 3 taken): got %d, want at most 2", got)
			}
		})
	}
}

// TestLeaseGiveBackABA: a leased token bucket. A leases 5 units and gives them back; the
// give-back lands and its answer is lost; before the retry, B leases exactly 5 units from where
// A's give-back left tat, which puts tat back at the end of A's grant. A retry conditioned on
// tat being there (and since unchanged) holds again and hands B's units out a second time.
func TestLeaseGiveBackABA(t *testing.T) {
	// T = 0.5 s, a chunk of a lease spans TTL/4 = 5 units: A's 5 are one grant.
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 2, Burst: 60}
	lease := bucket.Lease{Shards: 1, TTL: 10 * time.Second}
	c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: lease}
	gate := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
	five := c
	five.Cost = 5
	breg := prometheus.NewRegistry()
	b := plainReplica(t, dynamo.Options{Now: frozen, Registerer: breg})
	dynamo.SetLeaseShift(b, 0)
	bTook := false
	// A's give-backs go newest first: the one that lands last puts tat back to 0 s.
	d := &loseThenDoer{op: "UpdateItem", match: `":to":{"N":"` + strconv.FormatInt(t0.UnixNano(), 10) + `"}`, between: func() {
		// B's group is rejected by the gate after its lease of 5 landed: its units stay in
		// B's pool, and B's lease write put tat back where A's grant ended.
		bTook = !takeAt(t, b, t0, five, gate)
	}}
	areg := prometheus.NewRegistry()
	a := lossyReplica(t, d, dynamo.Options{Now: frozen, Registerer: areg})
	dynamo.SetLeaseShift(a, 0)
	if !takeAt(t, a, t0, gate) {
		t.Fatal("the gate's only request was rejected")
	}
	if takeAt(t, a, t0, five, gate) {
		t.Fatal("A's gated group was admitted")
	}
	dynamo.Settle(a)
	closeLeases(t, a) // A's 5 go back: the give-back whose answer is lost
	d.check(t)
	if !bTook {
		t.Fatal("B's lease did not run between A's give-back and its retry")
	}
	// B spends the 5 it holds; then the bucket (leasable: 20 s of places at 0 s, 40 units)
	// has 35 left for anyone.
	got := 0
	for range 5 {
		if takeAt(t, b, t0, c) {
			got++
		}
	}
	closeLeases(t, b)
	creg := prometheus.NewRegistry()
	cs := plainReplica(t, dynamo.Options{Now: frozen, Registerer: creg})
	dynamo.SetLeaseShift(cs, 0)
	for range 60 {
		if takeAt(t, cs, t0, c) {
			got++
		}
		dynamo.Settle(cs)
	}
	closeLeases(t, cs)
	tt, tau := bucket.ShardGCRA(limit, 1, 0)
	most := int((tau - int64(lease.TTL)) / tt)
	if got > most {
		t.Errorf("admitted at 0 s after A's 5 went back and B leased 5: got %d, want at most %d (A's give-back applied once)", got, most)
	}
}

// TestGiveBackMarkersBounded: thousands of processes (Stores, each with its own ids) give back
// charge_on charges on one month-long quota item. What the item carries for the give-backs
// stays bounded (a marker per process would grow it by one attribute each, toward DynamoDB's
// 400 KB item limit), and the count stays exact: all given back, the quota admits its whole
// limit and no more.
func TestGiveBackMarkersBounded(t *testing.T) {
	const processes, workers = 2000, 16
	api, table := localTable(t)
	limit := bucket.Limit{Algorithm: bucket.Quota, Count: processes, Period: bucket.Month}
	c := bucket.Charge{Key: newKey(t), Limit: limit, MayGiveBack: true}
	all := c
	all.Cost = processes
	first := plainReplica(t, dynamo.Options{})
	if ok, _ := mustTake(t, first, t0, all); !ok {
		t.Fatalf("the whole quota in one charge: rejected, want admitted")
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range next {
				// A process of its own, giving one unit back.
				s := dynamo.New(api, dynamo.Options{Table: table})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := s.Release(ctx, t0, []bucket.Taken{{Charge: c, At: t0}}); err != nil {
					t.Errorf("a process's give-back: %v", err)
				}
				cancel()
			}
		})
	}
	for i := range processes {
		next <- i
	}
	close(next)
	wg.Wait()
	out, err := api.Scan(context.Background(), &dynamodb.ScanInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		FilterExpression:          aws.String("begins_with(pk, :k)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":k": &types.AttributeValueMemberS{Value: c.Key.String()}},
	})
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	if len(out.Items) != 1 {
		t.Fatalf("items of the quota: got %d, want 1", len(out.Items))
	}
	item := out.Items[0]
	size := 0
	for name, v := range item {
		size += len(name)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			size += len(v.Value)
		case *types.AttributeValueMemberN:
			size += len(v.Value)
		case *types.AttributeValueMemberNS:
			for _, n := range v.Value {
				size += len(n)
			}
		}
	}
	e := 0
	if v, ok := item["e"].(*types.AttributeValueMemberN); ok {
		e, _ = strconv.Atoi(v.Value)
	}
	t.Logf("after %d processes' give-backs: %d attributes, about %d bytes, epoch %d", processes, len(item), size, e)
	if len(item) > 6 || size > 2048 {
		t.Errorf("the quota item after %d processes' give-backs: %d attributes, about %d bytes; want at most 6 and 2 KB (bounded whatever the number of processes)", processes, len(item), size)
	}
	if e == 0 {
		t.Errorf("the give-back set never started a new epoch in %d give-backs: the bound was not exercised", processes)
	}
	// Every unit given back once: the whole quota fits again, and not one unit more.
	if ok, _ := mustTake(t, first, t0, all); !ok {
		t.Errorf("the whole quota after every unit was given back: rejected, want admitted")
	}
	if ok, _ := mustTake(t, first, t0, c); ok {
		t.Errorf("one more after the whole quota: admitted, want rejected (a give-back applied twice)")
	}
}

// TestCounterGiveBackLostAcrossEpochs: A's give-back lands and its answer is lost; before A
// retries, other processes' give-backs fill the item's set of ids and start a new epoch, which
// drops A's id. Whether A's give-back landed can no longer be told, so A stops (the give-back
// counted as failed) instead of sending it again: the count stays exact, given back once.
func TestCounterGiveBackLostAcrossEpochs(t *testing.T) {
	limit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: time.Hour}
	c := bucket.Charge{Key: newKey(t), Limit: limit, MayGiveBack: true}
	b := plainReplica(t, dynamo.Options{})
	const others = 70 // more than the 64 ids an epoch keeps
	d := &loseThenDoer{op: "UpdateItem", match: ":minus", between: func() {
		for range others {
			if ok, _ := mustTake(t, b, t0, c); !ok {
				t.Errorf("B's take: rejected, want admitted")
			}
			if err := b.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0}}); err != nil {
				t.Errorf("B's give-back: %v", err)
			}
		}
	}}
	reg := prometheus.NewRegistry()
	a := lossyReplica(t, d, dynamo.Options{Registerer: reg})
	if got := admits(t, a, t0, c, 10); got != 10 {
		t.Fatalf("A's ten: got %d admitted, want 10", got)
	}
	err := a.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0}})
	d.check(t)
	if err == nil {
		t.Errorf("A's give-back whose epoch ended after its answer was lost: no error, want it counted as failed")
	}
	// 10 taken by A, one given back (once): 91 left in the window.
	if got := admits(t, b, t0, c, 100); got != 91 {
		t.Errorf("admitted after A's give-back: got %d, want 91 (given back exactly once)", got)
	}
}
