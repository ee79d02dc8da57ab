package telemetry

import (
	"context"
	"errors"
	"sort"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// DynamoAPI is the DynamoDB client as the dynamo store calls it (dynamo.API), declared here with
// the methods TraceDynamoDB wraps.
type DynamoAPI interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// TraceDynamoDB wraps the dynamo store's client with one client span per DynamoDB call made in
// a recorded span's context (a request's store call): named DynamoDB.<operation>, with the
// operation, the table and, on failure, the error's code, never an item's key or values. The
// span's tracer comes from the parent span, so the wrapper needs no Telemetry; a call outside a
// recorded span (background lease and liveness work, unsampled requests) is passed on as is.
// A coalesced write serves several requests: its span is a child of the one whose context
// carried the batch.
func TraceDynamoDB(next DynamoAPI) DynamoAPI { return dynamoAPI{next: next} }

type dynamoAPI struct{ next DynamoAPI }

func (d dynamoAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	ctx, span := startDynamo(ctx, "UpdateItem", func() []string { return []string{aws.ToString(in.TableName)} })
	out, err := d.next.UpdateItem(ctx, in, optFns...)
	endDynamo(span, err)
	return out, err
}

func (d dynamoAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	ctx, span := startDynamo(ctx, "BatchGetItem", func() []string {
		tables := make([]string, 0, len(in.RequestItems))
		for t := range in.RequestItems {
			tables = append(tables, t)
		}
		return tables
	})
	out, err := d.next.BatchGetItem(ctx, in, optFns...)
	endDynamo(span, err)
	return out, err
}

func (d dynamoAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	ctx, span := startDynamo(ctx, "TransactWriteItems", func() []string {
		seen := map[string]bool{}
		for _, it := range in.TransactItems {
			switch {
			case it.Update != nil:
				seen[aws.ToString(it.Update.TableName)] = true
			case it.Put != nil:
				seen[aws.ToString(it.Put.TableName)] = true
			case it.Delete != nil:
				seen[aws.ToString(it.Delete.TableName)] = true
			case it.ConditionCheck != nil:
				seen[aws.ToString(it.ConditionCheck.TableName)] = true
			}
		}
		tables := make([]string, 0, len(seen))
		for t := range seen {
			tables = append(tables, t)
		}
		return tables
	})
	out, err := d.next.TransactWriteItems(ctx, in, optFns...)
	endDynamo(span, err)
	return out, err
}

// startDynamo starts operation op's span under ctx's recorded span; nil when there is none.
func startDynamo(ctx context.Context, op string, tables func() []string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	names := tables()
	sort.Strings(names)
	return parent.TracerProvider().Tracer(ScopeName).Start(ctx, "DynamoDB."+op,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("db.system.name", "aws.dynamodb"),
			attribute.String("db.operation.name", op),
			attribute.StringSlice("aws.dynamodb.table_names", names),
		))
}

// endDynamo ends span with err's code. A failed condition (ConditionalCheckFailed, a cancelled
// transaction) is how a refusal is written, not a failure of the call.
func endDynamo(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		code := "error"
		var ae smithy.APIError
		switch {
		case errors.As(err, &ae):
			code = ae.ErrorCode()
		case errors.Is(err, context.DeadlineExceeded):
			code = "timeout"
		case errors.Is(err, context.Canceled):
			code = "canceled"
		}
		span.SetAttributes(attribute.String("aws.dynamodb.error_code", code))
		if code != "ConditionalCheckFailedException" && code != "TransactionCanceledException" {
			span.SetStatus(codes.Error, code)
			span.SetAttributes(attribute.String("error.type", code))
		}
	}
	span.End()
}
