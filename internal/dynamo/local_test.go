package dynamo_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The tests run against a real DynamoDB Local. DYNAMODB_ENDPOINT names a running one (CI starts
// it with scripts/dynamodb-local.sh); without it, a developer's `go test` starts its own and stops
// it at the end. In CI a missing endpoint fails the tests rather than skipping them.
//
// DYNAMODB_TEST_AWS=1 runs the same suite against real DynamoDB instead: credentials and region
// come from the standard AWS chain (AWS_PROFILE, AWS_REGION, ...), DYNAMODB_ENDPOINT is optional
// (empty = the region's public endpoint), and the throwaway table is deleted at the end.

var local struct {
	once     sync.Once
	endpoint string
	stateDir string // set when this process started DynamoDB Local
	err      error  // why there is none (outside CI: skip)
	client   *dynamodb.Client
	table    string
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
	if local.stateDir != "" {
		cmd := exec.Command(script(), "stop")
		cmd.Env = append(os.Environ(), "DYNAMODB_LOCAL_STATE_DIR="+local.stateDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "dynamodb-local stop: %v\n%s", err, out)
		}
		os.RemoveAll(local.stateDir)
	}
	os.Exit(code)
}

func script() string {
	p, _ := filepath.Abs(filepath.Join("..", "..", "scripts", "dynamodb-local.sh"))
	return p
}

func startLocal() {
	local.endpoint = os.Getenv("DYNAMODB_ENDPOINT")
	if onAWS() {
		local.client, local.err = dynamo.NewClient(context.Background(), dynamo.ClientOptions{Endpoint: local.endpoint})
	} else if local.endpoint == "" {
		if os.Getenv("CI") == "true" {
			local.err = fmt.Errorf("DYNAMODB_ENDPOINT is not set in CI: start DynamoDB Local with scripts/dynamodb-local.sh start")
			return
		}
		dir, err := os.MkdirTemp("", "dynamodb-local-")
		if err != nil {
			local.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, script(), "start")
		cmd.Env = append(os.Environ(), "DYNAMODB_LOCAL_STATE_DIR="+dir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		local.stateDir = dir // stop even a half-started one
		if err != nil {
			local.err = fmt.Errorf("scripts/dynamodb-local.sh start: %w: %s", err, strings.TrimSpace(stderr.String()))
			return
		}
		local.endpoint = strings.TrimSpace(string(out))
	}
	if !onAWS() {
		local.client, local.err = newLocalClient(local.endpoint)
	}
	if local.err != nil {
		return
	}
	local.table = randomName("ratelimit-test")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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

func newLocalClient(endpoint string) (*dynamodb.Client, error) {
	return dynamo.NewClient(context.Background(), dynamo.ClientOptions{
		Region:   "ap-northeast-1",
		Endpoint: endpoint,
		ConfigOptions: []func(*config.LoadOptions) error{
			// DynamoDB Local accepts only letters and digits in the access key id.
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDLOCAL", "secret", "")),
		},
	})
}

// localTable returns a client of DynamoDB Local and the name of this run's table, or ends the
// test: Fatal in CI, Skip for a developer without Java.
func localTable(t testing.TB) (*dynamodb.Client, string) {
	t.Helper()
	local.once.Do(startLocal)
	if local.err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("DynamoDB Local: %v", local.err)
		}
		t.Skipf("DynamoDB Local unavailable: %v", local.err)
	}
	return local.client, local.table
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}
