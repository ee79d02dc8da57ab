package dynamo_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// testClock is a Store's clock that a test moves.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) now() time.Time        { return time.Unix(0, c.ns.Load()) }
func (c *testClock) add(d time.Duration)   { c.ns.Add(int64(d)) }
func newTestClock(at time.Time) *testClock { c := &testClock{}; c.ns.Store(at.UnixNano()); return c }
func exemptionJSON(id string, exp time.Time) []byte {
	return []byte(fmt.Sprintf(`{"id":%q,"expires_at":%q}`, id, exp.UTC().Format(time.RFC3339Nano)))
}

// scanAll returns every item of table.
func scanAll(t *testing.T, api *dynamodb.Client, table string) []map[string]types.AttributeValue {
	t.Helper()
	out, err := api.Scan(context.Background(), &dynamodb.ScanInput{TableName: &table, ConsistentRead: new(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Items
}

// sweepTTL does what DynamoDB's TTL sweeper may do by instant at: delete every item whose ttl
// (Unix seconds) has passed.
func sweepTTL(t *testing.T, api *dynamodb.Client, table string, at time.Time) {
	t.Helper()
	for _, item := range scanAll(t, api, table) {
		nv, ok := item["ttl"].(*types.AttributeValueMemberN)
		if !ok {
			continue
		}
		if sec, _ := strconv.ParseInt(nv.Value, 10, 64); sec < at.Unix() {
			if _, err := api.DeleteItem(context.Background(), &dynamodb.DeleteItemInput{TableName: &table,
				Key: map[string]types.AttributeValue{"pk": item["pk"]}}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func has(t *testing.T, s *dynamo.Store, id string) bool {
	t.Helper()
	all, err := s.Exemptions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all {
		if strings.Contains(string(e), `"id":"`+id+`"`) {
			return true
		}
	}
	return false
}

// An exemption lasts until its own expiry, whatever is written after it: a 30-day exemption
// followed by a 1-hour one is still there once the table's TTL sweeper has deleted everything
// due 3 hours later (on 85d8db7 both shared one item whose ttl the 1-hour one had set).
func TestAdminExemptionOutlivesALaterOne(t *testing.T) {
	api, table := adminTable(t)
	clk := newTestClock(time.Now())
	s := dynamo.New(api, dynamo.Options{Table: table, Now: clk.now})
	ctx := context.Background()
	long, short := clk.now().Add(30*24*time.Hour), clk.now().Add(time.Hour)
	for _, e := range []struct {
		id  string
		exp time.Time
	}{{"ex_long", long}, {"ex_short", short}} { // the long one first
		if ok, err := s.PutExemption(ctx, e.id, exemptionJSON(e.id, e.exp), e.exp, 10); err != nil || !ok {
			t.Fatalf("put %s: %v %v", e.id, ok, err)
		}
	}
	clk.add(3 * time.Hour) // past the 1-hour one's expiry and the store's hour of ttl margin
	sweepTTL(t, api, table, clk.now())
	if !has(t, s, "ex_long") {
		t.Fatal("the 30-day exemption is gone 3 hours after a 1-hour one was written")
	}
	if has(t, s, "ex_short") {
		t.Fatal("the 1-hour exemption is still listed 3 hours later")
	}
}

// Expired exemptions leave the shared index: 40 exemptions that expired are pruned by the next
// read, so the index does not grow with every exemption ever made (on 85d8db7 they stayed until
// the item reached DynamoDB's 400 KB limit).
func TestAdminExpiredExemptionsPruned(t *testing.T) {
	api, table := adminTable(t)
	clk := newTestClock(time.Now())
	s := dynamo.New(api, dynamo.Options{Table: table, Now: clk.now})
	ctx := context.Background()
	for i := range 40 {
		id := "ex_old" + strconv.Itoa(i)
		exp := clk.now().Add(time.Hour)
		if ok, err := s.PutExemption(ctx, id, exemptionJSON(id, exp), exp, 100); err != nil || !ok {
			t.Fatalf("put %s: %v %v", id, ok, err)
		}
	}
	exp := clk.now().Add(48 * time.Hour)
	if ok, err := s.PutExemption(ctx, "ex_live", exemptionJSON("ex_live", exp), exp, 100); err != nil || !ok {
		t.Fatal(ok, err)
	}
	clk.add(2 * time.Hour)
	if !has(t, s, "ex_live") {
		t.Fatal("the live exemption is not listed")
	}
	entries := -1
	for _, item := range scanAll(t, api, table) {
		if pk := item["pk"].(*types.AttributeValueMemberS).Value; pk == "ratelimit-proxy#exemptions" {
			entries = 0
			for _, av := range item {
				if m, ok := av.(*types.AttributeValueMemberM); ok {
					entries += len(m.Value)
				}
			}
		}
	}
	if entries != 1 {
		t.Fatalf("the shared exemptions item holds %d entries after a read, want 1 (the 40 expired pruned)", entries)
	}
}

// The number of live exemptions is bounded on the table, whichever replica writes: past the
// bound a put is refused (stored false) until one expires or is deleted; an expired one makes
// room without anyone deleting it; a delete of an id that does not exist finds nothing.
func TestAdminExemptionsBounded(t *testing.T) {
	api, table := adminTable(t)
	clk := newTestClock(time.Now())
	a := dynamo.New(api, dynamo.Options{Table: table, Now: clk.now})
	b := dynamo.New(api, dynamo.Options{Table: table, Now: clk.now})
	ctx := context.Background()
	put := func(s *dynamo.Store, id string, d time.Duration) bool {
		t.Helper()
		exp := clk.now().Add(d)
		ok, err := s.PutExemption(ctx, id, exemptionJSON(id, exp), exp, 3)
		if err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
		return ok
	}
	if !put(a, "ex_1", time.Hour) || !put(b, "ex_2", 3*time.Hour) || !put(a, "ex_3", 3*time.Hour) {
		t.Fatal("a put within the bound was refused")
	}
	if put(b, "ex_4", time.Hour) {
		t.Fatal("the 4th live exemption was stored at max 3")
	}
	if found, err := a.DeleteExemption(ctx, "ex_nope"); err != nil || found {
		t.Fatalf("delete of an unknown id: found %v (%v), want not found", found, err)
	}
	clk.add(2 * time.Hour) // ex_1 expires
	if !put(b, "ex_4", time.Hour) {
		t.Fatal("refused once one of the 3 had expired")
	}
	if found, err := a.DeleteExemption(ctx, "ex_2"); err != nil || !found {
		t.Fatalf("delete of ex_2: found %v (%v), want found", found, err)
	}
	if !put(a, "ex_5", time.Hour) || put(a, "ex_6", time.Hour) {
		t.Fatal("after a delete: want one more stored, then refused")
	}
	if _, err := a.PutExemption(ctx, "ex_big", make([]byte, dynamo.MaxExemptionData+1), clk.now().Add(time.Hour), 10); err == nil {
		t.Fatal("an exemption past MaxExemptionData was stored")
	}
}

// Replicas racing for the last places of the bound never pass it: 12 puts from 3 Stores at once
// at max 5 store exactly 5.
func TestAdminExemptionsBoundUnderRace(t *testing.T) {
	api, table := adminTable(t)
	ctx := context.Background()
	var ss []*dynamo.Store
	for range 3 {
		ss = append(ss, dynamo.New(api, dynamo.Options{Table: table}))
	}
	var stored atomic.Int64
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := "ex_race" + strconv.Itoa(i)
			exp := time.Now().Add(time.Hour)
			ok, err := ss[i%3].PutExemption(ctx, id, exemptionJSON(id, exp), exp, 5)
			if err != nil {
				t.Errorf("put %s: %v", id, err)
			}
			if ok {
				stored.Add(1)
			}
		}()
	}
	wg.Wait()
	all, err := ss[0].Exemptions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Load() != 5 || len(all) != 5 {
		t.Fatalf("12 racing puts at max 5: %d stored, %d listed, want 5 and 5", stored.Load(), len(all))
	}
}

// batchGetCounter counts the items its BatchGetItem calls ask for.
type batchGetCounter struct {
	dynamo.API
	items atomic.Int64
}

func (c *batchGetCounter) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	for _, ka := range in.RequestItems {
		c.items.Add(int64(len(ka.Keys)))
	}
	return c.API.BatchGetItem(ctx, in, optFns...)
}

// A replica reads an exemption's item once: once it has read the 20 exemptions, each of its
// reads a second asks for two items (the resets and the index), not the exemptions again.
func TestAdminExemptionsReadOnce(t *testing.T) {
	api, table := adminTable(t)
	ctx := context.Background()
	w := dynamo.New(api, dynamo.Options{Table: table})
	for i := range 20 {
		id := "ex_once" + strconv.Itoa(i)
		exp := time.Now().Add(time.Hour)
		if ok, err := w.PutExemption(ctx, id, exemptionJSON(id, exp), exp, 100); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	c := &batchGetCounter{API: api}
	r := dynamo.New(c, dynamo.Options{Table: table})
	if all, err := r.Exemptions(ctx); err != nil || len(all) != 20 {
		t.Fatalf("first read: %d exemptions (%v), want 20", len(all), err)
	}
	if got := c.items.Load(); got != 22 {
		t.Fatalf("first read asked for %d items, want 22 (resets, index, 20 exemptions)", got)
	}
	c.items.Store(0)
	if all, err := r.Exemptions(ctx); err != nil || len(all) != 20 {
		t.Fatalf("second read: %d exemptions (%v), want 20", len(all), err)
	}
	if got := c.items.Load(); got != 2 {
		t.Fatalf("second read asked for %d items, want 2 (resets and index)", got)
	}
}
