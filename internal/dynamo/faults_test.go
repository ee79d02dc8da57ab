package dynamo_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The faults of the network between a replica and DynamoDB, injected for real: faultDoer is the
// SDK's HTTP client. Every request goes to DynamoDB Local; the first `times` requests that match
// (operation and a piece of the body) suffer the fault:
//
//   - drop: the request is applied, its answer thrown away, and the client gets a connection
//     reset, so the SDK (two attempts, the gateway's retryer) re-sends it;
//   - dup: the request is sent twice (a retransmission that arrived twice); the client gets the
//     second answer.
type faultDoer struct {
	inner *awshttp.BuildableClient
	kind  string // "drop" or "dup"
	op    string // X-Amz-Target's operation: UpdateItem, TransactWriteItems
	match string // a piece of the request body
	times int

	mu   sync.Mutex
	hits int // matching requests sent (each send of a dup counts once)
}

func (d *faultDoer) Do(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	matches := strings.HasSuffix(req.Header.Get("X-Amz-Target"), "."+d.op) && strings.Contains(string(body), d.match)
	d.mu.Lock()
	fault := false
	if matches {
		d.hits++
		fault = d.hits <= d.times
	}
	d.mu.Unlock()
	if !fault {
		return d.inner.Do(req)
	}
	resp, err := d.inner.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if d.kind == "dup" {
		again := req.Clone(req.Context())
		again.Body = io.NopCloser(bytes.NewReader(body))
		return d.inner.Do(again)
	}
	return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}

func (d *faultDoer) sent() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hits
}

// faultStore is a Store on the suite's table whose client goes through d.
func faultStore(t *testing.T, d *faultDoer, mode dynamo.Mode) *dynamo.Store {
	t.Helper()
	api, table := localTable(t)
	d.inner = awshttp.NewBuildableClient()
	client := dynamodb.New(api.Options(), func(o *dynamodb.Options) { o.HTTPClient = d })
	s := dynamo.New(client, dynamo.Options{Table: table, Mode: mode})
	t.Cleanup(func() { s.Close() })
	return s
}

// admits counts how many of n charges c are admitted at now, one after another.
func admits(t *testing.T, s *dynamo.Store, now time.Time, c bucket.Charge, n int) int {
	t.Helper()
	got := 0
	for range n {
		if ok, _ := mustTake(t, s, now, c); ok {
			got++
		}
	}
	return got
}

// TestWritesSafeToResend injects, for each kind of write the store makes (outside leases), a
// lost answer after the write was applied (the SDK re-sends it) and a duplicated request, and
// checks the state against one application: never looser (over-admission), and no capacity lost
// for good (a slot counted that no one holds).
func TestWritesSafeToResend(t *testing.T) {
	gcraLimit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}
	full := func(t *testing.T, s *dynamo.Store) bucket.Charge { // a window that rejects every group
		w := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
		if ok, _ := mustTake(t, s, t0, w); !ok {
			t.Fatalf("first request of the rejecting window: rejected, want admitted")
		}
		return w
	}
	for _, kind := range []string{"drop", "dup"} {
		t.Run(kind+"/charge sent once", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "UpdateItem", match: "#tat = :next", times: 1}
			s := faultStore(t, d, dynamo.Refund)
			g := bucket.Charge{Key: newKey(t), Limit: gcraLimit}
			r := make([]bucket.Result, 1)
			ok, err := s.Take(context.Background(), t0, []bucket.Charge{g}, r)
			if kind == "drop" && (ok || err == nil) {
				t.Errorf("charge whose answer was lost: got admitted=%v err=%v, want an error", ok, err)
			}
			if kind == "drop" && d.sent() != 1 {
				t.Errorf("charge requests sent: got %d, want 1 (a charge is never re-sent)", d.sent())
			}
			// Applied once (twice for a duplicate, whose second copy fails its condition).
			if got := admits(t, s, t0, g, 3); got != 1 {
				t.Errorf("admitted after the faulted charge (burst 2): got %d, want 1", got)
			}
		})
		t.Run(kind+"/token bucket refund", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "UpdateItem", match: "#tat - :t", times: 1}
			s := faultStore(t, d, dynamo.Refund)
			g := bucket.Charge{Key: newKey(t), Limit: gcraLimit}
			if ok, _ := mustTake(t, s, t0, g, full(t, s)); ok {
				t.Fatalf("group with a used-up window: admitted, want rejected")
			}
			if kind == "drop" && d.sent() < 2 {
				t.Errorf("refund requests sent: got %d, want at least 2 (re-sent until it lands)", d.sent())
			}
			if got := admits(t, s, t0, g, 3); got != 2 {
				t.Errorf("admitted after the refund (burst 2): got %d, want 2 (given back once)", got)
			}
		})
		t.Run(kind+"/window refund", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "UpdateItem", match: "ADD #count :minus", times: 1}
			s := faultStore(t, d, dynamo.Refund)
			w := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}}
			if ok, _ := mustTake(t, s, t0, w, full(t, s)); ok {
				t.Fatalf("group with a used-up window: admitted, want rejected")
			}
			if kind == "drop" && d.sent() < 2 {
				t.Errorf("refund requests sent: got %d, want at least 2 (re-sent until it lands)", d.sent())
			}
			if got := admits(t, s, t0, w, 3); got != 2 {
				t.Errorf("admitted after the refund (count 2): got %d, want 2 (given back once)", got)
			}
		})
		t.Run(kind+"/charge_on release", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "UpdateItem", match: "ADD #count :minus", times: 1}
			s := faultStore(t, d, dynamo.Refund)
			q := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Day}, MayGiveBack: true}
			if ok, _ := mustTake(t, s, t0, q); !ok {
				t.Fatalf("first quota request: rejected, want admitted")
			}
			if err := s.Release(context.Background(), t0, []bucket.Taken{{Charge: q, At: t0}}); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if got := admits(t, s, t0, q, 2); got != 1 {
				t.Errorf("admitted after the release (quota 1): got %d, want 1 (given back once)", got)
			}
		})
		t.Run(kind+"/slot take", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "UpdateItem", match: "ADD #count :one", times: 1}
			s := faultStore(t, d, dynamo.Refund)
			c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 1}}
			r := make([]bucket.Result, 1)
			ok, err := s.Take(context.Background(), t0, []bucket.Charge{c}, r)
			if err != nil {
				t.Logf("faulted take: %v", err)
			}
			if ok {
				if err := s.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0, Token: r[0].Token}}); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			// Whatever the fault did, the slot is free again: taken once and released.
			ok, r2 := mustTake(t, s, t0, c)
			if !ok {
				t.Fatalf("take after the faulted take was released: rejected, want admitted (a slot stayed counted that no one holds)")
			}
			if ok, _ := mustTake(t, s, t0, c); ok {
				t.Errorf("second take with one slot: admitted, want rejected")
			}
			_ = s.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0, Token: r2[0].Token}})
		})
		t.Run(kind+"/slot release", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "UpdateItem", match: "REMOVE #l", times: 1}
			s := faultStore(t, d, dynamo.Refund)
			c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}}
			_, ra := mustTake(t, s, t0, c)
			if ok, _ := mustTake(t, s, t0, c); !ok {
				t.Fatalf("second slot: rejected, want admitted")
			}
			if err := s.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0, Token: ra[0].Token}}); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if got := admits(t, s, t0, c, 2); got != 1 {
				t.Errorf("takes after one of two slots was released: got %d admitted, want 1 (released once)", got)
			}
		})
		t.Run(kind+"/transaction", func(t *testing.T) {
			d := &faultDoer{kind: kind, op: "TransactWriteItems", match: "#count", times: 1}
			s := faultStore(t, d, dynamo.Transaction)
			w := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}}
			g := bucket.Charge{Key: newKey(t), Limit: gcraLimit}
			r := make([]bucket.Result, 2)
			ok, err := s.Take(context.Background(), t0, []bucket.Charge{w, g}, r)
			if err != nil {
				t.Logf("faulted transaction: %v", err)
			}
			want := 1 // what one application leaves
			if !ok {
				want = 2 // the transaction was not applied, or given back
			}
			if got := admits(t, s, t0, w, 3); got != want {
				t.Errorf("window admitted after the transaction (admitted=%v): got %d, want %d (applied at most once)", ok, got, want)
			}
		})
	}
}
