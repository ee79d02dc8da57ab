package e2e

// End-to-end test of the rate limit service beside the proxy in one process, over TLS: the
// tls block's certificate serves both ports.

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRLSBesideProxyOverTLS: upstream, policies, tls and rls in one config. The proxy answers
// over HTTPS; the RLS port answers ShouldRateLimit over TLS with the same certificate, counts
// on the same store without touching the proxy's buckets, and refuses cleartext.
func TestRLSBesideProxyOverTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "rls-ca")
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "e2e.yaml"), []byte(rlsRules), 0o600); err != nil {
		t.Fatal(err)
	}
	rlsAddr := freePort(t)
	up := newUpstream(t, nil)
	g, _, _ := tlsGateway(t, ca, up.URL, "", fmt.Sprintf("%s\nrls:\n  listen: %s\n  config_dir: %s\n", ipPolicy, rlsAddr, rules))

	client := tlsClient(ca.pool, true)
	resp, err := client.Get(httpsURL(g) + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("proxy over TLS: got %d, want 200", resp.StatusCode)
	}

	conn, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &pb.RateLimitRequest{Domain: "e2e", Descriptors: []*rlext.RateLimitDescriptor{desc("per_hour", "tls-"+randomSuffix())}}
	for i, want := range []uint32{2, 1, 0} {
		r, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("call %d over TLS: %v", i+1, err)
		}
		if r.GetStatuses()[0].GetLimitRemaining() != want || r.GetOverallCode() != pb.RateLimitResponse_OK {
			t.Errorf("call %d: got %v remaining %d, want OK %d", i+1, r.GetOverallCode(), r.GetStatuses()[0].GetLimitRemaining(), want)
		}
	}
	if r, err := c.ShouldRateLimit(ctx, req); err != nil || r.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("call 4: got %v, %v; want OVER_LIMIT", r, err)
	}

	plain, err := grpc.NewClient(rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	if _, err := pb.NewRateLimitServiceClient(plain).ShouldRateLimit(sctx, req); err == nil {
		t.Error("a cleartext call to the TLS port was answered")
	}
	// The proxy's bucket is its own: its ip policy (burst 3) still admits two more.
	for i := range 2 {
		resp, err := client.Get(httpsURL(g) + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("proxy request %d: got %d, want 200", i+2, resp.StatusCode)
		}
	}
}
