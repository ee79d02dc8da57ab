package exactmutant

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// console is what the console needs of the store (internal/console's Keys and Shared), but
// PutExemption, whose form changed with the bound on exemptions (put).
type console interface {
	bucket.Releaser
	Reset(ctx context.Context, now time.Time, c bucket.Charge) error
	Exemptions(ctx context.Context) ([][]byte, error)
}

// put stores an exemption through whichever form of PutExemption s has.
func put(t *testing.T, s console, id string, data []byte, expires time.Time) {
	t.Helper()
	var err error
	switch p := s.(type) {
	case interface {
		PutExemption(context.Context, string, []byte, time.Time) error
	}:
		err = p.PutExemption(context.Background(), id, data, expires)
	case interface {
		PutExemption(context.Context, string, []byte, time.Time, int) (bool, error)
	}:
		var stored bool
		if stored, err = p.PutExemption(context.Background(), id, data, expires, 10); err == nil && !stored {
			t.Fatal("PutExemption: not stored")
		}
	default:
		t.Fatalf("%T has no PutExemption", s)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestResetLeavesSlotsOverAdmits: limit 2, two slots held at a reset, two more taken after it;
// the two held before release. The real store's reset removed their slots, so their release
// gives nothing and the key stays full; the mutant's left them, and their release lets two more
// in: four at once.
func TestResetLeavesSlotsOverAdmits(t *testing.T) {
	cc := bucket.Charge{Key: bucket.Key{7}, Cost: 1, Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}}
	ctx := context.Background()
	for _, name := range []string{"", ResetLeavesSlots} {
		s := dynamoStore(t, name).(console)
		take := func() (bool, bucket.Taken) {
			res := make([]bucket.Result, 1)
			ok, err := s.Take(ctx, t0, []bucket.Charge{cc}, res)
			if err != nil {
				t.Fatal(err)
			}
			return ok, bucket.Taken{Charge: cc, At: t0, Token: res[0].Token}
		}
		var before []bucket.Taken
		for range 2 {
			ok, tk := take()
			if !ok {
				t.Fatalf("mutant %q: a take below the limit was refused", name)
			}
			before = append(before, tk)
		}
		if err := s.Reset(ctx, t0, cc); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if ok, _ := take(); !ok {
				t.Fatalf("mutant %q: a take after the reset was refused", name)
			}
		}
		if err := s.Release(ctx, t0, before); err != nil {
			t.Fatal(err)
		}
		more := 0
		for range 2 {
			if ok, _ := take(); ok {
				more++
			}
		}
		if want := map[string]int{"": 0, ResetLeavesSlots: 2}[name]; more != want {
			t.Errorf("mutant %q: %d more admitted with 2 in flight at limit 2, want %d", name, more, want)
		}
	}
}

// recorder records the UpdateItem inputs it is sent.
type recorder struct {
	dynamo.API
	sent []*dynamodb.UpdateItemInput
}

func (r *recorder) UpdateItem(_ context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	r.sent = append(r.sent, in)
	return &dynamodb.UpdateItemOutput{}, nil
}

// TestResetUnconditionalDropsTheCondition: a concurrency item's reset conditioned on what it
// read goes out without its condition (and without the values only the condition used); a
// slot's release, and a reset of another kind of item, go out as they were.
func TestResetUnconditionalDropsTheCondition(t *testing.T) {
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	key := func(pk string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}}
	}
	reset := &dynamodb.UpdateItemInput{Key: key("ab#c"), UpdateExpression: aws.String("REMOVE #count, #l0, #l1"),
		ConditionExpression:       aws.String("#count = :n AND attribute_exists(#l0)"),
		ExpressionAttributeNames:  map[string]string{"#count": "count", "#l0": "l1f", "#l1": "l2e"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": n("2")}}
	release := &dynamodb.UpdateItemInput{Key: key("ab#c"), UpdateExpression: aws.String("ADD #count :minus REMOVE #l"),
		ConditionExpression: aws.String("attribute_exists(#l)"), ExpressionAttributeNames: map[string]string{"#count": "count", "#l": "l1f"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":minus": n("-1")}}
	// The reset since issue 32 item 1: each write takes its own slots' units off the count
	// while they all exist. A reap is the same change conditioned on the slots' expiries.
	conditioned := &dynamodb.UpdateItemInput{Key: key("ab#c"), UpdateExpression: aws.String("ADD #count :minus REMOVE #l0, #l1"),
		ConditionExpression:       aws.String("attribute_exists(#l0) AND attribute_exists(#l1)"),
		ExpressionAttributeNames:  map[string]string{"#count": "count", "#l0": "l1f", "#l1": "l2e"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":minus": n("-2")}}
	reap := &dynamodb.UpdateItemInput{Key: key("ab#c"), UpdateExpression: aws.String("ADD #count :minus REMOVE #l0"),
		ConditionExpression: aws.String("#l0 = :e0"), ExpressionAttributeNames: map[string]string{"#count": "count", "#l0": "l1f"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":minus": n("-1"), ":e0": n("5")}}
	window := &dynamodb.UpdateItemInput{Key: key("ab#w5"), UpdateExpression: aws.String("SET #count = :zero"),
		ConditionExpression: aws.String("#count = :n"), ExpressionAttributeNames: map[string]string{"#count": "count"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":zero": n("0"), ":n": n("4")}}
	for _, name := range []string{ResetUnconditional, ResetLeavesSlots} {
		rec := &recorder{}
		c := Client(rec, name)
		for _, in := range []*dynamodb.UpdateItemInput{reset, release, window, conditioned, reap} {
			if _, err := c.UpdateItem(context.Background(), in); err != nil {
				t.Fatal(err)
			}
		}
		got := rec.sent[0]
		switch name {
		case ResetUnconditional:
			if got.ConditionExpression != nil || len(got.ExpressionAttributeValues) != 0 || *got.UpdateExpression != *reset.UpdateExpression {
				t.Errorf("%s: reset sent as %q if %v with %v; want %q, no condition, no values", name, *got.UpdateExpression, got.ConditionExpression, got.ExpressionAttributeValues, *reset.UpdateExpression)
			}
		case ResetLeavesSlots:
			if *got.UpdateExpression != "REMOVE #count" || aws.ToString(got.ConditionExpression) != "#count = :n" || len(got.ExpressionAttributeNames) != 1 {
				t.Errorf("%s: reset sent as %q if %q with names %v; want REMOVE #count if #count = :n", name, *got.UpdateExpression, aws.ToString(got.ConditionExpression), got.ExpressionAttributeNames)
			}
		}
		got = rec.sent[3]
		switch name {
		case ResetUnconditional:
			if got.ConditionExpression != nil || *got.UpdateExpression != *conditioned.UpdateExpression || len(got.ExpressionAttributeValues) != 1 {
				t.Errorf("%s: conditioned reset sent as %q if %v with %v; want it without its condition", name, *got.UpdateExpression, got.ConditionExpression, got.ExpressionAttributeValues)
			}
		case ResetLeavesSlots:
			if *got.UpdateExpression != "ADD #count :minus" || got.ConditionExpression != nil || len(got.ExpressionAttributeNames) != 1 {
				t.Errorf("%s: conditioned reset sent as %q if %v with names %v; want ADD #count :minus, no condition", name, *got.UpdateExpression, got.ConditionExpression, got.ExpressionAttributeNames)
			}
		}
		if rec.sent[1] != release || rec.sent[2] != window || rec.sent[4] != reap {
			t.Errorf("%s: a release, a window's reset or a reap was rewritten: %+v, %+v, %+v", name, rec.sent[1], rec.sent[2], rec.sent[4])
		}
	}
}

// TestExemptionOutlivesItsExpiry: an exemption stored through the mutant reads back expiring an
// hour after the expiry it was given; through the real client, at it. The expiry is an hour from
// the wall clock, not from t0: DynamoDB Local's TTL sweep runs on the wall clock and deletes an
// exemption item whose expiry has passed (t0 is in the past), which made this test flaky.
func TestExemptionOutlivesItsExpiry(t *testing.T) {
	expires := time.Now().UTC().Add(time.Hour).Truncate(time.Second)
	data, _ := json.Marshal(map[string]any{"id": "ex_1", "policy": "fx", "expires_at": expires, "bucket_key": "ab"})
	for _, name := range []string{"", ExemptionOutlivesExpiry} {
		s := dynamoStore(t, name).(console)
		put(t, s, "ex_1", data, expires)
		raw, err := s.Exemptions(context.Background())
		if err != nil || len(raw) != 1 {
			t.Fatalf("mutant %q: exemptions got %d (%v), want 1", name, len(raw), err)
		}
		var e struct {
			ExpiresAt time.Time `json:"expires_at"`
			Policy    string
		}
		if err := json.Unmarshal(raw[0], &e); err != nil {
			t.Fatal(err)
		}
		want := map[string]time.Time{"": expires, ExemptionOutlivesExpiry: expires.Add(outlivedBy)}[name]
		if !e.ExpiresAt.Equal(want) || e.Policy != "fx" {
			t.Errorf("mutant %q: read back %s expiring %v, want fx at %v", name, strings.TrimSpace(string(raw[0])), e.ExpiresAt, want)
		}
	}
}
