package simddb_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simddb"
)

var ddb dynamolocal.Lazy

func TestMain(m *testing.M) {
	code := m.Run()
	ddb.Stop()
	os.Exit(code)
}

// The differential test's size: SIMDDB_DIFF_OPS operations (default 2,000) in runs of 250
// from seeds 1, 2, ...; SIMDDB_DIFF_OUT names a JSON file that receives the counts (make sim
// puts them in its report).
const (
	opsVar     = "SIMDDB_DIFF_OPS"
	outVar     = "SIMDDB_DIFF_OUT"
	defaultOps = 2000
	runLength  = 250
)

// TestDifferentialAgainstDynamoDBLocal sends the same random operation sequences to DynamoDB
// Local and to a DB and compares every answer, and the items of every key after every third.
func TestDifferentialAgainstDynamoDBLocal(t *testing.T) {
	inst, err := ddb.Get()
	if err != nil {
		dynamolocal.Unavailable(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client, err := dynamolocal.NewClient(ctx, inst.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	total := defaultOps
	if v := os.Getenv(opsVar); v != "" {
		if total, err = strconv.Atoi(v); err != nil || total < 1 {
			t.Fatalf("%s=%q: want a positive number of operations", opsVar, v)
		}
	}
	// Runs of runLength operations, each on its own table, four at a time (DynamoDB Local
	// answers concurrent calls; one run's calls are sequential).
	runs := (total + runLength - 1) / runLength
	var mu sync.Mutex
	ops, mismatches := 0, 0
	kinds := map[string]int{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for seed := uint64(1); seed <= uint64(runs); seed++ {
		n := min(runLength, total-int(seed-1)*runLength)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			done, bad, k := diffRun(ctx, t, client, seed, n)
			mu.Lock()
			defer mu.Unlock()
			ops, mismatches = ops+done, mismatches+bad
			for kind, c := range k {
				kinds[kind] += c
			}
		})
	}
	wg.Wait()
	t.Logf("answers: %v", kinds)
	t.Logf("%d operations, %d mismatches", ops, mismatches)
	if out := os.Getenv(outVar); out != "" {
		data, _ := json.Marshal(map[string]int{"operations": ops, "mismatches": mismatches})
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// diffRun sends n operations from seed to DynamoDB Local and to a DB; it stops at the first
// mismatch (the states differ from there on).
func diffRun(ctx context.Context, t *testing.T, client *dynamodb.Client, seed uint64, n int) (ops, mismatches int, kinds map[string]int) {
	table := newTable(ctx, t, client)
	defer func() { _, _ = client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)}) }()
	db := simddb.New()
	gen := &simddb.Gen{R: mrand.New(mrand.NewPCG(seed, 34)), Table: table, Keys: 4}
	kinds = map[string]int{}
	var history []string
	for i := range n {
		op := gen.Next()
		ops++
		history = append(history, op.Desc)
		want, got := op.Run(ctx, client), op.Run(ctx, db)
		kinds[strings.Fields(want)[0]]++
		if want == got && i%3 != 2 && i != n-1 {
			continue // the items are compared after every third operation
		}
		if want == got {
			want, got = gen.State(ctx, client), gen.State(ctx, db)
			if want == got {
				continue
			}
		}
		t.Errorf("seed %d op %d: %s\nDynamoDB Local: %s\nsimddb:         %s\nhistory of the run:\n%s", seed, i, op.Desc, want, got, tail(history, 12))
		return ops, 1, kinds
	}
	return ops, 0, kinds
}

func tail(h []string, n int) string {
	s := ""
	for _, l := range h[max(0, len(h)-n):] {
		s += "  " + l + "\n"
	}
	return s
}

func newTable(ctx context.Context, t *testing.T, client *dynamodb.Client) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "simddb-diff-" + hex.EncodeToString(b[:])
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatal(fmt.Errorf("create table: %w", err))
	}
	return table
}
