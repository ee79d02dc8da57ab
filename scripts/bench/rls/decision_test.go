package main

// BenchmarkDecision puts the two front ends side by side on one machine in one run: the proxy's
// own decision (its http.Handler, the network-free upstream of internal/proxy's benchmarks) and
// the rate limit service's, in process and over a loopback gRPC connection (framing, HTTP/2,
// syscalls). Both charge three limits (fixed window, token bucket, sliding window) per request
// on a memory store, drawn from 10,000 distinct values each, with limits that admit everything,
// so that both take their admitting path. Run by `make bench-rls`.

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/console"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/rls"
)

// proxyPolicies are the proxy's three limits, keyed by headers as the RLS descriptors are keyed
// by their values.
const proxyPolicies = `upstream: http://upstream.invalid
policies:
  - {name: user, key: "header:X-User", algorithm: fixed_window, limit: 1000000000, window: 1h}
  - {name: key, key: "header:X-Key", algorithm: token_bucket, rate: 1000000/s, burst: 1000000000}
  - {name: route, key: "header:X-Route", algorithm: sliding_window, limit: 1000000000, window: 1h}
`

// staticUpstream answers 200 without a network, as internal/proxy's benchmarks do.
type staticUpstream struct{}

func (staticUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

func compileRLS(b *testing.B) *envoyrules.Rules {
	b.Helper()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(benchRules), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, err := policy.Parse([]byte("rls:\n  listen: 127.0.0.1:0\n  config_dir: "+dir+"\n"), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		b.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return set.RLS()
}

// newRLSService builds the service on a memory store, with console c (nil: none).
func newRLSService(b *testing.B, c rls.Console) *rls.Service {
	b.Helper()
	rules := compileRLS(b)
	m, err := rls.NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	s, err := rls.New(rls.Options{Rules: func() *envoyrules.Rules { return rules }, Store: memstore.New(memstore.Options{}),
		Backend: "memory", StoreTimeout: time.Second, Metrics: m, Headers: rls.ParseHeaders("ietf", false), Console: c})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// requests are the RLS calls of the benchmark, over valuesN distinct values.
func requests() []*pb.RateLimitRequest {
	out := make([]*pb.RateLimitRequest, valuesN)
	for i := range out {
		out[i] = benchRequest(i)
	}
	return out
}

// benchRLSInProcess calls the service in process, with console c (nil: none).
func benchRLSInProcess(b *testing.B, c rls.Console) {
	s := newRLSService(b, c)
	reqs := requests()
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(p *testing.PB) {
		for p.Next() {
			resp, err := s.ShouldRateLimit(context.Background(), reqs[next.Add(1)%valuesN])
			if err != nil || resp.GetOverallCode() != pb.RateLimitResponse_OK {
				b.Fatalf("got %v, %v", resp, err)
			}
		}
	})
}

func BenchmarkDecision(b *testing.B) {
	b.Run("proxy", func(b *testing.B) {
		cfg, err := policy.Parse([]byte(proxyPolicies), policy.LoadOptions{Getenv: func(string) string { return "" }})
		if err != nil {
			b.Fatal(err)
		}
		set, err := policy.Compile(cfg, policy.CompileOptions{})
		if err != nil {
			b.Fatal(err)
		}
		h, err := proxy.New(proxy.Options{
			Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
			Policies:  func() proxy.Policies { return set },
			Limiter:   memstore.New(memstore.Options{}),
			Backend:   "memory",
			Transport: staticUpstream{},
			Metrics:   proxy.NewMetrics(nil),
		})
		if err != nil {
			b.Fatal(err)
		}
		reqs := make([]*http.Request, valuesN)
		for i := range reqs {
			r := httptest.NewRequest(http.MethodGet, "http://proxy.local/v1/items", nil)
			r.RemoteAddr = "192.0.2.1:1234"
			v := strconv.Itoa(i)
			r.Header.Set("X-User", "user-"+v)
			r.Header.Set("X-Key", "key-"+v)
			r.Header.Set("X-Route", "route-"+v)
			reqs[i] = r
		}
		var next atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(p *testing.PB) {
			for p.Next() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, reqs[next.Add(1)%valuesN])
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	})
	b.Run("rls-in-process", func(b *testing.B) { benchRLSInProcess(b, nil) })
	// The same with the operators' console (package console) fed by every descriptor: its
	// exemption check and its series and sketch of each rule, over the 10,000 values.
	b.Run("rls-in-process-console", func(b *testing.B) {
		c, err := console.New(console.Options{Policies: func() *policy.Set { return nil }, Pseudonyms: policy.NewPseudonyms(nil)})
		if err != nil {
			b.Fatal(err)
		}
		benchRLSInProcess(b, c)
	})
	b.Run("rls-grpc-loopback", func(b *testing.B) {
		s := newRLSService(b, nil)
		srv, _ := rls.NewGRPCServer(s, rls.ServerOptions{})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve(l) }()
		defer srv.Stop()
		conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		c := pb.NewRateLimitServiceClient(conn)
		reqs := requests()
		var next atomic.Uint64
		b.ReportAllocs()
		b.ResetTimer()
		b.SetParallelism(8) // calls in flight per CPU, as Envoy's workers keep several
		b.RunParallel(func(p *testing.PB) {
			for p.Next() {
				resp, err := c.ShouldRateLimit(context.Background(), reqs[next.Add(1)%valuesN])
				if err != nil || resp.GetOverallCode() != pb.RateLimitResponse_OK {
					b.Fatalf("got %v, %v", resp, err)
				}
			}
		})
	})
}
