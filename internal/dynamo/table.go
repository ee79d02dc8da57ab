package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// TableAPI is the part of the DynamoDB client that CreateTable calls.
type TableAPI interface {
	CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	DescribeTimeToLive(ctx context.Context, in *dynamodb.DescribeTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTimeToLiveOutput, error)
	UpdateTimeToLive(ctx context.Context, in *dynamodb.UpdateTimeToLiveInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// tableActiveTimeout bounds the wait for a new table to become ACTIVE (seconds on AWS, instant
// on DynamoDB Local).
const tableActiveTimeout = 2 * time.Minute

// CreateTable creates the rate-limit table with on-demand billing, waits until it is ACTIVE and
// enables TTL on the ttl attribute. It is idempotent: an existing table is kept, and TTL is still
// made sure of. The schema is described in the package documentation.
func CreateTable(ctx context.Context, api TableAPI, table string) error {
	_, err := EnsureTable(ctx, api, table)
	return err
}

// EnsureTable is CreateTable, reporting whether this call created the table (false: it existed
// already, or a retried create of the SDK's found the one its lost first try made).
func EnsureTable(ctx context.Context, api TableAPI, table string) (created bool, err error) {
	_, err = api.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(attrPK), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(attrPK), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return false, fmt.Errorf("dynamo: create table %s: %w", table, err)
	}
	created = err == nil
	return created, ensureTTL(ctx, api, table)
}

// ensureTTL waits for the table to be ACTIVE and enables TTL on it unless it is on.
func ensureTTL(ctx context.Context, api TableAPI, table string) error {
	waiter := dynamodb.NewTableExistsWaiter(api, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 200 * time.Millisecond
		o.MaxDelay = 2 * time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, tableActiveTimeout); err != nil {
		return fmt.Errorf("dynamo: wait for table %s: %w", table, err)
	}
	if on, err := ttlEnabled(ctx, api, table); err != nil {
		return err
	} else if on {
		return nil
	}
	_, err := api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(schema.TTL),
			Enabled:       aws.Bool(true),
		},
	})
	if err != nil {
		// The SDK re-sends a call whose answer was lost; a second UpdateTimeToLive after the
		// first was applied fails ("already enabled"): what counts is that TTL is on.
		if on, cerr := ttlEnabled(ctx, api, table); cerr == nil && on {
			return nil
		}
		return fmt.Errorf("dynamo: enable TTL on %s: %w", table, err)
	}
	return nil
}

// ttlEnabled reports whether TTL is enabled (or being enabled) on the ttl attribute. Enabling it
// twice is a ValidationException without a typed error, so CreateTable asks first.
func ttlEnabled(ctx context.Context, api TableAPI, table string) (bool, error) {
	out, err := api.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
	if err != nil {
		return false, fmt.Errorf("dynamo: describe TTL of %s: %w", table, err)
	}
	desc := out.TimeToLiveDescription
	if desc == nil {
		return false, nil
	}
	st := desc.TimeToLiveStatus
	return aws.ToString(desc.AttributeName) == schema.TTL &&
		(st == types.TimeToLiveStatusEnabled || st == types.TimeToLiveStatusEnabling), nil
}
