package e2e

// End-to-end tests of store.backend dynamodb: real gateway processes sharing one table on a real
// DynamoDB Local. scripts/test.sh (make test) starts DynamoDB Local and exports
// DYNAMODB_ENDPOINT; without it these tests start their own (ddb), fail under CI=true, and skip
// (reported) when none can be started.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

// ddb is the DynamoDB Local of these tests: the one DYNAMODB_ENDPOINT names (make test starts one
// for all packages), or, for a developer's `go test` of this package, one started on the first
// test that needs it and stopped by TestMain. Under CI=true a missing endpoint fails the tests.
var ddb dynamolocal.Lazy

// dynamoEndpoint returns the DynamoDB Local URL, or ends the test: Fatal in CI, Skip elsewhere
// when none could be started.
func dynamoEndpoint(t *testing.T) string {
	t.Helper()
	inst, err := ddb.Get()
	if err != nil {
		dynamolocal.Unavailable(t, err)
	}
	return inst.Endpoint
}

// awsEnv is the gateways' AWS environment: DynamoDB Local's dummy credentials, a region, and
// nothing from the machine (dynamolocal.Env).
func awsEnv() []string { return dynamolocal.Env() }

// setAWSEnv applies awsEnv to this process, for the commands that runCLI starts.
func setAWSEnv(t *testing.T) {
	t.Helper()
	for _, kv := range awsEnv() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// testClient is the test's own view of the table.
func testClient(t *testing.T, endpoint string) *dynamodb.Client {
	t.Helper()
	c, err := dynamolocal.NewClient(context.Background(), endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sharedPolicies: one policy per algorithm, told apart by path, all keyed by user.
const sharedPolicies = `identity:
  user_header: X-User-Id
policies:
  - name: tb
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 25
    match: {path_prefix: /tb/}
  - name: fw
    key: user
    algorithm: fixed_window
    limit: 25
    window: 168h
    match: {path_prefix: /fw/}
  - name: sw
    key: user
    algorithm: sliding_window
    limit: 25
    window: 1h
    match: {path_prefix: /sw/}
  - name: qm
    key: user
    algorithm: quota
    limit: 25
    period: month
    time_zone: Asia/Tokyo
    match: {path_prefix: /qm/}
  - name: qc
    key: user
    algorithm: quota
    limit: 127
    period: day
    cost: 5
    match: {path_prefix: /qc/}
`

// dynamoStore renders the store block; extra holds more store fields, indented.
func dynamoStore(table, endpoint string, createTable bool, timeout, extra string) string {
	return fmt.Sprintf(`store:
  backend: dynamodb
  timeout: %s
%s  dynamodb:
    table: %s
    endpoint: %s
    create_table: %v
`, timeout, extra, table, endpoint, createTable)
}

func TestDynamoThreeReplicasAdmitExactlyTheLimit(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-" + randomSuffix()
	up := newUpstream(t, nil)
	// A generous timeout and on_error deny: under -race and 60 concurrent requests DynamoDB Local
	// can be slow, and a store error must show as a 503 (which the test counts) rather than as
	// a silently admitted request.
	cfg := dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + sharedPolicies
	var gws []*gateway
	for range 3 {
		gws = append(gws, startGateway(t, up.URL, cfg, awsEnv()...))
	}
	user := "user-e2e-" + randomSuffix()

	// /qm/ is a monthly quota of 25 in Tokyo, /qc/ a daily quota of 127 in which each request
	// costs 5: 25 fit in both.
	for _, path := range []string{"/tb/", "/fw/", "/sw/", "/qm/", "/qc/"} {
		t.Run(strings.Trim(path, "/"), func(t *testing.T) {
			if path == "/qm/" || path == "/qc/" {
				// A run that straddles a period's end splits the requests across two periods.
				now := time.Now().UTC()
				if next := now.Truncate(24 * time.Hour).Add(24 * time.Hour); next.Sub(now) < time.Minute {
					t.Skipf("quota: %s is in the last minute of a UTC day; rerun after it", now.Format(time.TimeOnly))
				}
				tokyo := now.In(time.FixedZone("JST", 9*3600))
				if y, m, _ := tokyo.Date(); time.Date(y, m+1, 1, 0, 0, 0, 0, tokyo.Location()).Sub(tokyo) < time.Minute {
					t.Skipf("quota: %s is in the last minute of a month in Tokyo; rerun after it", now.Format(time.TimeOnly))
				}
			}
			if path == "/fw/" {
				// Windows are aligned to the epoch: a run that straddles a boundary splits the
				// requests across two windows. A week-long window puts the boundary at one minute
				// a week (Thursday 00:00 UTC), so this reported skip is rare.
				const week = 168 * time.Hour
				now := time.Now()
				if untilBoundary := week - time.Duration(now.UnixNano()%int64(week)); untilBoundary < time.Minute {
					t.Skipf("fixed window: %s is in the last minute before a window boundary; rerun after it", now.Format(time.TimeOnly))
				}
			}
			before := up.hits.Load()
			const goroutinesPerGateway, perGoroutine = 20, 3
			var (
				mu     sync.Mutex
				status = map[int]int{}
				wg     sync.WaitGroup
			)
			for g := range 3 * goroutinesPerGateway {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perGoroutine {
						gw := gws[(g+i)%len(gws)] // round robin across the replicas
						code := statusOf(gw.proxy+path+"x", user)
						mu.Lock()
						status[code]++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			total := 3 * goroutinesPerGateway * perGoroutine
			if status[http.StatusOK] != 25 || status[http.StatusTooManyRequests] != total-25 {
				t.Errorf("statuses got %v, want exactly 25 x 200 and %d x 429", status, total-25)
			}
			if got := up.hits.Load() - before; got != 25 {
				t.Errorf("upstream hits got %d, want 25 (= admitted)", got)
			}
		})
	}

	// The table holds digests, never the user id.
	items := scanTable(t, testClient(t, endpoint), table)
	if len(items) == 0 {
		t.Fatal("the table is empty after the hammer")
	}
	pkRe := regexp.MustCompile(`^[0-9a-f]{32}#(g|w[0-9]+|s[0-9]+|q[0-9]+)$`)
	// The store's own markers (docs/dynamodb.md, "Each write and why sending it twice is safe"):
	// a GCRA item's chain of its last writes (w1..w8 random ids, c1..c8 tat-now before each); a
	// counter's give-back ids g and their epoch e; a leased bucket's last write marker lv.
	markerRe := regexp.MustCompile(`^[wc][1-8]$`)
	for _, item := range items {
		for name, v := range item {
			var text string
			switch v := v.(type) {
			case *types.AttributeValueMemberS:
				text = v.Value
			case *types.AttributeValueMemberN:
				text = v.Value
			case *types.AttributeValueMemberBOOL:
				text = strconv.FormatBool(v.Value)
			case *types.AttributeValueMemberNS:
				text = strings.Join(v.Value, ",")
				if name != "g" {
					t.Errorf("attribute %s is a number set; only g (give-backs applied) is", name)
				}
			default:
				t.Errorf("attribute %s has type %T, want S, N, BOOL or NS", name, v)
			}
			if strings.Contains(text, user) || strings.Contains(text, "user-e2e") {
				t.Errorf("attribute %s holds the raw user id: %q", name, text)
			}
			switch name {
			case "pk":
				if !pkRe.MatchString(text) {
					t.Errorf("pk %q does not match %s", text, pkRe)
				}
			case "tat", "count", "sealed", "ttl", "g", "e", "lv":
			default:
				if markerRe.MatchString(name) {
					if _, err := strconv.ParseInt(text, 10, 64); err != nil {
						t.Errorf("marker %s = %q, want a number", name, text)
					}
					continue
				}
				t.Errorf("unexpected attribute %s = %q", name, text)
			}
		}
		if _, ok := item["ttl"]; !ok {
			t.Errorf("item %v has no ttl", item["pk"])
		}
	}
}

// statusOf sends one request as user and returns the status, or -1 when there was no response.
func statusOf(url, user string) int {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return -1
	}
	req.Header.Set("X-User-Id", user)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	resp.Body.Close()
	return resp.StatusCode
}

func scanTable(t *testing.T, c *dynamodb.Client, table string) []map[string]types.AttributeValue {
	t.Helper()
	var items []map[string]types.AttributeValue
	p := dynamodb.NewScanPaginator(c, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		items = append(items, page.Items...)
	}
	return items
}

const outagePolicy = `identity:
  user_header: X-User-Id
policies:
  - name: per-user
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 6
`

func TestDynamoOutage(t *testing.T) {
	// Outage tests need no DynamoDB; they follow the same rule so that the dynamo suite runs
	// (or is reported skipped) as one.
	dynamoEndpoint(t)
	dead := "http://" + freePort(t) // nothing listens there
	up := newUpstream(t, nil)
	outage := func(t *testing.T, extra string) *gateway {
		t.Helper()
		return startGateway(t, up.URL, dynamoStore("never-created", dead, false, "1s", extra)+outagePolicy, awsEnv()...)
	}

	t.Run("allow", func(t *testing.T) {
		g := outage(t, "  on_error: allow\n")
		for i := range 3 {
			start := time.Now()
			resp, body := get(t, g.proxy+"/", "X-User-Id", "u1")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: got %d %q, want 200 (fail open)", i, resp.StatusCode, body)
			}
			if d := time.Since(start); d > 900*time.Millisecond {
				t.Errorf("request %d took %v, want an answer before store.timeout (1s)", i, d)
			}
		}
		if got := metric(t, g.admin, `ratelimit_store_errors_total{backend="dynamodb",reason="error"}`); got < 1 {
			t.Errorf("store errors got %v, want > 0", got)
		}
		if got := metric(t, g.admin, `ratelimit_store_healthy`); got != 0 {
			t.Errorf("ratelimit_store_healthy got %v, want 0", got)
		}
		if got := metric(t, g.admin, `ratelimit_store_circuit_open_total`); got < 1 {
			t.Errorf("circuit_open_total got %v, want > 0: the open circuit must skip the store", got)
		}
		// The dynamo store's own metrics are served beside the proxy's.
		if got := metric(t, g.admin, `ratelimit_dynamodb_errors_total{op="update"}`); got < 1 {
			t.Errorf("ratelimit_dynamodb_errors_total{op=update} got %v, want > 0", got)
		}
		if resp, _ := get(t, g.admin+"/readyz"); resp.StatusCode != http.StatusOK {
			t.Errorf("/readyz with on_error allow got %d, want 200", resp.StatusCode)
		}
	})

	t.Run("deny", func(t *testing.T) {
		g := outage(t, "  on_error: deny\n")
		before := up.hits.Load()
		resp, _ := get(t, g.proxy+"/", "X-User-Id", "u1")
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("got %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if got := up.hits.Load() - before; got != 0 {
			t.Errorf("upstream hits got %d, want 0: a denied request reached it", got)
		}
		resp, body := get(t, g.admin+"/readyz")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("/readyz with on_error deny and the store down got %d %q, want 503", resp.StatusCode, body)
		}
	})

	t.Run("local", func(t *testing.T) {
		g := outage(t, "  on_error: local\n  replicas: 3\n")
		var got []int
		for range 4 {
			resp, _ := get(t, g.proxy+"/", "X-User-Id", "u-local")
			got = append(got, resp.StatusCode)
		}
		want := []int{200, 200, 429, 429} // burst 6 / 3 replicas
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("statuses got %v, want %v", got, want)
		}
		if v := metric(t, g.admin, `ratelimit_store_fallback_decisions_total{reason="error"}`) +
			metric(t, g.admin, `ratelimit_store_fallback_decisions_total{reason="open"}`); v != 4 {
			t.Errorf("fallback decisions got %v, want 4", v)
		}
		if resp, _ := get(t, g.admin+"/readyz"); resp.StatusCode != http.StatusOK {
			t.Errorf("/readyz with on_error local got %d, want 200", resp.StatusCode)
		}
	})
}

func TestDynamoTableCreateCommand(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	setAWSEnv(t) // for runCLI's processes
	table := "e2e-cli-" + randomSuffix()
	up := newUpstream(t, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	body := config("127.0.0.1:0", "127.0.0.1:0", up.URL, dynamoStore(table, endpoint, false, "5s", "")+outagePolicy)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "table", "create", "--config", path)
	if code != 0 || !strings.Contains(out, table) || !strings.Contains(out, ": created:") {
		t.Fatalf("table create: exit %d, stdout %q, stderr %q; want 0 naming the table and saying it created it", code, out, errs)
	}
	c := testClient(t, endpoint)
	ttl, err := c.DescribeTimeToLive(context.Background(), &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatal(err)
	}
	if d := ttl.TimeToLiveDescription; d == nil || aws.ToString(d.AttributeName) != "ttl" || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled {
		t.Errorf("TTL got %+v, want enabled on ttl", d)
	}
	// Idempotent, and says the table was there.
	if code, out, errs := runCLI(t, "table", "create", "--config", path); code != 0 || !strings.Contains(out, "existed already") || strings.Contains(out, "created:") {
		t.Errorf("second table create: exit %d, stdout %q, stderr %q; want 0 saying it existed already", code, out, errs)
	}

	// A gateway without create_table uses it.
	g := startGateway(t, up.URL, dynamoStore(table, endpoint, false, "5s", "  on_error: deny\n")+outagePolicy, awsEnv()...)
	resp, _ := get(t, g.proxy+"/", "X-User-Id", "u-cli")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "5" {
		t.Errorf("got %d Remaining %q, want 200 and 5", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	if n := len(scanTable(t, c, table)); n != 1 {
		t.Errorf("table items got %d, want 1 (the user's bucket)", n)
	}

	// A memory-backed config has no table to create.
	mem := filepath.Join(dir, "memory.yaml")
	if err := os.WriteFile(mem, []byte(config("127.0.0.1:0", "127.0.0.1:0", up.URL, ipPolicy)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "table", "create", "--config", mem); code == 0 || !strings.Contains(errs, "store.backend") {
		t.Errorf("table create with backend memory: exit %d, stderr %q; want non-zero naming store.backend", code, errs)
	}

	// serve with create_table against a dead endpoint exits non-zero, saying why.
	dead := filepath.Join(dir, "dead.yaml")
	if err := os.WriteFile(dead, []byte(config("127.0.0.1:0", "127.0.0.1:0", up.URL,
		dynamoStore(table, "http://"+freePort(t), true, "5s", "")+outagePolicy)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "serve", "--config", dead); code == 0 || !strings.Contains(errs, "create_table") {
		t.Errorf("serve with create_table and no DynamoDB: exit %d, stderr %q; want non-zero naming create_table", code, errs)
	}
}
