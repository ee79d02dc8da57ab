package telemetry

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/otlpsink"
)

// failingAPI fails every call with err.
type failingAPI struct{ err error }

func (f failingAPI) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return nil, f.err
}

func (f failingAPI) BatchGetItem(context.Context, *dynamodb.BatchGetItemInput, ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return nil, f.err
}

func (f failingAPI) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return nil, f.err
}

// TestDynamoDBSpans: a DynamoDB call in a recorded span gets a child span naming the operation
// and the tables; a failed condition (a refusal) is no error, a throttled call is; a call
// outside a recorded span makes none.
func TestDynamoDBSpans(t *testing.T) {
	sink := otlpsink.Start(t)
	tel := start(t, policy.OTLPConfig{Endpoint: sink.GRPCAddr, Insecure: true}, 1)
	cond := TraceDynamoDB(failingAPI{&smithy.GenericAPIError{Code: "ConditionalCheckFailedException"}})
	throttled := TraceDynamoDB(failingAPI{&smithy.GenericAPIError{Code: "ThrottlingException"}})
	ctx, parent := tel.Tracer().Start(context.Background(), "parent")
	_, _ = cond.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String("t1")})
	_, _ = throttled.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: &types.Update{TableName: aws.String("t2")}}, {ConditionCheck: &types.ConditionCheck{TableName: aws.String("t1")}}}})
	parent.End()
	_, _ = cond.BatchGetItem(context.Background(), &dynamodb.BatchGetItemInput{}) // no span: no recorded parent
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]otlpsink.Span{}
	for _, s := range sink.Spans() {
		got[s.GetName()] = s
	}
	if len(got) != 3 {
		t.Fatalf("got spans %v, want parent, DynamoDB.UpdateItem and DynamoDB.TransactWriteItems", len(got))
	}
	up, tx := got["DynamoDB.UpdateItem"], got["DynamoDB.TransactWriteItems"]
	for _, c := range []struct {
		s                    otlpsink.Span
		tables, code, errTyp string
	}{{up, "t1", "ConditionalCheckFailedException", ""}, {tx, "t1,t2", "ThrottlingException", "ThrottlingException"}} {
		if c.s.Span == nil {
			t.Fatal("a DynamoDB span is missing")
		}
		if string(c.s.GetParentSpanId()) != string(got["parent"].GetSpanId()) {
			t.Errorf("%s is not the parent's child", c.s.GetName())
		}
		if a := otlpsink.Attr(c.s.Span, "aws.dynamodb.table_names"); a != c.tables {
			t.Errorf("%s: tables %q, want %q", c.s.GetName(), a, c.tables)
		}
		if a := otlpsink.Attr(c.s.Span, "aws.dynamodb.error_code"); a != c.code {
			t.Errorf("%s: error code %q, want %q", c.s.GetName(), a, c.code)
		}
		if a := otlpsink.Attr(c.s.Span, "error.type"); a != c.errTyp {
			t.Errorf("%s: error.type %q, want %q", c.s.GetName(), a, c.errTyp)
		}
	}
}
