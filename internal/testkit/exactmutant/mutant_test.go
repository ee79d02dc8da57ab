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
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
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
		s := Store(memstore.New(memstore.Options{}), name)
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
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	// The give-back forms of internal/dynamo (giveback.go, lease/giveback.go), each with the
	// change and condition its re-sent copy must keep.
	for _, f := range []struct {
		name, upd, cond string
		names           map[string]string
		values          map[string]types.AttributeValue
		wantUpd         string
		wantCond        string
		wantNames       int
		wantValues      int
	}{
		{
			name: "counter", upd: "ADD #count :minus, #g :gs",
			cond:  "(#count >= :n) AND #e = :e AND (attribute_not_exists(#g) OR (size(#g) < :k AND NOT contains(#g, :gid)))",
			names: map[string]string{"#count": "count", "#g": "g", "#e": "e"},
			values: map[string]types.AttributeValue{":minus": n("-1"), ":n": n("1"), ":e": n("3"), ":k": n("64"), ":gid": n("41"),
				":gs": &types.AttributeValueMemberNS{Value: []string{"41"}}},
			wantUpd: "ADD #count :minus", wantCond: "(#count >= :n) AND #e = :e", wantNames: 2, wantValues: 3,
		},
		{
			name: "counter, new epoch", upd: "ADD #count :minus SET #g = :gs, #e = :next",
			cond:  "(#count >= :n) AND #e = :e AND size(#g) >= :k AND NOT contains(#g, :gid)",
			names: map[string]string{"#count": "count", "#g": "g", "#e": "e"},
			values: map[string]types.AttributeValue{":minus": n("-1"), ":n": n("1"), ":e": n("3"), ":k": n("64"), ":gid": n("41"),
				":gs": &types.AttributeValueMemberNS{Value: []string{"41"}}, ":next": n("4")},
			wantUpd: "ADD #count :minus", wantCond: "(#count >= :n) AND #e = :e", wantNames: 2, wantValues: 3,
		},
		{
			name: "token bucket", upd: "SET #tat = #tat - :t, #wp = :gid, #c1 = #c1 - :d",
			cond:    "#wp = :w AND #c1 >= :t",
			names:   map[string]string{"#tat": "tat", "#wp": "w2", "#c1": "c1"},
			values:  map[string]types.AttributeValue{":t": n("5"), ":w": n("7"), ":gid": n("41"), ":d": n("5")},
			wantUpd: "SET #tat = #tat - :t, #c1 = #c1 - :d", wantCond: "#c1 >= :t", wantNames: 2, wantValues: 2,
		},
		{
			name: "token bucket, nothing wrote since", upd: "SET #tat = #tat - :t, #wp = :gid",
			cond:    "#wp = :w",
			names:   map[string]string{"#tat": "tat", "#wp": "w1"},
			values:  map[string]types.AttributeValue{":t": n("5"), ":w": n("7"), ":gid": n("41")},
			wantUpd: "SET #tat = #tat - :t", wantCond: "", wantNames: 1, wantValues: 1,
		},
		{
			name: "lease", upd: "SET #tat = :to, #lv = :gid", cond: "#tat = :end AND #lv = :lv",
			names:   map[string]string{"#tat": "tat", "#lv": "lv"},
			values:  map[string]types.AttributeValue{":to": n("5"), ":end": n("9"), ":lv": n("7"), ":gid": n("41")},
			wantUpd: "SET #tat = :to", wantCond: "#tat = :end", wantNames: 1, wantValues: 2,
		},
	} {
		in := &dynamodb.UpdateItemInput{UpdateExpression: aws.String(f.upd), ConditionExpression: aws.String(f.cond),
			ExpressionAttributeNames: f.names, ExpressionAttributeValues: f.values}
		for _, name := range []string{"", ResendWithoutMarker} {
			l := &lossy{}
			_, err := Client(l, name).UpdateItem(context.Background(), in)
			if name == "" {
				if err == nil || len(l.sent) != 1 {
					t.Errorf("%s, no mutant: %d sent, error %v; want 1 and the lost answer", f.name, len(l.sent), err)
				}
				continue
			}
			if err != nil || len(l.sent) != 2 {
				t.Fatalf("%s, mutant: %d sent, error %v; want 2 and none", f.name, len(l.sent), err)
			}
			again := l.sent[1]
			cond := ""
			if again.ConditionExpression != nil {
				cond = *again.ConditionExpression
			}
			if *again.UpdateExpression != f.wantUpd || cond != f.wantCond {
				t.Errorf("%s: re-sent %q IF %q, want %q IF %q", f.name, *again.UpdateExpression, cond, f.wantUpd, f.wantCond)
			}
			if len(again.ExpressionAttributeValues) != f.wantValues || len(again.ExpressionAttributeNames) != f.wantNames {
				t.Errorf("%s: re-sent values %v, names %v; want %d and %d", f.name, again.ExpressionAttributeValues, again.ExpressionAttributeNames, f.wantValues, f.wantNames)
			}
			if _, ok := in.ExpressionAttributeValues[":gid"]; !ok || *in.UpdateExpression != f.upd {
				t.Errorf("%s: the caller's input was changed", f.name)
			}
		}
	}
}
