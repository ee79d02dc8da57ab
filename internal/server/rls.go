package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/rls"
)

// rlsServer is Envoy's rate limit service on its own gRPC port (the rls block).
type rlsServer struct {
	srv    *grpc.Server
	health *health.Server
	l      net.Listener
}

// newRLS builds the rate limit service on the gateway's store, metrics and rules (the reloader's
// set in force) and opens its listener. tlsCfg nil serves HTTP/2 cleartext; it feeds the
// operators' console when there is one.
func (g *gateway) newRLS(ctx context.Context, tlsCfg *tls.Config) (*rlsServer, error) {
	cfg, rl, reg, log, now := g.cfg, g.rl, g.reg, g.log, g.now
	var console rls.Console
	if g.console != nil {
		console = g.console
	}
	m, err := rls.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	svc, err := rls.New(rls.Options{
		Rules:        func() *envoyrules.Rules { return rl.Set().RLS() },
		Store:        g.limiter(),
		Backend:      cfg.Store.Backend,
		StoreTimeout: cfg.Store.Timeout,
		Headers:      rls.ParseHeaders(cfg.RLS.ResponseHeaders, cfg.Headers.Reset == "delta"),
		ShadowMode:   cfg.RLS.ShadowMode,
		Metrics:      m,
		Logger:       log.Named("rls"),
		Now:          now,
		Console:      console,
	})
	if err != nil {
		return nil, err
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", cfg.RLS.Listen)
	if err != nil {
		return nil, fmt.Errorf("rls.listen: %w", err)
	}
	srv, h := rls.NewGRPCServer(svc, rls.ServerOptions{TLS: tlsCfg, MaxConcurrentStreams: uint32(cfg.Server.MaxConcurrentStreams),
		HandshakeTimeout: cfg.Server.ReadHeaderTimeout, Interceptor: g.rlsInterceptor()})
	return &rlsServer{srv: srv, health: h, l: l}, nil
}

// serve serves until the server stops.
func (r *rlsServer) serve() error {
	if err := r.srv.Serve(r.l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("rls: %w", err)
	}
	return nil
}

// notServing makes the health service answer NOT_SERVING (shutdown has begun), so that Envoy's
// active health checks move calls to another replica while this one still answers.
func (r *rlsServer) notServing() { r.health.Shutdown() }

// drain finishes the calls in flight, or cuts them when ctx ends first.
func (r *rlsServer) drain(ctx context.Context) {
	r.health.Shutdown()
	done := make(chan struct{})
	go func() { r.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		r.srv.Stop()
		<-done
	}
}
