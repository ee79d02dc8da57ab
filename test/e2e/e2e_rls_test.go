package e2e

// End-to-end tests of Envoy's rate limit service: the real binary serving RLS alone (no
// upstream), called with a gRPC client built from Envoy's published stubs
// (github.com/envoyproxy/go-control-plane/envoy), on the memory store and on DynamoDB Local
// (started by these tests when DYNAMODB_ENDPOINT is unset). The sequences are those
// envoyproxy/ratelimit's own integration tests assert.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rlsRules is the domain the sequences run against, in envoyproxy/ratelimit's format.
const rlsRules = `domain: e2e
descriptors:
  - key: per_minute
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: per_hour
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: parent
    value: p
    descriptors:
      - key: child
        rate_limit:
          unit: minute
          requests_per_unit: 2
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: base
    rate_limit:
      name: base
      unit: minute
      requests_per_unit: 1
  - key: replacer
    rate_limit:
      unit: minute
      requests_per_unit: 3
      replaces:
        - name: base
  - key: vip
    rate_limit:
      unlimited: true
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: exact
    rate_limit:
      unit: hour
      requests_per_unit: 20
`

// rlsGateway is a gateway serving RLS alone.
type rlsGateway struct {
	*serveProc
	admin      string // http://host:port
	addr       string // the RLS port, host:port
	configPath string
	rulesDir   string
	client     pb.RateLimitServiceClient
	conn       *grpc.ClientConn
}

// startRLSGateway starts `serve` with admin_listen, store (storeBlock, or memory when empty) and
// rls: the RLS-only configuration. files are the rules folder's files. rulesDir, when not "",
// is a folder to share with other gateways.
func startRLSGateway(t *testing.T, files map[string]string, storeBlock, rulesDir string, env ...string) *rlsGateway {
	t.Helper()
	dir := t.TempDir()
	if rulesDir == "" {
		rulesDir = filepath.Join(dir, "rules")
		if err := os.Mkdir(rulesDir, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(rulesDir, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	var g *rlsGateway
	for attempt := 1; ; attempt++ { // new ports when one was taken before the gateway bound it
		ports := gatewayPorts(t, 2)
		g = &rlsGateway{admin: "http://" + ports[0], addr: ports[1], configPath: filepath.Join(dir, "config.yaml"),
			rulesDir: rulesDir}
		cfg := fmt.Sprintf("admin_listen: %s\nrls:\n  listen: %s\n  config_dir: %s\n  response_headers: all\n%s", ports[0], ports[1], rulesDir, storeBlock)
		if err := os.WriteFile(g.configPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		g.serveProc = startServe(t, []string{"serve", "--config", g.configPath}, env, nil)
		err := g.ready(g.admin, 30*time.Second)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("attempt %d: %v; starting again on new ports", attempt, errPortTaken)
	}
	conn, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	g.conn, g.client = conn, pb.NewRateLimitServiceClient(conn)
	return g
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlext.RateLimitDescriptor {
	d := &rlext.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlext.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (g *rlsGateway) call(t *testing.T, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := g.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		t.Fatalf("got %d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

// ask calls with descriptors in domain e2e and hits_addend 0 (Envoy's default: one hit).
func (g *rlsGateway) ask(t *testing.T, ds ...*rlext.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	return g.call(t, &pb.RateLimitRequest{Domain: "e2e", Descriptors: ds})
}

// wantStatus checks one descriptor status: its code and remaining (-1: not checked).
func wantStatus(t *testing.T, what string, st *pb.RateLimitResponse_DescriptorStatus, code pb.RateLimitResponse_Code, remaining int64) {
	t.Helper()
	if st.GetCode() != code {
		t.Errorf("%s: got code %v, want %v", what, st.GetCode(), code)
	}
	if remaining >= 0 && int64(st.GetLimitRemaining()) != remaining {
		t.Errorf("%s: got limit_remaining %d, want %d", what, st.GetLimitRemaining(), remaining)
	}
}

// header is the value of header name in resp, whose names Envoy (like HTTP) compares without case.
func header(resp *pb.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

// minuteMargin is how much of the minute a sequence on minute windows must have left: each
// takes well under a second on memory and a few on a loaded DynamoDB Local.
const minuteMargin = 8 * time.Second

// rlsSequences runs envoyproxy/ratelimit's integration sequences against g. Values are
// unique per run (v), so gateways sharing a table do not share buckets by accident.
func rlsSequences(t *testing.T, g *rlsGateway, v string) {
	waitOutHourEdge(t, hourEdgeMargin)

	t.Run("N per minute", func(t *testing.T) {
		waitOutMinuteEdge(t, minuteMargin)
		for i := range 5 {
			resp := g.ask(t, desc("per_minute", "n"+v))
			st := resp.Statuses[0]
			wantStatus(t, fmt.Sprintf("call %d", i+1), st, pb.RateLimitResponse_OK, int64(4-i))
			if resp.GetOverallCode() != pb.RateLimitResponse_OK {
				t.Errorf("call %d: overall %v, want OK", i+1, resp.GetOverallCode())
			}
			if cl := st.GetCurrentLimit(); cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
				t.Errorf("call %d: current_limit %v, want 5 per MINUTE", i+1, cl)
			}
		}
		resp := g.ask(t, desc("per_minute", "n"+v))
		st := resp.Statuses[0]
		wantStatus(t, "call 6", st, pb.RateLimitResponse_OVER_LIMIT, 0)
		if resp.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT {
			t.Errorf("call 6: overall %v, want OVER_LIMIT", resp.GetOverallCode())
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("call 6: duration_until_reset %v, want within (0, 1m]", d)
		}
		if got := header(resp, "RateLimit"); !strings.HasPrefix(got, `"e2e.per_minute";r=0;t=`) {
			t.Errorf("RateLimit header %q, want the rule with r=0", got)
		}
		if got := header(resp, "RateLimit-Policy"); got != `"e2e.per_minute";q=5;w=60` {
			t.Errorf("RateLimit-Policy header %q", got)
		}
		if got := header(resp, "X-RateLimit-Remaining"); got != "0" {
			t.Errorf("X-RateLimit-Remaining %q, want 0", got)
		}
	})

	t.Run("two descriptors, the one over consumes nothing of the other", func(t *testing.T) {
		waitOutHourEdge(t, hourEdgeMargin)
		waitOutMinuteEdge(t, minuteMargin)
		for i := range 3 {
			resp := g.ask(t, desc("per_minute", "t"+v), desc("per_hour", "t"+v))
			wantStatus(t, fmt.Sprintf("call %d per_minute", i+1), resp.Statuses[0], pb.RateLimitResponse_OK, int64(4-i))
			wantStatus(t, fmt.Sprintf("call %d per_hour", i+1), resp.Statuses[1], pb.RateLimitResponse_OK, int64(2-i))
		}
		resp := g.ask(t, desc("per_minute", "t"+v), desc("per_hour", "t"+v))
		if resp.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT {
			t.Errorf("call 4: overall %v, want OVER_LIMIT", resp.GetOverallCode())
		}
		// per_minute conforms, but nothing is taken from it: 2 left before and after.
		wantStatus(t, "call 4 per_minute", resp.Statuses[0], pb.RateLimitResponse_OK, 2)
		wantStatus(t, "call 4 per_hour", resp.Statuses[1], pb.RateLimitResponse_OVER_LIMIT, 0)
		resp = g.ask(t, desc("per_minute", "t"+v))
		wantStatus(t, "per_minute alone", resp.Statuses[0], pb.RateLimitResponse_OK, 1)
	})

	t.Run("nested descriptors", func(t *testing.T) {
		waitOutMinuteEdge(t, minuteMargin)
		for i := range 2 {
			resp := g.ask(t, desc("parent", "p", "child", "c"+v))
			wantStatus(t, fmt.Sprintf("call %d", i+1), resp.Statuses[0], pb.RateLimitResponse_OK, int64(1-i))
		}
		resp := g.ask(t, desc("parent", "p", "child", "c"+v))
		wantStatus(t, "call 3", resp.Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 0)
		// Another parent value has no rule; nor has the parent alone.
		for _, d := range []*rlext.RateLimitDescriptor{desc("parent", "q", "child", "c"+v), desc("parent", "p")} {
			resp := g.ask(t, d)
			wantStatus(t, "no rule", resp.Statuses[0], pb.RateLimitResponse_OK, 0)
			if resp.Statuses[0].GetCurrentLimit() != nil {
				t.Errorf("%v: current_limit %v, want none", d, resp.Statuses[0].GetCurrentLimit())
			}
		}
	})

	t.Run("wildcards", func(t *testing.T) {
		waitOutMinuteEdge(t, minuteMargin)
		wantStatus(t, "foo1 first", g.ask(t, desc("wild", "foo1"+v)).Statuses[0], pb.RateLimitResponse_OK, 0)
		wantStatus(t, "foo1 second", g.ask(t, desc("wild", "foo1"+v)).Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 0)
		wantStatus(t, "foo2 has its own bucket", g.ask(t, desc("wild", "foo2"+v)).Statuses[0], pb.RateLimitResponse_OK, 0)
		resp := g.ask(t, desc("wild", "bar"+v))
		if resp.Statuses[0].GetCurrentLimit() != nil {
			t.Errorf("bar: current_limit %v, want none", resp.Statuses[0].GetCurrentLimit())
		}
	})

	t.Run("replaces", func(t *testing.T) {
		waitOutMinuteEdge(t, minuteMargin)
		for i := range 3 {
			resp := g.ask(t, desc("base", "r"+v), desc("replacer", "r"+v))
			if resp.Statuses[0].GetCurrentLimit() != nil {
				t.Errorf("call %d: the replaced rule answered %v", i+1, resp.Statuses[0])
			}
			wantStatus(t, fmt.Sprintf("call %d replacer", i+1), resp.Statuses[1], pb.RateLimitResponse_OK, int64(2-i))
		}
		resp := g.ask(t, desc("base", "r"+v), desc("replacer", "r"+v))
		wantStatus(t, "call 4 replacer", resp.Statuses[1], pb.RateLimitResponse_OVER_LIMIT, 0)
		// The replaced rule's bucket was never touched.
		wantStatus(t, "base alone", g.ask(t, desc("base", "r"+v)).Statuses[0], pb.RateLimitResponse_OK, 0)
		wantStatus(t, "base alone again", g.ask(t, desc("base", "r"+v)).Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 0)
	})

	t.Run("unlimited", func(t *testing.T) {
		for range 20 {
			resp := g.ask(t, desc("vip", "u"+v))
			wantStatus(t, "vip", resp.Statuses[0], pb.RateLimitResponse_OK, math.MaxUint32)
		}
	})

	t.Run("shadow_mode", func(t *testing.T) {
		waitOutMinuteEdge(t, minuteMargin)
		wantStatus(t, "first", g.ask(t, desc("shadow", "s"+v)).Statuses[0], pb.RateLimitResponse_OK, 0)
		resp := g.ask(t, desc("shadow", "s"+v))
		wantStatus(t, "second (over, in shadow)", resp.Statuses[0], pb.RateLimitResponse_OK, 0)
		if resp.GetOverallCode() != pb.RateLimitResponse_OK {
			t.Errorf("overall %v, want OK", resp.GetOverallCode())
		}
	})

	t.Run("hits_addend", func(t *testing.T) {
		waitOutMinuteEdge(t, minuteMargin)
		d := func() *rlext.RateLimitDescriptor { return desc("per_minute", "h"+v) }
		withHits := func(h uint64) *rlext.RateLimitDescriptor {
			x := d()
			x.HitsAddend = wrapperspb.UInt64(h)
			return x
		}
		resp := g.call(t, &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{d()}, HitsAddend: 3})
		wantStatus(t, "request hits 3", resp.Statuses[0], pb.RateLimitResponse_OK, 2)
		// A descriptor's hits_addend replaces the request's, 0 included: a check.
		resp = g.call(t, &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{withHits(0)}, HitsAddend: 4})
		wantStatus(t, "check", resp.Statuses[0], pb.RateLimitResponse_OK, 2)
		wantStatus(t, "check again: it consumed nothing", g.ask(t, withHits(0)).Statuses[0], pb.RateLimitResponse_OK, 2)
		wantStatus(t, "descriptor hits 2", g.ask(t, withHits(2)).Statuses[0], pb.RateLimitResponse_OK, 0)
		wantStatus(t, "check when spent", g.ask(t, withHits(0)).Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 0)
		// A descriptor of hits 1 under a request of hits 10 on a fresh bucket takes 1.
		x := desc("per_minute", "h2"+v)
		x.HitsAddend = wrapperspb.UInt64(1)
		resp = g.call(t, &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{x}, HitsAddend: 10})
		wantStatus(t, "descriptor hits 1 under request hits 10", resp.Statuses[0], pb.RateLimitResponse_OK, 4)
		// More than the limit holds never conforms, and consumes nothing.
		resp = g.call(t, &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{desc("per_minute", "h2"+v)}, HitsAddend: 9})
		wantStatus(t, "hits 9 of 5", resp.Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 4)
	})

	t.Run("limit override", func(t *testing.T) {
		waitOutHourEdge(t, hourEdgeMargin)
		o := func() *rlext.RateLimitDescriptor {
			x := desc("per_minute", "o"+v)
			x.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
			return x
		}
		for i := range 2 {
			resp := g.ask(t, o())
			wantStatus(t, fmt.Sprintf("call %d", i+1), resp.Statuses[0], pb.RateLimitResponse_OK, int64(1-i))
			if cl := resp.Statuses[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != pb.RateLimitResponse_RateLimit_HOUR {
				t.Errorf("current_limit %v, want 2 per HOUR", cl)
			}
		}
		wantStatus(t, "call 3", g.ask(t, o()).Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 0)
	})

	t.Run("unknown domain", func(t *testing.T) {
		resp := g.call(t, &pb.RateLimitRequest{Domain: "nowhere", Descriptors: []*rlext.RateLimitDescriptor{desc("per_minute", "x")}})
		if resp.GetOverallCode() != pb.RateLimitResponse_OK || resp.Statuses[0].GetCurrentLimit() != nil {
			t.Errorf("got %v, want OK without a limit", resp)
		}
	})

	t.Run("malformed calls", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, req := range []*pb.RateLimitRequest{
			{Descriptors: []*rlext.RateLimitDescriptor{desc("a", "b")}},
			{Domain: "e2e"},
		} {
			_, err := g.client.ShouldRateLimit(ctx, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%v: got %v, want InvalidArgument", req, err)
			}
		}
	})

	t.Run("health", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			resp, err := healthpb.NewHealthClient(g.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health %q: got %v, %v; want SERVING", svc, resp, err)
			}
		}
	})

	t.Run("metrics per rule, never per value", func(t *testing.T) {
		if got := metric(t, g.admin, `ratelimit_requests_total{policy="e2e.per_minute",result="limited"}`); got < 1 {
			t.Errorf("limited per_minute: got %v, want at least 1", got)
		}
		if got := metric(t, g.admin, `ratelimit_requests_total{policy="e2e.shadow",result="shadow_limited"}`); got != 1 {
			t.Errorf("shadow_limited: got %v, want 1", got)
		}
		if got := metric(t, g.admin, `ratelimit_rls_calls_total{domain="",result="unmatched"}`); got != 1 {
			t.Errorf("unknown-domain calls: got %v, want 1", got)
		}
		_, body := get(t, g.admin+"/metrics")
		if strings.Contains(body, "n"+v) || strings.Contains(g.logs.String(), "n"+v) {
			t.Error("a descriptor value reached /metrics or the logs")
		}
	})
}

func TestRLSMemory(t *testing.T) {
	t.Parallel()
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, "", "")
	rlsSequences(t, g, randomSuffix())
	rlsReload(t, g)
}

func TestRLSDynamoDB(t *testing.T) {
	t.Parallel()
	endpoint := dynamoEndpoint(t)
	table := "rls-" + randomSuffix()
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, dynamoStore(table, endpoint, true, "2s", ""), "", awsEnv()...)
	rlsSequences(t, g, randomSuffix())
	rlsReload(t, g)
}

// rlsReload: a new rule in the folder is served after a reload; a bad file then keeps the last
// good rules and counts an error.
func rlsReload(t *testing.T, g *rlsGateway) {
	t.Run("reload", func(t *testing.T) {
		waitOutHourEdge(t, hourEdgeMargin)
		v := randomSuffix()
		added := rlsRules + "  - key: added\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n"
		if err := os.WriteFile(filepath.Join(g.rulesDir, "e2e.yaml"), []byte(added), 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the added rule", func() bool {
			return g.ask(t, desc("added", "probe"+v)).Statuses[0].GetCurrentLimit() != nil
		})
		errorsBefore := metric(t, g.admin, `ratelimit_config_reloads_total{result="error"}`)
		if err := os.WriteFile(filepath.Join(g.rulesDir, "broken.yaml"), []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the reload error counted", func() bool {
			return metric(t, g.admin, `ratelimit_config_reloads_total{result="error"}`) > errorsBefore
		})
		if !strings.Contains(g.logs.String(), `broken.yaml: descriptors[0].rate_limit.unit: \"fortnight\"`) {
			t.Errorf("the reload error does not name the file and field:\n%s", g.logs.String())
		}
		// The last good rules stay.
		wantStatus(t, "added, first", g.ask(t, desc("added", v)).Statuses[0], pb.RateLimitResponse_OK, 0)
		wantStatus(t, "added, second", g.ask(t, desc("added", v)).Statuses[0], pb.RateLimitResponse_OVER_LIMIT, 0)
	})
}

// TestRLSDynamoDBReplicasShareExactly: three gateways on one table, calls spread over all of
// them at once; a rule of 20 per hour admits exactly 20.
func TestRLSDynamoDBReplicasShareExactly(t *testing.T) {
	t.Parallel()
	endpoint := dynamoEndpoint(t)
	table := "rls-" + randomSuffix()
	first := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n"), "", awsEnv()...)
	gws := []*rlsGateway{first}
	for range 2 {
		gws = append(gws, startRLSGateway(t, nil, dynamoStore(table, endpoint, false, "5s", "  on_error: deny\n"), first.rulesDir, awsEnv()...))
	}
	waitOutHourEdge(t, hourEdgeMargin)
	v := randomSuffix()
	var ok, over, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := gws[w%len(gws)]
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := g.client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{desc("exact", v)}})
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
				case resp.GetOverallCode() == pb.RateLimitResponse_OK:
					ok.Add(1)
				default:
					over.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 20 || failed.Load() != 0 {
		t.Errorf("got %d OK, %d OVER_LIMIT, %d failed of 60; want exactly 20 OK and none failed", ok.Load(), over.Load(), failed.Load())
	}
}

// TestRLSValidateCommand: `validate` on an RLS-only configuration reads the rules folder, says
// what it found, and names the file and field of a rule field it does not serve.
func TestRLSValidateCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules")
	if err := os.Mkdir(rules, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rules, "e2e.yaml"), []byte(rlsRules), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("admin_listen: 127.0.0.1:9090\nstore:\n  backend: memory\nrls:\n  listen: 127.0.0.1:8081\n  config_dir: "+rules+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "validate", "--config", cfg)
	if code != 0 || !strings.Contains(out, "rls: 9 rules in domain e2e from 1 file of") {
		t.Fatalf("validate: exit %d\n%s%s", code, out, errs)
	}
	bad := filepath.Join(rules, "quota.yaml")
	if err := os.WriteFile(bad, []byte("domain: q\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI(t, "validate", "--config", cfg)
	if want := bad + ":4:17: descriptors[0].quota_mode: not supported"; code == 0 || !strings.Contains(errs, want) {
		t.Errorf("validate with quota_mode: exit %d, want an error naming %q\n%s%s", code, want, out, errs)
	}
}

// TestRLSShutdownSaysNotServing: after SIGTERM, during server.shutdown_delay, the gRPC health
// service says NOT_SERVING (so Envoy's health checks move calls away) while calls are still
// answered; then the process exits cleanly.
func TestRLSShutdownSaysNotServing(t *testing.T) {
	t.Parallel()
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, "store:\n  backend: memory\nserver:\n  shutdown_delay: 3s\n", "")
	h := healthpb.NewHealthClient(g.conn)
	check := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	if got := check(); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before SIGTERM: %v, want SERVING", got)
	}
	if err := g.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NOT_SERVING", func() bool { return check() == healthpb.HealthCheckResponse_NOT_SERVING })
	if resp := g.ask(t, desc("per_hour", "shutdown-"+randomSuffix())); resp.GetOverallCode() != pb.RateLimitResponse_OK {
		t.Errorf("a call during the shutdown delay: %v, want OK", resp)
	}
	select {
	case <-g.exited:
		if g.exitErr != nil {
			t.Errorf("exit: %v", g.exitErr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not stopped 20s after SIGTERM")
	}
}
