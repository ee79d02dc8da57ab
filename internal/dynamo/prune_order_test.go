package dynamo

import (
	"context"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// captureAPI records the update expressions it is sent.
type captureAPI struct{ exprs []string }

func (c *captureAPI) UpdateItem(_ context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	e := *in.UpdateExpression + " if " + *in.ConditionExpression
	for k := range 8 {
		e += " " + in.ExpressionAttributeNames["#k"+strconv.Itoa(k)]
	}
	c.exprs = append(c.exprs, e)
	return &dynamodb.UpdateItemOutput{}, nil
}

func (c *captureAPI) BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return &dynamodb.BatchGetItemOutput{}, nil
}

func (c *captureAPI) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return &dynamodb.TransactWriteItemsOutput{}, nil
}

// TestPruneRequestIsStable: a prune of the same entries sends the same request every time (the
// entries in name order, not Go's map order), so that the simulator's replay of a seed sends
// the same bytes.
func TestPruneRequestIsStable(t *testing.T) {
	api := &captureAPI{}
	s := New(api, Options{Table: "t"})
	read := map[string]types.AttributeValue{}
	for i := range 8 {
		read["x"+strconv.Itoa(i)] = &types.AttributeValueMemberN{Value: strconv.Itoa(i)}
	}
	for range 20 {
		if err := s.removeMapEntries(context.Background(), "pk", "m", read); err != nil {
			t.Fatal(err)
		}
	}
	for i, e := range api.exprs {
		if e != api.exprs[0] {
			t.Fatalf("prune %d sent %q, the first %q", i, e, api.exprs[0])
		}
	}
	if want := "REMOVE #m.#k0, #m.#k1, #m.#k2, #m.#k3, #m.#k4, #m.#k5, #m.#k6, #m.#k7 if #m.#k0 = :v0 AND #m.#k1 = :v1 AND #m.#k2 = :v2 AND #m.#k3 = :v3 AND #m.#k4 = :v4 AND #m.#k5 = :v5 AND #m.#k6 = :v6 AND #m.#k7 = :v7 x0 x1 x2 x3 x4 x5 x6 x7"; api.exprs[0] != want {
		t.Fatalf("prune sent %q, want %q", api.exprs[0], want)
	}
}
