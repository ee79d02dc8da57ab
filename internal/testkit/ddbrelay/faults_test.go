package ddbrelay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

// faultyTable creates a fresh table on DynamoDB Local directly, starts a relay with the given
// faults in front of it, and returns the relay, an SDK client through the relay that retries up
// to attempts times (quickly, with no retry quota: the faults are the point), and a client that
// bypasses the relay to read the truth.
func faultyTable(t *testing.T, attempts int, faults ...ddbrelay.Fault) (*ddbrelay.Relay, *dynamodb.Client, *dynamodb.Client, string) {
	t.Helper()
	ddb, err := local.Get()
	if err != nil {
		dynamolocal.Unavailable(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct, err := dynamolocal.NewClient(ctx, ddb.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "faults-" + hex.EncodeToString(b[:])
	if err := dynamo.CreateTable(ctx, direct, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = direct.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	r, err := ddbrelay.New(ddb.Endpoint, ddbrelay.Options{Faults: faults, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	client, err := dynamolocal.NewClient(ctx, srv.URL, func(o *dynamodb.Options) {
		o.RetryMaxAttempts = attempts
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = attempts
			so.MaxBackoff = 20 * time.Millisecond
			so.RateLimiter = ratelimit.None
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return r, client, direct, table
}

// add is an unconditional ADD n 1: applying it twice counts twice.
func add(table, key string) *dynamodb.UpdateItemInput {
	return &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       pk(key),
		UpdateExpression:          aws.String("ADD #n :one"),
		ExpressionAttributeNames:  map[string]string{"#n": "n"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
	}
}

func count(t *testing.T, c *dynamodb.Client, table, key string) int64 {
	t.Helper()
	s := counter(t, c, table, key)
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const calls = 30

// addAll sends calls increments of key, each of which must succeed.
func addAll(t *testing.T, c *dynamodb.Client, table, key string) {
	t.Helper()
	for i := range calls {
		if _, err := c.UpdateItem(context.Background(), add(table, key)); err != nil {
			t.Fatalf("increment %d: %v", i+1, err)
		}
	}
}

func TestDropResponseAppliesTheWriteAndTheSDKRetriesIt(t *testing.T) {
	r, c, direct, table := faultyTable(t, 30, ddbrelay.Fault{Kind: ddbrelay.FaultDropResponse, Op: "UpdateItem", Rate: 0.3})
	addAll(t, c, table, "k")
	drops := r.Stats().Faults[ddbrelay.FaultDropResponse]
	if drops == 0 {
		t.Fatalf("no response dropped in %d calls at rate 0.3", calls)
	}
	// Every dropped call was applied, and the SDK sent it again: applied twice.
	if got := count(t, direct, table, "k"); got != calls+drops {
		t.Errorf("counter got %d, want %d increments + %d dropped responses = %d", got, calls, drops, calls+drops)
	}
	if st := r.Stats(); st.Ops["UpdateItem"].Writes.Forwarded != calls+drops {
		t.Errorf("forwarded got %+v, want %d", st.Ops["UpdateItem"], calls+drops)
	}
}

func TestDuplicateAppliesTwiceAndAnswersOnce(t *testing.T) {
	r, c, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultDuplicate, Op: "UpdateItem", Rate: 0.3})
	addAll(t, c, table, "k")
	dups := r.Stats().Faults[ddbrelay.FaultDuplicate]
	if dups == 0 {
		t.Fatalf("no call duplicated in %d at rate 0.3", calls)
	}
	if got := count(t, direct, table, "k"); got != calls+dups {
		t.Errorf("counter got %d, want %d increments + %d duplicates = %d", got, calls, dups, calls+dups)
	}
	// The answer is the first delivery's: ALL_NEW says the count after it, not after the copy.
	out, err := c.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: pk("one"), UpdateExpression: aws.String("ADD #n :one"), ReturnValues: types.ReturnValueAllNew,
		ExpressionAttributeNames: map[string]string{"#n": "n"}, ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Attributes["n"].(*types.AttributeValueMemberN).Value; got != "1" {
		t.Errorf("first increment of a new item answered n=%s, want 1 (the first delivery's answer)", got)
	}
}

func TestResetIsNotAppliedAndTheSDKRetries(t *testing.T) {
	r, c, direct, table := faultyTable(t, 30, ddbrelay.Fault{Kind: ddbrelay.FaultReset, Op: "UpdateItem", Rate: 0.3})
	addAll(t, c, table, "k")
	resets := r.Stats().Faults[ddbrelay.FaultReset]
	if resets == 0 {
		t.Fatalf("no connection reset in %d calls at rate 0.3", calls)
	}
	if got := count(t, direct, table, "k"); got != calls {
		t.Errorf("counter got %d, want exactly %d (a reset call never reached the server)", got, calls)
	}
	if st := r.Stats(); st.Ops["UpdateItem"].Requests != calls+resets || st.Ops["UpdateItem"].Writes.Forwarded != calls {
		t.Errorf("UpdateItem got %+v, want %d requests, %d forwarded", st.Ops["UpdateItem"], calls+resets, calls)
	}
}

func TestThrottleFaultAnswersWithoutForwarding(t *testing.T) {
	r, c, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultThrottle, Op: "UpdateItem", Item: regexp.MustCompile(`^hot$`), Rate: 1})
	_, err := c.UpdateItem(context.Background(), add(table, "hot"))
	wantThrottled(t, "UpdateItem of the hot item", err)
	addAll(t, c, table, "cold")
	if got := count(t, direct, table, "hot"); got != 0 {
		t.Errorf("hot counter got %d, want 0 (a throttled call is not forwarded)", got)
	}
	if got := count(t, direct, table, "cold"); got != calls {
		t.Errorf("cold counter got %d, want %d (the rule names only hot)", got, calls)
	}
	if got := r.Stats().Faults; got[ddbrelay.FaultThrottle] != 1 || len(got) != 1 {
		t.Errorf("faults got %v, want exactly one throttle", got)
	}
}

func TestFaultsTargetReadsByItem(t *testing.T) {
	r, c, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultThrottle, Op: "BatchGetItem", Item: regexp.MustCompile(`^hot$`), Rate: 1})
	if _, err := direct.UpdateItem(context.Background(), add(table, "hot")); err != nil {
		t.Fatal(err)
	}
	get := func(keys ...string) error {
		var ks []map[string]types.AttributeValue
		for _, k := range keys {
			ks = append(ks, pk(k))
		}
		_, err := c.BatchGetItem(context.Background(), &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{table: {Keys: ks}}})
		return err
	}
	if err := get("cold", "other"); err != nil {
		t.Errorf("a batch read naming no hot item: %v", err)
	}
	wantThrottled(t, "a batch read naming the hot item", get("cold", "hot"))
	if got := count(t, c, table, "hot"); got != 1 {
		t.Errorf("GetItem of hot got %d, want 1 (the rule names BatchGetItem only)", got)
	}
	if got := r.Stats().Faults[ddbrelay.FaultThrottle]; got != 1 {
		t.Errorf("throttles got %d, want 1", got)
	}
}

func TestDelayFaultSlowsOnlyItsCalls(t *testing.T) {
	r, c, _, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultDelay, Op: "GetItem", Rate: 1, Delay: 60 * time.Millisecond})
	start := time.Now()
	count(t, c, table, "k")
	if el := time.Since(start); el < 60*time.Millisecond {
		t.Errorf("a delayed GetItem took %v, want at least 60ms", el)
	}
	addAll(t, c, table, "k")
	st := r.Stats()
	if st.Faults[ddbrelay.FaultDelay] != 1 {
		t.Errorf("delays got %d, want 1 (only the GetItem)", st.Faults[ddbrelay.FaultDelay])
	}
	if st.OpLatency["GetItem"].Max < 60*time.Millisecond {
		t.Errorf("GetItem latency got %+v, want at least 60ms", st.OpLatency["GetItem"])
	}
}

func TestNewRejectsBadFaults(t *testing.T) {
	for _, tc := range []struct {
		f    ddbrelay.Fault
		want string
	}{
		{ddbrelay.Fault{Kind: "nope", Rate: 1}, `Faults[0].Kind "nope"`},
		{ddbrelay.Fault{Kind: ddbrelay.FaultReset, Rate: 1.5}, "Faults[0].Rate 1.5"},
		{ddbrelay.Fault{Kind: ddbrelay.FaultDelay, Rate: 1}, "Faults[0].Delay 0s"},
	} {
		_, err := ddbrelay.New("http://127.0.0.1:1", ddbrelay.Options{Faults: []ddbrelay.Fault{tc.f}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fault %+v: error %v, want one naming %s", tc.f, err, tc.want)
		}
	}
}

// TestFaultsTargetCallsByBody: a rule with Body faults only the calls whose request body matches
// (the self-test loses the answers of give-backs alone, which carry ":gid").
func TestFaultsTargetCallsByBody(t *testing.T) {
	r, c, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultThrottle, Op: "UpdateItem", Body: regexp.MustCompile(`"hot"`), Rate: 1})
	_, err := c.UpdateItem(context.Background(), add(table, "hot"))
	wantThrottled(t, "UpdateItem whose body names hot", err)
	addAll(t, c, table, "cold")
	if got := count(t, direct, table, "hot"); got != 0 {
		t.Errorf("hot counter got %d, want 0 (its body matched: throttled, not forwarded)", got)
	}
	if got := count(t, direct, table, "cold"); got != calls {
		t.Errorf("cold counter got %d, want %d (their bodies do not match)", got, calls)
	}
	if got := r.Stats().Faults; got[ddbrelay.FaultThrottle] != 1 || len(got) != 1 {
		t.Errorf("faults got %v, want exactly one throttle", got)
	}
}
