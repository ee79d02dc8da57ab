package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/otlpsink"
)

// The trace context each client sends: a trace id and a parent span id apiece.
const (
	traceUntrusted    = "0af7651916cd43dd8448eb211c80319c"
	traceTrusted      = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceLimited      = "5ce929d0e0e47364bf92f3577b34da6a"
	traceRLSTrusted   = "6a3ce929d0e0e4736bf92f3577b34da6"
	traceRLSUntrusted = "7b34da6a3ce929d0e0e47364bf92f357"
	parentSpanID      = "00f067aa0ba902b7"
)

func traceparentOf(trace string) string { return "00-" + trace + "-" + parentSpanID + "-01" }

// fromAddr is an HTTP client whose connections come from source address src (any 127/8
// address is the loopback's): the gateway trusts 127.0.0.2 alone.
func fromAddr(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// TestTelemetryOTLP runs the gateway with telemetry on, exporting to an OTLP receiver that
// speaks the collector's gRPC protocol, and checks what arrives: a span per request with the
// decision (policy, algorithm, outcome, retry-after, the key's pseudonym), a store span under
// each, a span per RLS call, trace context followed from the trusted peer only, the upstream
// called with the request span's traceparent, the /metrics series over OTLP, and no raw key,
// token, client address or untrusted trace id anywhere in the exported data.
func TestTelemetryOTLP(t *testing.T) {
	waitOutHourEdge(t, time.Minute) // the rls rule counts per hour
	sink := otlpsink.Start(t)
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "edge.yaml"), []byte(consoleRules), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	upstreamSaw := map[string]string{} // X-Req -> traceparent
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamSaw[r.Header.Get("X-Req")] = r.Header.Get("Traceparent") + " " + r.Header.Get("Tracestate")
		mu.Unlock()
	})
	rlsAddr := freePort(t)
	g := startGateway(t, up.URL, fmt.Sprintf(`trusted_proxies: ["127.0.0.2"]
log:
  pseudonym_secret_env: PSEUDO_SECRET
telemetry:
  otlp: {endpoint: "%s", insecure: true}
  metrics: {otlp: true, interval: 1s}
rls:
  listen: %s
  config_dir: %s
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 100/s, burst: 100}
  - {name: per-key, key: api_key, algorithm: token_bucket, rate: 1/h, burst: 2}
`, sink.GRPCAddr, rlsAddr, rules), "PSEUDO_SECRET="+adminPseudoKey, "OTEL_BSP_SCHEDULE_DELAY=50")
	ps := policy.NewPseudonyms([]byte(adminPseudoKey))
	apiKey := adminKeyPrefix + "otel"
	const token = "Bearer tok-never-exported-0123456789"

	send := func(n int, src, trace string, want int) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, g.proxy+"/orders", nil)
		req.Header.Set("X-Api-Key", apiKey)
		req.Header.Set("Authorization", token)
		req.Header.Set("X-Req", strconv.Itoa(n))
		req.Header.Set("Traceparent", traceparentOf(trace))
		who := "untrusted"
		if src == "127.0.0.2" {
			who = "trusted"
		}
		req.Header.Set("Tracestate", "vendor=from-"+who)
		resp, err := fromAddr(src).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d from %s: %d, want %d", n, src, resp.StatusCode, want)
		}
	}
	send(1, "127.0.0.1", traceUntrusted, http.StatusOK)
	send(2, "127.0.0.2", traceTrusted, http.StatusOK)
	send(3, "127.0.0.2", traceLimited, http.StatusTooManyRequests)

	rlsKey := adminKeyPrefix + "rls"
	askRLS := func(src, trace string, want pb.RateLimitResponse_Code) {
		t.Helper()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparentOf(trace))
		resp, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlext.RateLimitDescriptor{desc("api_key", rlsKey)}, HitsAddend: 3})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != want {
			t.Fatalf("rls call from %s: %v, want %v", src, resp.GetOverallCode(), want)
		}
	}
	askRLS("127.0.0.2", traceRLSTrusted, pb.RateLimitResponse_OK)
	askRLS("127.0.0.1", traceRLSUntrusted, pb.RateLimitResponse_OVER_LIMIT)

	const rlsSpan = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	count := func(spans []otlpsink.Span, name string) int {
		n := 0
		for _, s := range spans {
			if s.GetName() == name {
				n++
			}
		}
		return n
	}
	if !sink.Wait(20*time.Second, func(s []otlpsink.Span) bool {
		return count(s, "GET") >= 3 && count(s, rlsSpan) >= 2 && count(s, "ratelimit.store.take") >= 5
	}) {
		t.Fatalf("spans received: %d (%d exports), want 3 requests, 2 rls calls, 5 store calls", len(sink.Spans()), sink.Exports())
	}
	spans := sink.Spans()
	byReq := map[string]otlpsink.Span{} // a request's or rls call's span by the trace it should be in
	var roots []otlpsink.Span           // the spans that started a trace of their own
	for _, s := range spans {
		if s.GetName() != "GET" && s.GetName() != rlsSpan {
			continue
		}
		if len(s.GetParentSpanId()) == 0 {
			roots = append(roots, s)
			continue
		}
		if got := hex.EncodeToString(s.GetParentSpanId()); got != parentSpanID {
			t.Errorf("span %s has parent %s, want the trusted client's %s", s.GetName(), got, parentSpanID)
		}
		byReq[hex.EncodeToString(s.GetTraceId())] = s
	}
	if len(roots) != 2 || len(byReq) != 3 {
		t.Fatalf("got %d new traces and %d joined, want 2 (the untrusted peer's request and rls call) and 3", len(roots), len(byReq))
	}
	for _, r := range roots {
		byReq[map[string]string{"GET": traceUntrusted, rlsSpan: traceRLSUntrusted}[r.GetName()]] = r
	}
	for _, trace := range []string{traceUntrusted, traceRLSUntrusted} {
		raw, _ := hex.DecodeString(trace)
		if sink.Contains(raw) {
			t.Errorf("the untrusted peer's trace id %s was exported", trace)
		}
	}
	if sink.Contains([]byte("from-untrusted")) {
		t.Error("the untrusted peer's tracestate was exported")
	}

	// The upstream got the request span's own context, and the trusted client's trace state.
	for n, c := range map[string]struct{ trace, state string }{"1": {traceUntrusted, " "}, "2": {traceTrusted, " vendor=from-trusted"}} {
		s := byReq[c.trace]
		want := "00-" + hex.EncodeToString(s.GetTraceId()) + "-" + hex.EncodeToString(s.GetSpanId()) + "-01" + c.state
		mu.Lock()
		got := upstreamSaw[n]
		mu.Unlock()
		if got != want {
			t.Errorf("request %s: upstream saw trace context %q, want the request span's %q", n, got, want)
		}
	}

	keyPseudonym := ps.Of("api_key", apiKey)
	for _, c := range []struct {
		trace string
		want  map[string]string
	}{
		{traceUntrusted, map[string]string{"ratelimit.decision": "allowed", "ratelimit.policy": "per-key", "ratelimit.algorithm": "token_bucket",
			"ratelimit.key": keyPseudonym, "ratelimit.remaining": "1", "ratelimit.policies": "per-ip,per-key", "http.response.status_code": "200",
			"http.request.method": "GET", "ratelimit.retry_after": ""}},
		{traceTrusted, map[string]string{"ratelimit.decision": "allowed", "ratelimit.key": keyPseudonym, "ratelimit.remaining": "0"}},
		{traceLimited, map[string]string{"ratelimit.decision": "limited", "ratelimit.policy": "per-key", "ratelimit.algorithm": "token_bucket",
			"ratelimit.key": keyPseudonym, "http.response.status_code": "429", "ratelimit.limit": "2"}},
		{traceRLSTrusted, map[string]string{"ratelimit.decision": "allowed", "ratelimit.domain": "edge", "ratelimit.policy": consoleRule,
			"ratelimit.algorithm": "fixed_window", "ratelimit.key": ps.Of("rls:edge", "api_key="+rlsKey+"\x00"), "ratelimit.remaining": "0",
			"rpc.response.status_code": "OK"}},
		{traceRLSUntrusted, map[string]string{"ratelimit.decision": "limited", "ratelimit.policy": consoleRule,
			"ratelimit.key": ps.Of("rls:edge", "api_key="+rlsKey+"\x00")}},
	} {
		s := byReq[c.trace]
		for k, v := range c.want {
			if got := otlpsink.Attr(s.Span, k); got != v {
				t.Errorf("span %s of trace %s: %s = %q, want %q", s.GetName(), c.trace, k, got, v)
			}
		}
	}
	for _, trace := range []string{traceLimited, traceRLSUntrusted} {
		if ra, _ := strconv.Atoi(otlpsink.Attr(byReq[trace].Span, "ratelimit.retry_after")); ra < 1 {
			t.Errorf("refusal of trace %s: retry_after %d, want at least 1", trace, ra)
		}
	}

	// Every request and rls call has its store call as a child.
	for trace, s := range byReq {
		found := false
		for _, c := range spans {
			if c.GetName() == "ratelimit.store.take" && string(c.GetParentSpanId()) == string(s.GetSpanId()) &&
				string(c.GetTraceId()) == string(s.GetTraceId()) {
				found = otlpsink.Attr(c.Span, "ratelimit.store") == "memory"
			}
		}
		if !found {
			t.Errorf("span %s of trace %s has no store span under it", s.GetName(), trace)
		}
	}

	if !sink.WaitMetrics(20*time.Second, "ratelimit_decisions_total") {
		t.Errorf("no ratelimit_decisions_total over OTLP; got %d metrics", len(sink.MetricNames()))
	}
	for _, secret := range []string{apiKey, rlsKey, strings.TrimPrefix(token, "Bearer "), "127.0.0.2", "/orders"} {
		if sink.Contains([]byte(secret)) {
			t.Errorf("%q was exported", secret)
		}
	}
}

// TestTelemetryGRPCUpstream: a gRPC call through the proxy, exported over OTLP/HTTP: the
// upstream's call metadata holds the request span's traceparent, not the untrusted client's.
func TestTelemetryGRPCUpstream(t *testing.T) {
	sink := otlpsink.Start(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen <- strings.Join(md.Get("traceparent"), ",")
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	g := startGateway(t, "http://"+l.Addr().String(), fmt.Sprintf(`upstream_protocol: h2c
telemetry:
  otlp: {endpoint: "%s", protocol: http/protobuf}
`, sink.HTTPURL)+lenientPolicy, "OTEL_BSP_SCHEDULE_DELAY=50")
	if _, err := grpcClient(t, g).Check(callCtx(t, "traceparent", traceparentOf(traceUntrusted)), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	got := <-seen
	if !sink.Wait(20*time.Second, func(s []otlpsink.Span) bool { return len(s) >= 2 }) {
		t.Fatalf("got %d spans, want the call's and its store call's", len(sink.Spans()))
	}
	var call otlpsink.Span
	for _, s := range sink.Spans() {
		if s.GetName() == http.MethodPost {
			call = s
		}
	}
	if call.Span == nil {
		t.Fatal("no span of the call")
	}
	want := "00-" + hex.EncodeToString(call.GetTraceId()) + "-" + hex.EncodeToString(call.GetSpanId()) + "-01"
	if got != want || strings.Contains(got, traceUntrusted) {
		t.Errorf("the gRPC upstream saw traceparent %q, want the call span's %q", got, want)
	}
	if v := otlpsink.Attr(call.Span, "network.protocol.version"); v != "2" {
		t.Errorf("network.protocol.version %q, want 2", v)
	}
}

// TestTelemetryDynamoDB: on the DynamoDB store, each store span of a recorded request has the
// DynamoDB calls it made as children, named by operation with the table, and no key is
// exported (an item's key holds an unkeyed digest of it; the raw value must not appear).
func TestTelemetryDynamoDB(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-otel-" + randomSuffix()
	sink := otlpsink.Start(t)
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, dynamoStore(table, endpoint, true, "5s", "")+fmt.Sprintf(`telemetry:
  otlp: {endpoint: "%s", insecure: true}
policies:
  - {name: per-key, key: api_key, algorithm: token_bucket, rate: 1/h, burst: 1}
`, sink.GRPCAddr), append(awsEnv(), "OTEL_BSP_SCHEDULE_DELAY=50")...)
	apiKey := adminKeyPrefix + "dynamo-otel-" + randomSuffix()
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		resp, _ := get(t, g.proxy+"/", "X-Api-Key", apiKey)
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}
	isDynamo := func(s otlpsink.Span) bool { return strings.HasPrefix(s.GetName(), "DynamoDB.") }
	if !sink.Wait(20*time.Second, func(spans []otlpsink.Span) bool {
		takes, calls := 0, 0
		for _, s := range spans {
			if s.GetName() == "ratelimit.store.take" {
				takes++
			}
			if isDynamo(s) {
				calls++
			}
		}
		return takes >= 2 && calls >= 2
	}) {
		t.Fatalf("got %d spans, want 2 store calls with DynamoDB calls under them", len(sink.Spans()))
	}
	spans := sink.Spans()
	takes := map[string]otlpsink.Span{}
	for _, s := range spans {
		if s.GetName() == "ratelimit.store.take" {
			takes[string(s.GetSpanId())] = s
			if got := otlpsink.Attr(s.Span, "ratelimit.store"); got != "dynamodb" {
				t.Errorf("store span: ratelimit.store %q, want dynamodb", got)
			}
		}
	}
	under := map[string]int{}
	for _, s := range spans {
		if !isDynamo(s) {
			continue
		}
		parent, ok := takes[string(s.GetParentSpanId())]
		if !ok || string(parent.GetTraceId()) != string(s.GetTraceId()) {
			t.Errorf("%s is not under a store span", s.GetName())
			continue
		}
		under[string(s.GetParentSpanId())]++
		if got := otlpsink.Attr(s.Span, "aws.dynamodb.table_names"); got != table {
			t.Errorf("%s: table %q, want %q", s.GetName(), got, table)
		}
		if got := otlpsink.Attr(s.Span, "error.type"); got != "" {
			t.Errorf("%s failed: %s (a refusal is a failed condition, not an error)", s.GetName(), got)
		}
	}
	if len(under) != 2 {
		t.Errorf("DynamoDB calls under %d of the 2 store spans", len(under))
	}
	if sink.Contains([]byte(apiKey)) {
		t.Error("the raw API key was exported")
	}
}

// TestTelemetryValidate: `validate` says where telemetry goes, and names a bad value with its
// field.
func TestTelemetryValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, telemetry string) string {
		p := filepath.Join(dir, name)
		cfg := "upstream: http://127.0.0.1:3000\n" + lenientPolicy + "telemetry:\n" + telemetry
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "  otlp: {endpoint: 'collector:4317', insecure: true}\n  traces: {sample_ratio: 0.1}\n  metrics: {otlp: true, interval: 30s}\n")
	code, out, errs := runCLI(t, "validate", "--config", good)
	if want := "telemetry: traces to collector:4317 (grpc), sample ratio 0.1; metrics every 30s"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("validate: exit %d, %q%q; want %q", code, out, errs, want)
	}
	bad := write("bad.yaml", "  otlp: {endpoint: 'collector:4317', protocol: http}\n  traces: {sample_ratio: 2}\n")
	code, out, errs = runCLI(t, "validate", "--config", bad)
	for _, want := range []string{`telemetry.otlp.protocol: "http": must be grpc or http/protobuf`, `telemetry.traces.sample_ratio: "2": must be from 0 to 1`} {
		if code != 1 || !strings.Contains(errs, want) {
			t.Errorf("validate: exit %d, %q%q; want exit 1 and %q", code, out, errs, want)
		}
	}
}
