package ddbrelay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

// The SDK tests run against a real DynamoDB Local, found as internal/dynamo's tests find it
// (dynamolocal.Find): DYNAMODB_ENDPOINT names a running one (make test starts it); without it a
// developer's go test starts its own and stops it at the end; under CI=true a missing endpoint
// fails the tests.

var local dynamolocal.Lazy

func TestMain(m *testing.M) {
	code := m.Run()
	local.Stop()
	os.Exit(code)
}

// relayedTable starts a relay with the given budget in front of DynamoDB Local, creates a fresh
// table through it, and returns the relay and an SDK client that talks to it with retries off
// (a retry would hide the throttle). The table's creation is not a write, so the relay's write
// counts start at zero.
func relayedTable(t *testing.T, budget int, c *clock) (*ddbrelay.Relay, *dynamodb.Client, string) {
	t.Helper()
	ddb, err := local.Get()
	if err != nil {
		dynamolocal.Unavailable(t, err)
	}
	r, err := ddbrelay.New(ddb.Endpoint, ddbrelay.Options{WritesPerItemPerSecond: budget, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	client, err := dynamolocal.NewClient(context.Background(), srv.URL, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "relay-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return r, client, table
}

func pk(s string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: s}}
}

// incr adds one to the item's counter, on condition that the counter stays below limit.
func incr(table, key string, limit int) *dynamodb.UpdateItemInput {
	return &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       pk(key),
		UpdateExpression:          aws.String("ADD #n :one"),
		ConditionExpression:       aws.String("attribute_not_exists(#n) OR #n < :limit"),
		ExpressionAttributeNames:  map[string]string{"#n": "n"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}, ":limit": &types.AttributeValueMemberN{Value: strconv.Itoa(limit)}},
	}
}

func counter(t *testing.T, c *dynamodb.Client, table, key string) string {
	t.Helper()
	out, err := c.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table), Key: pk(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatalf("GetItem %s: %v", key, err)
	}
	n, ok := out.Item["n"].(*types.AttributeValueMemberN)
	if !ok {
		return ""
	}
	return n.Value
}

func wantThrottled(t *testing.T, what string, err error) {
	t.Helper()
	var pte *types.ProvisionedThroughputExceededException
	if !errors.As(err, &pte) {
		t.Errorf("%s: got error %v (%T), want *types.ProvisionedThroughputExceededException", what, err, err)
	}
}

func TestSDKSeesThrottlingAndTheBudgetRefills(t *testing.T) {
	c := &clock{t: t0}
	r, db, table := relayedTable(t, 5, c)
	ctx := context.Background()

	// Five writes of item "hot" in the first second: four increments and one whose condition
	// fails (the counter is at 4, the limit 4). All five reach DynamoDB and use the budget.
	for i := range 4 {
		c.Set(t0.Add(time.Duration(i) * 100 * time.Millisecond))
		if _, err := db.UpdateItem(ctx, incr(table, "hot", 4)); err != nil {
			t.Fatalf("write %d: %v", i+1, err)
		}
	}
	var ccf *types.ConditionalCheckFailedException
	if _, err := db.UpdateItem(ctx, incr(table, "hot", 4)); !errors.As(err, &ccf) {
		t.Fatalf("write 5: got %v, want ConditionalCheckFailedException", err)
	}
	c.Set(t0.Add(900 * time.Millisecond))
	_, err := db.UpdateItem(ctx, incr(table, "hot", 100))
	wantThrottled(t, "UpdateItem over budget", err)
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: pk("hot")})
	wantThrottled(t, "PutItem over budget", err)
	_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: &types.Update{TableName: aws.String(table), Key: pk("cold"), UpdateExpression: aws.String("ADD #n :one"),
			ExpressionAttributeNames: map[string]string{"#n": "n"}, ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}}}},
		{Update: &types.Update{TableName: aws.String(table), Key: pk("hot"), UpdateExpression: aws.String("ADD #n :one"),
			ExpressionAttributeNames: map[string]string{"#n": "n"}, ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}}}},
	}})
	wantThrottled(t, "TransactWriteItems with an item over budget", err)

	// Reads of the hot item are never throttled; the throttled writes did not reach DynamoDB.
	for range 20 {
		if got := counter(t, db, table, "hot"); got != "4" {
			t.Fatalf("hot counter got %q, want 4 (throttled writes must not land)", got)
		}
	}
	if got := counter(t, db, table, "cold"); got != "" {
		t.Errorf("cold counter got %q, want none (its transaction was throttled whole)", got)
	}

	// The next second refills the budget: five more writes, the sixth throttled.
	c.Set(t0.Add(time.Second))
	for i := range 5 {
		if _, err := db.UpdateItem(ctx, incr(table, "hot", 100)); err != nil {
			t.Fatalf("second second, write %d: %v", i+1, err)
		}
	}
	_, err = db.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: aws.String(table), Key: pk("hot")})
	wantThrottled(t, "DeleteItem over budget", err)
	if got := counter(t, db, table, "hot"); got != "9" {
		t.Errorf("hot counter got %q, want 9", got)
	}

	st := r.Stats()
	hot, cold := ddbrelay.Item{Table: table, Key: "hot"}, ddbrelay.Item{Table: table, Key: "cold"}
	if st.Writes != (ddbrelay.Count{Forwarded: 10, Throttled: 2 + 2 + 1}) {
		t.Errorf("writes got %+v, want 10 forwarded, 5 throttled", st.Writes)
	}
	for op, want := range map[string]ddbrelay.OpStats{
		"UpdateItem":         {Requests: 11, Writes: ddbrelay.Count{Forwarded: 10, Throttled: 1}},
		"PutItem":            {Requests: 1, Writes: ddbrelay.Count{Throttled: 1}},
		"TransactWriteItems": {Requests: 1, Writes: ddbrelay.Count{Throttled: 2}},
		"DeleteItem":         {Requests: 1, Writes: ddbrelay.Count{Throttled: 1}},
		"GetItem":            {Requests: 22},
	} {
		if st.Ops[op] != want {
			t.Errorf("%s got %+v, want %+v", op, st.Ops[op], want)
		}
	}
	if len(st.Windows) != 2 {
		t.Fatalf("windows got %+v, want 2", st.Windows)
	}
	for i, want := range []map[ddbrelay.Item]ddbrelay.Count{
		{hot: {Forwarded: 5, Throttled: 3}, cold: {Throttled: 1}},
		{hot: {Forwarded: 5, Throttled: 1}},
	} {
		w := st.Windows[i]
		if !w.Start.Equal(t0.Add(time.Duration(i)*time.Second)) || len(w.Items) != len(want) {
			t.Errorf("window %d got %+v, want %v at %v", i, w, want, t0.Add(time.Duration(i)*time.Second))
		}
		for it, c := range want {
			if w.Items[it] != c {
				t.Errorf("window %d, %v: got %+v, want %+v", i, it.Key, w.Items[it], c)
			}
		}
	}
	if want := (ddbrelay.Peak{Item: hot, Start: t0, Count: ddbrelay.Count{Forwarded: 5, Throttled: 3}}); st.Hottest != want {
		t.Errorf("hottest got %+v, want %+v", st.Hottest, want)
	}
}

func TestBatchWriteThroughRelay(t *testing.T) {
	c := &clock{t: t0}
	r, db, table := relayedTable(t, 1, c)
	put := func(keys ...string) error {
		var wr []types.WriteRequest
		for _, k := range keys {
			wr = append(wr, types.WriteRequest{PutRequest: &types.PutRequest{Item: pk(k)}})
		}
		_, err := db.BatchWriteItem(context.Background(), &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{table: wr}})
		return err
	}
	if err := put("a", "b", "c"); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	wantThrottled(t, "a batch with an item over budget", put("d", "a"))
	if st := r.Stats(); st.Writes != (ddbrelay.Count{Forwarded: 3, Throttled: 2}) || st.Ops["BatchWriteItem"].Requests != 2 {
		t.Errorf("got writes %+v, BatchWriteItem %+v; want 3 forwarded, 2 throttled in 2 requests", st.Writes, st.Ops["BatchWriteItem"])
	}
}
