package main

// The gRPC example of deploy/kubernetes/grpc, served: the real binary with that ConfigMap's
// configuration in front of a grpc-go server.

import (
	"crypto/tls"
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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
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

// TestKubernetesGRPCExampleServes starts the binary with the ConfigMap of deploy/kubernetes/grpc
// as the pod would read it (its TLS files where the Secret's volume puts them, a certificate
// of the test's CA in them); only listen, admin_listen and upstream are moved to loopback
// ports. A grpc-go client with TLS credentials makes a health call through it, then calls the
// method that the example limits per API key until the gateway answers RESOURCE_EXHAUSTED.
func TestKubernetesGRPCExampleServes(t *testing.T) {
	ca := newTestCA(t, "test CA")
	ex := loadExample(t, kubernetesDir+"/grpc", ca)
	if ex.cfg.TLS == nil || ex.cfg.TLS.CertFile == "" {
		t.Fatal("the gRPC example terminates no TLS")
	}
	const method, policyName = "/orders.v1.Orders/Export", "export-per-api-key"
	var limit int64
	var window time.Duration
	for _, p := range ex.cfg.Policies {
		if p.Name == policyName && p.Key == "api_key" && strings.HasPrefix(method, p.Match.PathPrefix) {
			limit, window = p.Limit, p.Window
		}
	}
	if limit == 0 {
		t.Fatalf("the gRPC example has no api_key policy %s with a limit on %s", policyName, method)
	}
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
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, withoutKeys(t, text, "listen", "admin_listen", "upstream"), env...)

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

	// The upstream has no Orders service: a call it receives ends Unimplemented, with its own
	// message; the call the gateway refuses never reaches it.
	export := func(key string) error {
		return cc.Invoke(callCtx(t, "x-api-key", key), method, &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	}
	for i := range limit {
		if err := export("key-a"); status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), "orders.v1.Orders") {
			t.Fatalf("Export call %d of %d: got %v, want the upstream's Unimplemented", i+1, limit, err)
		}
	}
	st := status.Convert(export("key-a"))
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), `"`+policyName+`"`) {
		t.Fatalf("Export call %d: got %v %q, want ResourceExhausted naming %s", limit+1, st.Code(), st.Message(), policyName)
	}
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	// The sliding window counts in tenths of the window, the oldest in full: the wait may reach
	// 1.1 windows (docs/algorithms.md).
	if delay <= 0 || delay > window+window/10 {
		t.Errorf("RetryInfo delay got %v (details %v), want within 1.1 × the policy's window %v", delay, st.Details(), window)
	}
	// The limit is per key and per method.
	if err := export("key-b"); status.Code(err) != codes.Unimplemented {
		t.Errorf("Export with another key: got %v, want the upstream's Unimplemented", err)
	}
	if _, err := healthpb.NewHealthClient(cc).Check(callCtx(t, "x-api-key", "key-a"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health check of the throttled key: %v, want OK", err)
	}
	if got := metric(t, g.admin, `ratelimit_protocol_decisions_total{protocol="grpc",result="limited"}`); got != 1 {
		t.Errorf(`ratelimit_protocol_decisions_total{protocol="grpc",result="limited"} got %v, want 1`, got)
	}
}
