package rls

import (
	"crypto/tls"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// ServiceName is the gRPC name of the rate limit service, also answered by the health service.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// ServerOptions shape the gRPC server of NewGRPCServer.
type ServerOptions struct {
	// TLS, when set, serves TLS (h2 by ALPN); nil serves HTTP/2 cleartext.
	TLS *tls.Config
	// MaxConcurrentStreams bounds the calls one connection may have open at once (Envoy sends
	// every call of a worker thread over one connection). 0 means gRPC's default.
	MaxConcurrentStreams uint32
	// HandshakeTimeout bounds a new connection's TLS and HTTP/2 handshake (the proxy's
	// server.read_header_timeout): a connection that stays silent is closed then, not after
	// grpc-go's default of 120 s. 0 keeps that default.
	HandshakeTimeout time.Duration
	// Interceptor, when set, wraps every unary call (the gateway's tracing). nil: none.
	Interceptor grpc.UnaryServerInterceptor
}

// NewGRPCServer returns a gRPC server serving svc and the standard gRPC health service, which
// answers SERVING for "" and for ServiceName until the returned health server is shut down.
func NewGRPCServer(svc *Service, o ServerOptions) (*grpc.Server, *health.Server) {
	opts := []grpc.ServerOption{
		// Envoy may ping idle connections (its http2_protocol_options connection_keepalive);
		// gRPC's default enforcement would answer a ping more often than every 5 minutes with
		// GOAWAY, and every RLS call on that connection would fail once.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
	}
	if o.HandshakeTimeout > 0 {
		opts = append(opts, grpc.ConnectionTimeout(o.HandshakeTimeout))
	}
	if o.Interceptor != nil {
		opts = append(opts, grpc.UnaryInterceptor(o.Interceptor))
	}
	if o.MaxConcurrentStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(o.MaxConcurrentStreams))
	}
	s := grpc.NewServer(opts...)
	pb.RegisterRateLimitServiceServer(s, svc)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	return s, h
}
