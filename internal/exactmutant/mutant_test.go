//go:build exactmutant

package exactmutant

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamolocal"
)

var local dynamolocal.Lazy

func TestMain(m *testing.M) {
	code := m.Run()
	local.Stop()
	os.Exit(code)
}

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func fw(key byte, limit int64) bucket.Charge {
	return bucket.Charge{Key: bucket.Key{key}, Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: limit, Window: time.Hour}}
}

// admits takes charges n times at t0 and counts the admitted groups.
func admits(t *testing.T, s bucket.Store, n int, charges ...bucket.Charge) int {
	t.Helper()
	got := 0
	for range n {
		res := make([]bucket.Result, len(charges))
		ok, err := s.Take(context.Background(), t0, charges, res)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got++
		}
	}
	return got
}

func TestAdmitEverythingAdmitsPastEveryLimit(t *testing.T) {
	for _, name := range []string{"", AdmitEverything} {
		s := Store(bucket.NewMemory(bucket.MemoryOptions{}), name)
		got := admits(t, s, 5, fw(1, 2))
		want := map[string]int{"": 2, AdmitEverything: 5}[name]
		if got != want {
			t.Errorf("mutant %q: %d of 5 admitted by a limit of 2, want %d", name, got, want)
		}
	}
}

func dynamoStore(t *testing.T, name string) bucket.Store {
	t.Helper()
	ddb, err := local.Get()
	if err != nil {
		dynamolocal.Unavailable(t, err)
	}
	ctx := context.Background()
	client, err := dynamolocal.NewClient(ctx, ddb.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := "mutant-" + hex.EncodeToString(b[:])
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	s := dynamo.New(Client(client, name), dynamo.Options{Table: table, Mode: dynamo.Refund, Now: func() time.Time { return t0 }})
	t.Cleanup(func() { _ = s.Close() })
	return Store(s, name)
}

// TestGiveBackTwiceOverAdmits: a group rejected by its second policy gives the first one's
// charge back; the mutant gives it back again, and the first policy admits once more than its
// limit. The real store is the control.
func TestGiveBackTwiceOverAdmits(t *testing.T) {
	for _, name := range []string{"", GiveBackTwice} {
		s := dynamoStore(t, name)
		if got := admits(t, s, 1, fw(1, 2), fw(2, 1)); got != 1 {
			t.Fatalf("mutant %q: first group admitted %d, want 1", name, got)
		}
		// Policy 2 is full: this group charges policy 1 and gives it back.
		if got := admits(t, s, 1, fw(1, 2), fw(2, 1)); got != 0 {
			t.Fatalf("mutant %q: second group admitted %d, want 0", name, got)
		}
		got := admits(t, s, 3, fw(1, 2))
		want := map[string]int{"": 1, GiveBackTwice: 2}[name]
		if got != want {
			t.Errorf("mutant %q: policy 1 alone admitted %d more, want %d (limit 2, one spent)", name, got, want)
		}
	}
}

// lossy answers the first UpdateItem as a lost answer (after applying it) and records every
// input it was sent.
type lossy struct {
	dynamo.API
	sent []*dynamodb.UpdateItemInput
}

func (l *lossy) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	l.sent = append(l.sent, in)
	if len(l.sent) == 1 {
		return nil, errors.New("read: connection reset by peer")
	}
	return &dynamodb.UpdateItemOutput{}, nil
}

func TestResendWithoutMarkerStripsTheMarker(t *testing.T) {
	in := &dynamodb.UpdateItemInput{
		UpdateExpression:         aws.String("ADD #count :minus SET #b = :seq"),
		ConditionExpression:      aws.String("(#count >= :n) AND (attribute_not_exists(#b) OR #b < :seq)"),
		ExpressionAttributeNames: map[string]string{"#count": "count", "#b": "b1"},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":minus": &types.AttributeValueMemberN{Value: "-1"},
			":n":     &types.AttributeValueMemberN{Value: "1"},
			":seq":   &types.AttributeValueMemberN{Value: "41"},
		},
	}
	for _, name := range []string{"", ResendWithoutMarker} {
		l := &lossy{}
		_, err := Client(l, name).UpdateItem(context.Background(), in)
		if name == "" {
			if err == nil || len(l.sent) != 1 {
				t.Errorf("no mutant: %d sent, error %v; want 1 and the lost answer", len(l.sent), err)
			}
			continue
		}
		if err != nil || len(l.sent) != 2 {
			t.Fatalf("mutant: %d sent, error %v; want 2 and none", len(l.sent), err)
		}
		again := l.sent[1]
		if got := *again.UpdateExpression + " IF " + *again.ConditionExpression; got != "ADD #count :minus IF (#count >= :n)" {
			t.Errorf("re-sent %q, want the change without its marker", got)
		}
		if _, ok := again.ExpressionAttributeValues[":seq"]; ok || len(again.ExpressionAttributeValues) != 2 || len(again.ExpressionAttributeNames) != 1 {
			t.Errorf("re-sent values %v, names %v; want :minus, :n and #count", again.ExpressionAttributeValues, again.ExpressionAttributeNames)
		}
		if _, ok := in.ExpressionAttributeValues[":seq"]; !ok || *in.UpdateExpression != "ADD #count :minus SET #b = :seq" {
			t.Error("the caller's input was changed")
		}
	}
}
