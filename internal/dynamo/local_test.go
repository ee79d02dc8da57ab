package dynamo_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

// The tests run against a real DynamoDB Local. DYNAMODB_ENDPOINT names a running one (CI starts
// it with scripts/dynamodb-local.sh); without it, a developer's `go test` starts its own and stops
// it at the end (dynamolocal.Find). In CI a missing endpoint fails the tests rather than skipping them.
//
// DYNAMODB_TEST_AWS=1 runs the same suite against real DynamoDB instead: credentials and region
// come from the standard AWS chain (AWS_PROFILE, AWS_REGION, ...), DYNAMODB_ENDPOINT is optional
// (empty = the region's public endpoint), and the throwaway table is deleted at the end.

var ddb dynamolocal.Lazy

var local struct {
	once   sync.Once
	err    error // why there is none (outside CI: skip)
	client *dynamodb.Client
	table  string
}

// onAWS reports whether the suite targets real DynamoDB rather than DynamoDB Local.
func onAWS() bool { return os.Getenv("DYNAMODB_TEST_AWS") == "1" }

func TestMain(m *testing.M) {
	code := m.Run()
	if local.client != nil && local.table != "" {
		// On AWS a table left behind accumulates; on DynamoDB Local (-inMemory) this is tidiness.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := local.client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(local.table)}); err != nil {
			fmt.Fprintf(os.Stderr, "delete test table %s: %v\n", local.table, err)
		}
		cancel()
	}
	ddb.Stop()
	os.Exit(code)
}

func startLocal() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if onAWS() {
		local.client, local.err = dynamo.NewClient(ctx, dynamo.ClientOptions{Endpoint: os.Getenv(dynamolocal.EndpointVar)})
	} else {
		var inst *dynamolocal.Instance
		if inst, local.err = ddb.Get(); local.err == nil {
			local.client, local.err = dynamolocal.NewClient(ctx, inst.Endpoint)
		}
	}
	if local.err != nil {
		return
	}
	local.table = randomName("ratelimit-test")
	local.err = createTableWithoutTTL(ctx, local.client, local.table)
}

// createTableWithoutTTL creates the tests' shared table like CreateTable but leaves TTL off.
// The tests decide at fixed instants in 2023, so every item's ttl is already past by the wall
// clock, and DynamoDB Local does delete expired items (its sweeper removed items in the middle
// of a hammer, which looked like lost updates). TestCreateTableIdempotent covers CreateTable.
func createTableWithoutTTL(ctx context.Context, api *dynamodb.Client, table string) error {
	_, err := api.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return err
	}
	return dynamodb.NewTableExistsWaiter(api, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay = 100 * time.Millisecond
	}).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, time.Minute)
}

// localTable returns a client of DynamoDB Local and the name of this run's table, or ends the
// test: Fatal in CI, Skip for a developer without Java.
func localTable(t testing.TB) (*dynamodb.Client, string) {
	t.Helper()
	local.once.Do(startLocal)
	if local.err != nil {
		dynamolocal.Unavailable(t, local.err)
	}
	return local.client, local.table
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}
