package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/console"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/fallback"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/telemetry"
)

// gateway is everything Run builds from the configuration before it serves. Its builders are
// methods that read the fields built before them and set their own; what must be undone on
// the way out is in closers, run in reverse by close.
type gateway struct {
	o         Options
	log       *zap.Logger
	reg       *prometheus.Registry
	rl        *Reloader
	cfg       *policy.Config
	gcPercent int
	memLimit  int64

	st         *fallback.Store
	closeStore func() error     // gives back what the store holds (leases, slots); once
	now        func() time.Time // the clock decisions use (nil: time.Now)
	clock      *storeClock      // nil unless the backend is DynamoDB

	pseudonyms *policy.Pseudonyms
	console    *console.Console
	tel        *telemetry.Telemetry // nil without telemetry.otlp.endpoint (telemetry.go)
	upstream   *url.URL
	handler    http.Handler // nil without upstream: the rate limit service alone

	proxyL, adminL     net.Listener // proxyL nil without a proxy
	rls                *rlsServer   // nil without the rls block
	proxySrv, adminSrv *http.Server
	draining           atomic.Bool // /readyz answers 503 once shutdown has begun

	closers []func()
}

// newGateway builds the gateway. On an error it returns what it built so far, closed (its
// logger still usable), or nil when not even the configuration loaded.
func newGateway(ctx context.Context, o Options) (g *gateway, err error) {
	g = &gateway{o: o, reg: proxy.NewRegistry()}
	g.gcPercent = tuneGC(o.Getenv)
	g.memLimit = tuneMemoryLimit(o.Getenv, cgroupMemoryMax)
	// A provisional logger reports load errors; the configured level applies once the file is read.
	g.log = newLogger(o.Log, zapcore.InfoLevel)
	g.rl, g.cfg, err = NewReloader(o.ConfigPath,
		policy.LoadOptions{Getenv: o.Getenv},
		policy.CompileOptions{Getenv: o.Getenv, Now: o.Now},
		g.log, g.reg)
	if err != nil {
		return nil, err
	}
	if lvl, err := zapcore.ParseLevel(g.cfg.Log.Level); err == nil {
		g.log = newLogger(o.Log, lvl)
		g.rl.log = g.log
	}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	for _, build := range []func(context.Context) error{
		g.buildStore, g.buildConsole, g.buildTelemetry, g.buildProxy, g.listen, g.buildRLS, g.buildServers,
	} {
		if err := build(ctx); err != nil {
			return g, err
		}
		if ctx.Err() != nil { // stopped while a part was being built
			return g, context.Canceled
		}
	}
	return g, nil
}

// onClose registers f to run when the gateway closes, before what was registered earlier.
func (g *gateway) onClose(f func()) { g.closers = append(g.closers, f) }

// close undoes what the builders did, newest first.
func (g *gateway) close() {
	for i := len(g.closers) - 1; i >= 0; i-- {
		g.closers[i]()
	}
	g.closers = nil
}

// buildStore builds the store (store.go) and its clock.
func (g *gateway) buildStore(ctx context.Context) error {
	b, err := g.newBackend(ctx)
	if err != nil {
		return err
	}
	if b.clock != nil {
		g.onClose(func() { b.clock.stop() }) // whichever way Run returns; idempotent
	}
	g.st, g.now, g.clock = b.fallback, b.decide, b.clock
	// drain gives the leases back while the admin port still answers; on an early exit close
	// does it.
	g.closeStore = sync.OnceValue(func() error {
		if b.close == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
		defer cancel()
		return b.close(ctx)
	})
	g.onClose(func() { _ = g.closeStore() })
	return nil
}

// buildConsole builds the operators' console (console.go), fed by whichever front ends serve,
// and routes grpc-go's own log, which must happen before any gRPC server or client exists.
func (g *gateway) buildConsole(context.Context) error {
	ps, err := policy.LogPseudonyms(g.cfg, g.o.Getenv)
	if err != nil {
		return err // validated already; only an environment changed since then gets here
	}
	g.pseudonyms = ps
	routeGRPCLog(g.log, ps, g.o.Getenv) // grpclog.go
	g.console, err = g.newConsole()
	return err
}

// buildProxy builds the proxy handler. Without upstream the gateway serves Envoy's rate limit
// service alone (validation guarantees the rls block then): no proxy handler, no proxy listener.
func (g *gateway) buildProxy(context.Context) error {
	cfg := g.cfg
	if cfg.Upstream == "" {
		return nil
	}
	upstream, err := url.Parse(cfg.Upstream)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	g.upstream = upstream
	upProto, err := proxy.ParseProtocol(cfg.UpstreamProtocol)
	if err != nil {
		return err
	}
	for _, w := range policy.Warnings(cfg) {
		g.log.Warn("configuration: " + w)
	}
	prot, err := newProtection(cfg.Protect, g.reg) // protect.go
	if err != nil {
		return fmt.Errorf("protect: %w", err)
	}
	h, err := proxy.New(proxy.Options{
		Protect:             prot,
		Upstream:            upstream,
		Policies:            g.rl.Current,
		Limiter:             g.limiter(),
		Backend:             cfg.Store.Backend,
		StoreTimeout:        cfg.Store.Timeout,
		UpstreamTimeout:     cfg.UpstreamTimeout,
		GRPCUpstreamTimeout: cfg.GRPCUpstreamTimeout,
		UpstreamProtocol:    upProto,
		UpgradeProtocols:    upgradeProtocols(cfg),
		GRPCRoutes:          grpcRoutes(cfg, upProto),
		GRPCIdleTimeout:     cfg.Server.GRPCIdleTimeout,
		WriteStallTimeout:   cfg.Server.WriteStallTimeout,
		Logger:              g.log,
		AccessLog:           cfg.Log.Access,
		Pseudonyms:          g.pseudonyms,
		Metrics:             proxy.NewMetrics(g.reg),
		Now:                 g.now, // nil: time.Now, and the store timer's start doubles as the instant
		Console:             g.console,
		Tracer:              g.tracer(),
	})
	if err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	g.handler = h
	return nil
}

// listen opens the proxy's and the admin listener.
func (g *gateway) listen(ctx context.Context) error {
	var lc net.ListenConfig
	if g.handler != nil {
		l, err := lc.Listen(ctx, "tcp", g.cfg.Listen)
		if err != nil {
			return fmt.Errorf("listen: %w", err)
		}
		g.proxyL = l
		g.onClose(func() { _ = l.Close() })
	}
	l, err := lc.Listen(ctx, "tcp", g.cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("admin_listen: %w", err)
	}
	g.adminL = l
	g.onClose(func() { _ = l.Close() })
	return nil
}

// buildRLS builds Envoy's rate limit service and opens its listener (rls.go), when configured.
func (g *gateway) buildRLS(ctx context.Context) error {
	if g.cfg.RLS == nil {
		return nil
	}
	var rlsTLS *tls.Config
	if tc := g.tlsConfigs(); tc != nil {
		rlsTLS = tc.serverTLS() // the tls block's certificate, rotated on reload like the proxy's
	}
	r, err := g.newRLS(ctx, rlsTLS)
	if err != nil {
		return err
	}
	g.rls = r
	g.onClose(r.srv.Stop)
	return nil
}

// tlsConfigs are the listeners' TLS settings from the set in force, or nil without a tls block.
func (g *gateway) tlsConfigs() *tlsConfigs {
	if g.cfg.TLS == nil {
		return nil
	}
	return &tlsConfigs{material: func() *policy.TLSMaterial { return g.rl.Set().TLS() }}
}

// buildServers builds the proxy's and the admin listener's HTTP servers.
func (g *gateway) buildServers(context.Context) error {
	cfg := g.cfg
	conns, err := newConnTracker(g.reg)
	if err != nil {
		return fmt.Errorf("register connection metrics: %w", err)
	}
	errLog, _ := zap.NewStdLogAt(g.log.Named("http"), zapcore.WarnLevel)
	// net/http's own lines (connection, HTTP/2 and TLS handshake errors) name the client's
	// address: they reach the log with pseudonyms instead.
	errLog = proxy.ScrubLog(errLog, g.pseudonyms)
	g.proxySrv = &http.Server{
		Handler:           conns.wrap(g.traced(g.handler)),
		ConnContext:       conns.connContext,
		ConnState:         conns.connState,
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		ReadTimeout:       cfg.Server.ReadTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          errLog,
		Protocols:         listenerProtocols(cfg.TLS != nil),
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: cfg.Server.MaxConcurrentStreams},
	}
	if tc := g.tlsConfigs(); tc != nil {
		g.proxySrv.TLSConfig = tc.serverTLS()
	}
	g.adminSrv = &http.Server{
		Handler:           adminGuard(g.cfg, adminHandler(g.console, proxy.AdminHandler(g.reg, g.ready))),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          errLog,
	}
	return nil
}

// ready is /readyz: not while shutting down (the proxy port refuses new connections then, and
// a load balancer still probing must stop sending them here), not while the clock is off by
// more than store.dynamodb.clock.max_offset, and as the store says.
func (g *gateway) ready(ctx context.Context) error {
	if g.draining.Load() {
		return errors.New("shutting down")
	}
	if g.clock != nil {
		if err := g.clock.monitor.Ready(); err != nil {
			return err
		}
	}
	return g.st.Ready(ctx)
}
