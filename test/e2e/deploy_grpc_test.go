package e2e

// The gRPC example of deploy/kubernetes/grpc, served: the real binary with that ConfigMap's
// configuration in front of a grpc-go server.

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// withoutKeys returns the YAML document without the given top-level keys.
func withoutKeys(t *testing.T, text []byte, keys ...string) string {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		t.Fatalf("not a YAML mapping:\n%s", text)
	}
	top := doc.Content[0]
	var kept []*yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if !slices.Contains(keys, top.Content[i].Value) {
			kept = append(kept, top.Content[i], top.Content[i+1])
		}
	}
	top.Content = kept
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// ordersUpstream is a grpc-go server with the health service. Any other method answers
// Unimplemented at once, naming itself, except a Watch, which sends its headers and holds the
// stream open until the client leaves.
func ordersUpstream(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		if !strings.HasSuffix(method, "/Watch") {
			return status.Errorf(codes.Unimplemented, "upstream: no method %s", method)
		}
		if err := stream.SendHeader(nil); err != nil {
			return err
		}
		<-stream.Context().Done()
		return status.FromContextError(stream.Context().Err()).Err()
	}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// examplePolicy returns the example's policy of that name, which must key on the API key and
// match method.
func examplePolicy(t *testing.T, cfg *policy.Config, name, method string) policy.PolicyConfig {
	t.Helper()
	for _, p := range cfg.Policies {
		if p.Name == name && p.Key == "api_key" && strings.HasPrefix(method, p.Match.PathPrefix) && p.Limit > 0 {
			return p
		}
	}
	t.Fatalf("the gRPC example has no api_key policy %s with a limit on %s", name, method)
	return policy.PolicyConfig{}
}

// TestKubernetesGRPCExampleServes starts the binary with the ConfigMap of deploy/kubernetes/grpc
// as the pod would read it (its TLS files where the Secret's volume puts them, a certificate
// of the test's CA in them); only listen, admin_listen and upstream are moved to loopback
// ports. A grpc-go client with TLS credentials makes a health call through it; calls the method
// that the example limits per API key until the gateway answers RESOURCE_EXHAUSTED; and opens
// as many Watch streams as the example lets one key hold open, and one more.
func TestKubernetesGRPCExampleServes(t *testing.T) {
	ca := newTestCA(t, "test CA")
	ex := loadExample(t, kubernetesDir+"/grpc", ca)
	if ex.cfg.TLS == nil || ex.cfg.TLS.CertFile == "" {
		t.Fatal("the gRPC example terminates no TLS")
	}
	const exportMethod, watchMethod = "/orders.v1.Orders/Export", "/orders.v1.Orders/Watch"
	export := examplePolicy(t, ex.cfg, "export-per-api-key", exportMethod)
	watch := examplePolicy(t, ex.cfg, "watch-streams-per-api-key", watchMethod)
	text, err := os.ReadFile(ex.rootConfig)
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range ex.env {
		if name, _, _ := strings.Cut(e, "="); !slices.Contains([]string{"RATELIMIT_LISTEN", "RATELIMIT_ADMIN_LISTEN", "RATELIMIT_UPSTREAM"}, name) {
			env = append(env, e)
		}
	}
	g := startGateway(t, "http://"+ordersUpstream(t), withoutKeys(t, text, "listen", "admin_listen", "upstream"), env...)

	cc, err := grpc.NewClient(strings.TrimPrefix(g.proxy, "http://"),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).Check(callCtx(t, "x-api-key", "key-a"), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check over TLS: got %v, %v; want SERVING", resp, err)
	}

	// A call the upstream receives ends Unimplemented, with its message; the call the gateway
	// refuses never reaches it.
	call := func(key string) error {
		return cc.Invoke(callCtx(t, "x-api-key", key), exportMethod, &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	}
	for i := range export.Limit {
		if err := call("key-a"); status.Code(err) != codes.Unimplemented || !strings.HasPrefix(status.Convert(err).Message(), "upstream: ") {
			t.Fatalf("Export call %d of %d: got %v, want the upstream's Unimplemented", i+1, export.Limit, err)
		}
	}
	st := status.Convert(call("key-a"))
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), `"`+export.Name+`"`) {
		t.Fatalf("Export call %d: got %v %q, want ResourceExhausted naming %s", export.Limit+1, st.Code(), st.Message(), export.Name)
	}
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	// The sliding window counts in tenths of the window, the oldest in full: the wait may reach
	// 1.1 windows (docs/algorithms.md).
	if w := export.Window; delay <= 0 || delay > w+w/10 {
		t.Errorf("RetryInfo delay got %v (details %v), want within 1.1 × the policy's window %v", delay, st.Details(), w)
	}
	// The limit is per key and per method.
	if err := call("key-b"); status.Code(err) != codes.Unimplemented {
		t.Errorf("Export with another key: got %v, want the upstream's Unimplemented", err)
	}
	if _, err := healthpb.NewHealthClient(cc).Check(callCtx(t, "x-api-key", "key-a"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check of the throttled key: %v, want OK", err)
	}

	// Streams: each admitted one holds its slot while it is open. openWatch returns nil for a
	// stream the upstream answered with headers, or the error of one that ended first.
	openWatch := func(ctx context.Context) error {
		s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, watchMethod)
		if err == nil {
			err = s.SendMsg(&healthpb.HealthCheckRequest{})
		}
		if err == nil {
			err = s.CloseSend()
		}
		if err != nil {
			return err
		}
		if md, err := s.Header(); err != nil || md == nil { // nil, nil: trailers only, the status is RecvMsg's
			return s.RecvMsg(&healthpb.HealthCheckResponse{})
		}
		return nil
	}
	cancels := make([]context.CancelFunc, watch.Limit)
	for i := range cancels {
		ctx, cancel := context.WithCancel(callCtx(t, "x-api-key", "key-a"))
		cancels[i] = cancel
		defer cancel()
		if err := openWatch(ctx); err != nil {
			t.Fatalf("Watch stream %d of %d: %v, want it open", i+1, watch.Limit, err)
		}
	}
	st = status.Convert(openWatch(callCtx(t, "x-api-key", "key-a")))
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), `"`+watch.Name+`"`) {
		t.Fatalf("Watch stream %d: got %v %q, want ResourceExhausted naming %s", watch.Limit+1, st.Code(), st.Message(), watch.Name)
	}
	if err := openWatch(callCtx(t, "x-api-key", "key-b")); err != nil {
		t.Errorf("Watch stream of another key: %v, want it open", err)
	}
	cancels[0]()
	eventually(t, "a Watch stream's slot freed by its cancellation", func() bool {
		return openWatch(callCtx(t, "x-api-key", "key-a")) == nil
	})

	if got := metric(t, g.admin, `ratelimit_protocol_decisions_total{protocol="grpc",result="limited"}`); got < 2 {
		t.Errorf(`ratelimit_protocol_decisions_total{protocol="grpc",result="limited"} got %v, want at least the 2 refusals above`, got)
	}
}
