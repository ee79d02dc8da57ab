package e2e

// End-to-end tests of gRPC through the real binary: grpc-go as client and server, the standard
// grpc.health.v1 service (no code generation), over real sockets.

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// grpcUpstream is a grpc-go server with the health service; calls counts the calls that
// reached it, and streamEnded receives when a streaming call's handler returned.
type grpcUpstream struct {
	addr        string
	health      *health.Server
	calls       atomic.Int64
	streamEnded chan struct{}
}

func newGRPCUpstream(t *testing.T) *grpcUpstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &grpcUpstream{addr: l.Addr().String(), health: health.NewServer(), streamEnded: make(chan struct{}, 8)}
	s := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			u.calls.Add(1)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			u.calls.Add(1)
			err := h(srv, ss)
			u.streamEnded <- struct{}{}
			return err
		}),
	)
	healthpb.RegisterHealthServer(s, silentWatch{u.health})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return u
}

// silentWatch is the health service with two services of its own whose Watch sends nothing,
// not even the response headers (grpc-go sends them with the first message), for a while:
// "silent-1s" then sends SERVING and ends with OK, "silent" only ends when the call does.
type silentWatch struct{ *health.Server }

func (s silentWatch) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	var after <-chan time.Time // nil: never
	switch req.GetService() {
	case "silent-1s":
		after = time.After(time.Second) // the silence under test, not a wait for something
	case "silent":
	default:
		return s.Server.Watch(req, stream)
	}
	select {
	case <-after:
		return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
}

// grpcClient dials the gateway's proxy port in cleartext (h2c with prior knowledge).
func grpcClient(t *testing.T, g *gateway) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient(strings.TrimPrefix(g.proxy, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func callCtx(t *testing.T, kv ...string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

const grpcKeyPolicy = `upstream_protocol: h2c
policies:
  - name: per-key
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 2
`

// TestGRPCUnaryThrottledWithRetryInfo: the API key comes from gRPC metadata; over the limit the
// client sees RESOURCE_EXHAUSTED with the wait in a RetryInfo detail and the rate-limit headers
// as metadata, and the upstream is not called.
func TestGRPCUnaryThrottledWithRetryInfo(t *testing.T) {
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, grpcKeyPolicy)
	c := grpcClient(t, g)

	for i := range 2 {
		var hdr metadata.MD
		resp, err := c.Check(callCtx(t, "x-api-key", "key-a"), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("call %d: got %v, want SERVING", i, resp.GetStatus())
		}
		if got := hdr.Get("x-ratelimit-limit"); len(got) != 1 || got[0] != "2" {
			t.Errorf("call %d: x-ratelimit-limit metadata got %v, want [2]", i, got)
		}
	}
	var trailer metadata.MD
	start := time.Now()
	_, err := c.Check(callCtx(t, "x-api-key", "key-a"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("call 3: got %v, want ResourceExhausted", err)
	}
	if !strings.Contains(st.Message(), `policy "per-key" exceeded`) {
		t.Errorf("call 3: message %q does not name the policy", st.Message())
	}
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	// 1 per hour with a burst of 2: the next token is due an hour after the first two.
	if elapsed := time.Since(start); delay < 59*time.Minute-elapsed || delay > 61*time.Minute {
		t.Errorf("RetryInfo delay got %v, want about 1h (details %v)", delay, st.Details())
	}
	if got := trailer.Get("x-ratelimit-remaining"); len(got) != 1 || got[0] != "0" {
		t.Errorf("x-ratelimit-remaining metadata got %v, want [0]", got)
	}
	if got := trailer.Get("retry-after"); len(got) != 1 || got[0] == "" {
		t.Errorf("retry-after metadata got %v, want one value", got)
	}
	if got := up.calls.Load(); got != 2 {
		t.Errorf("upstream calls got %d, want 2", got)
	}
	// Another key from metadata has its own bucket.
	if _, err := c.Check(callCtx(t, "x-api-key", "key-b"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another api key: %v, want OK", err)
	}
	for series, want := range map[string]float64{
		`ratelimit_protocol_decisions_total{protocol="grpc",result="allowed"}`:  3,
		`ratelimit_protocol_decisions_total{protocol="grpc",result="limited"}`:  1,
		`ratelimit_protocol_decisions_total{protocol="http2",result="allowed"}`: 0,
		`ratelimit_decisions_total{result="limited"}`:                           1,
	} {
		if got := metric(t, g.admin, series); got != want {
			t.Errorf("%s got %v, want %v", series, got, want)
		}
	}
}

// TestGRPCServerStreamingAndCancel: a server-streaming call (health Watch) streams through the
// gateway as the upstream sends, and canceling it ends the upstream's handler.
func TestGRPCServerStreamingAndCancel(t *testing.T) {
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, "upstream_protocol: auto\n"+lenientPolicy)
	c := grpcClient(t, g)

	up.health.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := c.Watch(ctx, &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING} {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if msg.GetStatus() != want {
			t.Fatalf("got %v, want %v", msg.GetStatus(), want)
		}
		// The next message exists only once this one has arrived: nothing is buffered whole.
		up.health.SetServingStatus("svc", healthpb.HealthCheckResponse_NOT_SERVING)
	}
	cancel()
	select {
	case <-up.streamEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's Watch was still running 10s after the client canceled")
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		t.Errorf("recv after cancel: got %v, want Canceled", err)
	}
}

// TestGRPCUnauthenticated: a bearer token from metadata is verified like an HTTP one; a bad one
// gets UNAUTHENTICATED, a good one names the user whose bucket is charged.
func TestGRPCUnauthenticated(t *testing.T) {
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, "upstream_protocol: h2c\n"+jwtIdentity+`  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 1
    window: 1h
`, "E2E_JWT_SECRET="+jwtSecret)
	c := grpcClient(t, g)
	good, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Check(callCtx(t, "authorization", "Bearer not.a.jwt"), &healthpb.HealthCheckRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.Unauthenticated {
		t.Errorf("bad token: got %v, want Unauthenticated", err)
	}
	if _, err := c.Check(callCtx(t, "authorization", "Bearer "+good), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("good token: %v, want OK", err)
	}
	_, err = c.Check(callCtx(t, "authorization", "Bearer "+good), &healthpb.HealthCheckRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted {
		t.Errorf("good token, second call: got %v, want ResourceExhausted (1 per user)", err)
	}
	if got := up.calls.Load(); got != 1 {
		t.Errorf("upstream calls got %d, want 1", got)
	}
}

// TestGRPCDeadlineAndUpstreamFailures: a call whose deadline ends before its leaky-bucket turn
// gets DEADLINE_EXCEEDED from the gateway at once; an upstream that is down gets UNAVAILABLE,
// one that does not answer in grpc_upstream_timeout DEADLINE_EXCEEDED.
func TestGRPCDeadlineAndUpstreamFailures(t *testing.T) {
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, `upstream_protocol: h2c
policies:
  - name: shaped
    key: global
    algorithm: leaky_bucket
    rate: 1/m
    burst: 5
`)
	c := grpcClient(t, g)
	if _, err := c.Check(callCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("first call: %v", err)
	}
	// The second call's turn is a minute away; its deadline is 2 seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	st, _ := status.FromError(err)
	if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "queue") {
		t.Errorf("call beyond its deadline: got %v, want DeadlineExceeded from the gateway (a message about the queue)", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the gateway answered after %v, want at once rather than at the deadline", took)
	}

	// An upstream that is not there.
	dead := freePort(t)
	g2 := startGateway(t, "http://"+dead, "upstream_protocol: h2c\n"+lenientPolicy)
	_, err = grpcClient(t, g2).Check(callCtx(t), &healthpb.HealthCheckRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "upstream") {
		t.Errorf("upstream down: got %v, want Unavailable from the gateway", err)
	}

	// An upstream that accepts the connection and never answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	g3 := startGateway(t, "http://"+l.Addr().String(), "upstream_protocol: h2c\ngrpc_upstream_timeout: 300ms\n"+lenientPolicy)
	_, err = grpcClient(t, g3).Check(callCtx(t), &healthpb.HealthCheckRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "upstream") {
		t.Errorf("upstream silent: got %v, want DeadlineExceeded from the gateway", err)
	}
}

// TestGRPCSilentStream: upstream_timeout does not cut a gRPC stream whose server stays silent,
// headers included, for five times as long: the client gets the message and OK, as it would
// without the gateway. grpc_upstream_timeout, when set, does cut it, with DEADLINE_EXCEEDED.
// (A plain request under the same upstream_timeout still gets 504: TestFaultStalledUpstream504.)
func TestGRPCSilentStream(t *testing.T) {
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, "upstream_protocol: h2c\nupstream_timeout: 200ms\n"+lenientPolicy)
	stream, err := grpcClient(t, g).Watch(callCtx(t), &healthpb.HealthCheckRequest{Service: "silent-1s"})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatalf("silent stream, upstream_timeout 200ms: got %v, want the upstream's message", err)
	}
	if msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("got %v, want SERVING", msg.GetStatus())
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the message: got %v, want the end of the stream with OK", err)
	}

	g2 := startGateway(t, "http://"+up.addr, "upstream_protocol: h2c\nupstream_timeout: 200ms\ngrpc_upstream_timeout: 300ms\n"+lenientPolicy)
	stream, err = grpcClient(t, g2).Watch(callCtx(t), &healthpb.HealthCheckRequest{Service: "silent"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if st, _ := status.FromError(err); st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "upstream") {
		t.Errorf("silent stream, grpc_upstream_timeout 300ms: got %v, want DeadlineExceeded from the gateway", err)
	}
}

// TestGRPCUserHeader: identity.user_header is read from gRPC metadata like any header.
func TestGRPCUserHeader(t *testing.T) {
	up := newGRPCUpstream(t)
	g := startGateway(t, "http://"+up.addr, `upstream_protocol: h2c
identity:
  user_header: x-user-id
policies:
  - name: per-user
    key: user
    algorithm: fixed_window
    limit: 1
    window: 1h
`)
	c := grpcClient(t, g)
	for i, tc := range []struct {
		user string
		want codes.Code
	}{{"alice", codes.OK}, {"alice", codes.ResourceExhausted}, {"bob", codes.OK}} {
		_, err := c.Check(callCtx(t, "x-user-id", tc.user), &healthpb.HealthCheckRequest{})
		if got := status.Code(err); got != tc.want {
			t.Errorf("call %d as %s: got %v, want %v", i, tc.user, got, tc.want)
		}
	}
}
