// Package server wires the gateway together.
//
// It wires the gateway together: it loads the configuration, builds the store, the
// proxy handler and the admin handler, serves both listeners, reloads policies on change and
// drains in-flight requests on shutdown. It is the only place that knows every other package.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
)

// Options configure Run.
type Options struct {
	// ConfigPath is the YAML file. (Required)
	ConfigPath string
	// Getenv reads RATELIMIT_* overrides and JWT secrets. nil means os.Getenv.
	Getenv func(string) string
	// Log receives the JSON log lines. nil means os.Stderr.
	Log io.Writer
	// Now is the host's clock as the gateway reads it: every instant it decides with (the
	// proxy's decisions, the store's leases and slot renewals, JWT expiry) comes from it.
	// (Optional) default time.Now; test harnesses shift it to run replicas whose clocks
	// disagree (internal/testkit/gateway).
	Now func() time.Time
	// Ready, when set, is called once both listeners accept connections, with their addresses.
	Ready func(proxyAddr, adminAddr net.Addr)
	// Hooks are test seams. (Optional) the shipped binary sets none.
	Hooks Hooks
}

// Hooks let a test harness replace parts of the gateway as Run builds them, in the manner of
// httputil.ReverseProxy's func fields: a nil field leaves its part as built. The self-test's
// mutants and fault injectors reach the gateway through them (internal/testkit/gateway), so
// the shipped binary holds no test code and reads no test variable.
type Hooks struct {
	// DynamoDB wraps the DynamoDB client the shared store writes through.
	DynamoDB func(dynamo.API) dynamo.API
	// Store wraps the shared store (DynamoDB) before the fallback and the front ends see it.
	Store func(bucket.Store) bucket.Store
}

func (h Hooks) dynamoDB(api dynamo.API) dynamo.API {
	if h.DynamoDB == nil {
		return api
	}
	return h.DynamoDB(api)
}

func (h Hooks) store(s bucket.Store) bucket.Store {
	if h.Store == nil {
		return s
	}
	return h.Store(s)
}

// Run serves the gateway until ctx ends, then drains in-flight requests (bounded by
// server.drain_timeout) and returns nil. A config that does not validate is an error before any
// listener opens.
func Run(ctx context.Context, o Options) error {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	// SIGHUP is caught from the start: its default action would kill a gateway that is still
	// starting (building the DynamoDB store may take a minute with create_table). One that
	// arrives before the watcher runs waits in the channel and reloads then.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	gcPercent := tuneGC(o.Getenv)
	memLimit := tuneMemoryLimit(o.Getenv, cgroupMemoryMax)
	reg := proxy.NewRegistry()
	// A provisional logger reports load errors; the configured level applies once the file is read.
	log := newLogger(o.Log, zapcore.InfoLevel)
	rl, cfg, err := NewReloader(o.ConfigPath,
		policy.LoadOptions{Getenv: o.Getenv},
		policy.CompileOptions{Getenv: o.Getenv, Now: o.Now},
		log, reg)
	if err != nil {
		return err
	}
	if lvl, err := zapcore.ParseLevel(cfg.Log.Level); err == nil {
		log = newLogger(o.Log, lvl)
		rl.log = log
	}
	defer func() { _ = log.Sync() }()

	st, closeStore, now, clock, err := newStore(ctx, cfg, rl, reg, log, o.Now, o.Hooks)
	if err != nil {
		if stopped(ctx, err) {
			log.Info("shut down before serving")
			return nil
		}
		return err
	}
	if clock != nil {
		defer clock.stop() // whichever way Run returns
	}
	// Without upstream the gateway serves Envoy's rate limit service alone (validation
	// guarantees the rls block then): no proxy handler, no proxy listener.
	proxyOn := cfg.Upstream != ""
	upstream, err := url.Parse(cfg.Upstream)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	// on_error local never reaches the proxy as an error: the fallback store decides locally.
	upProto, err := proxy.ParseProtocol(cfg.UpstreamProtocol)
	if err != nil {
		return err
	}
	onError := proxy.Allow
	if cfg.Store.OnError == "deny" {
		onError = proxy.Deny
	}
	pseudonyms, err := policy.LogPseudonyms(cfg, o.Getenv)
	if err != nil {
		return err // validated already; only an environment changed since then gets here
	}
	routeGRPCLog(log, pseudonyms, o.Getenv) // grpclog.go: before any gRPC server or client
	// The operators' console, fed by whichever front ends serve: the proxy, the rate limit
	// service, or both.
	console, err := newConsole(cfg, rl, st, pseudonyms, log, reg, now, o.Getenv)
	if err != nil {
		return err
	}
	var handler http.Handler
	if proxyOn {
		for _, w := range policy.Warnings(cfg) {
			log.Warn("configuration: " + w)
		}
		prot, err := newProtection(cfg.Protect, reg) // protect.go
		if err != nil {
			return fmt.Errorf("protect: %w", err)
		}
		h, err := proxy.New(proxy.Options{
			Protect:             prot,
			Upstream:            upstream,
			Policies:            rl.Current,
			Limiter:             st,
			Backend:             cfg.Store.Backend,
			OnError:             onError,
			StoreTimeout:        cfg.Store.Timeout,
			UpstreamTimeout:     cfg.UpstreamTimeout,
			GRPCUpstreamTimeout: cfg.GRPCUpstreamTimeout,
			UpstreamProtocol:    upProto,
			UpgradeProtocols:    upgradeProtocols(cfg),
			GRPCRoutes:          grpcRoutes(cfg, upProto),
			GRPCIdleTimeout:     cfg.Server.GRPCIdleTimeout,
			WriteStallTimeout:   cfg.Server.WriteStallTimeout,
			Logger:              log,
			AccessLog:           cfg.Log.Access,
			Pseudonyms:          pseudonyms,
			Metrics:             proxy.NewMetrics(reg),
			Now:                 now, // nil: time.Now, and the store timer's start doubles as the instant
			Console:             console,
		})
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		handler = h
	}

	if ctx.Err() != nil { // stopped while the store was being built
		log.Info("shut down before serving")
		return nil
	}
	lc := net.ListenConfig{}
	var pl net.Listener // nil without a proxy
	if proxyOn {
		pl, err = lc.Listen(ctx, "tcp", cfg.Listen)
		if err != nil {
			if stopped(ctx, err) {
				log.Info("shut down before serving")
				return nil
			}
			return fmt.Errorf("listen: %w", err)
		}
	}
	closeListeners := func(ls ...net.Listener) {
		for _, l := range ls {
			if l != nil {
				_ = l.Close()
			}
		}
	}
	al, err := lc.Listen(ctx, "tcp", cfg.AdminListen)
	if err != nil {
		closeListeners(pl)
		return fmt.Errorf("admin_listen: %w", err)
	}
	var tc *tlsConfigs
	if cfg.TLS != nil {
		tc = &tlsConfigs{material: func() *policy.TLSMaterial { return rl.Set().TLS() }}
	}
	var rlsSrv *rlsServer
	if cfg.RLS != nil {
		var rlsTLS *tls.Config
		if tc != nil {
			rlsTLS = tc.serverTLS() // the tls block's certificate, rotated on reload like the proxy's
		}
		rlsSrv, err = newRLS(ctx, cfg, rl, st, reg, log, now, rlsTLS, console)
		if err != nil {
			closeListeners(pl, al)
			return err
		}
	}
	conns, err := newConnTracker(reg)
	if err != nil {
		closeListeners(pl, al)
		if rlsSrv != nil {
			rlsSrv.srv.Stop()
		}
		return fmt.Errorf("register connection metrics: %w", err)
	}
	errLog, _ := zap.NewStdLogAt(log.Named("http"), zapcore.WarnLevel)
	// net/http's own lines (connection, HTTP/2 and TLS handshake errors) name the client's
	// address: they reach the log with pseudonyms instead.
	errLog = proxy.ScrubLog(errLog, pseudonyms)
	proxySrv := &http.Server{
		Handler:           conns.wrap(handler),
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
	// Once shutdown begins the proxy port refuses new connections: /readyz says so, so that a
	// load balancer still probing stops sending them here.
	var draining atomic.Bool
	ready := func(ctx context.Context) error {
		if draining.Load() {
			return errors.New("shutting down")
		}
		if clock != nil {
			if err := clock.monitor.Ready(); err != nil {
				return err // store.dynamodb.clock.max_offset
			}
		}
		return st.Ready(ctx)
	}
	adminSrv := &http.Server{
		Handler:           adminGuard(cfg, adminHandler(console, proxy.AdminHandler(reg, ready))),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          errLog,
	}

	if tc != nil {
		proxySrv.TLSConfig = tc.serverTLS()
	}

	// Watching before serving (and so before /readyz or the log says ready): a change made once
	// the gateway serves is never missed.
	watcher, err := rl.StartWatch()
	if err != nil {
		log.Error("config watcher not started; SIGHUP still reloads", zap.Error(err))
	}
	errc := make(chan error, 3)
	if proxyOn {
		go func() { errc <- serve(proxySrv, pl) }()
	}
	go func() { errc <- serve(adminSrv, al) }()
	if rlsSrv != nil {
		go func() { errc <- rlsSrv.serve() }()
	}
	consoleCtx, stopConsole := context.WithCancel(ctx)
	defer stopConsole()
	go runConsole(consoleCtx, console)

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if watcher != nil {
			watcher.Run(watchCtx, hup)
			return
		}
		for {
			select {
			case <-watchCtx.Done():
				return
			case <-hup:
				_ = rl.Reload()
			}
		}
	}()

	fields := []zap.Field{zap.String("admin_listen", al.Addr().String())}
	var proxyAddr net.Addr
	if proxyOn {
		proxyAddr = pl.Addr()
		fields = append(fields, zap.String("listen", proxyAddr.String()), zap.String("upstream", upstream.Redacted()),
			zap.Int("policies", len(rl.Set().Policies())))
	}
	if rlsSrv != nil {
		fields = append(fields, zap.String("rls_listen", rlsSrv.l.Addr().String()), zap.Int("rls_rules", rl.Set().RLS().Len()),
			zap.Strings("rls_domains", rl.Set().RLS().Domains()))
	}
	fields = append(fields,
		zap.String("store", cfg.Store.Backend),
		zap.Bool("tls", cfg.TLS != nil),
		zap.Int("gogc", gcPercent),
		zap.Int64("memory_limit_bytes", memLimit))
	log.Info("ratelimit-proxy serving", fields...)
	if o.Ready != nil {
		o.Ready(proxyAddr, al.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
		draining.Store(true)
		if rlsSrv != nil {
			rlsSrv.notServing() // the gRPC health service says so, as /readyz does
		}
		if d := cfg.Server.ShutdownDelay; d > 0 {
			// Lame duck: /readyz says 503 while the proxy still serves, so that whoever routes
			// to this replica stops before its listener closes and refuses connections.
			log.Info("shutting down: /readyz answers 503; still serving for server.shutdown_delay", zap.Duration("shutdown_delay", d))
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case runErr = <-errc:
				t.Stop()
				log.Error("listener failed", zap.Error(runErr))
			}
		}
		log.Info("shutting down: draining in-flight requests", zap.Duration("drain_timeout", cfg.Server.DrainTimeout))
	case runErr = <-errc:
		log.Error("listener failed", zap.Error(runErr))
	}
	draining.Store(true)
	stopWatch()
	<-watchDone

	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.Server.DrainTimeout)
	defer cancel()
	// The proxy and the rate limit service drain first: the admin port keeps answering
	// /metrics and /readyz while they do.
	rlsDrained := make(chan struct{})
	go func() {
		defer close(rlsDrained)
		if rlsSrv != nil {
			rlsSrv.drain(drainCtx)
		}
	}()
	if err := proxySrv.Shutdown(drainCtx); err != nil {
		log.Warn("drain timeout reached; closing remaining connections", zap.Error(err))
		_ = proxySrv.Close()
	}
	<-rlsDrained
	// Leased capacity this replica did not spend goes back to the shared pool, so the other
	// replicas can use it at once rather than after the leases' TTL.
	closeCtx, cancelClose := context.WithTimeout(context.Background(), closeStoreTimeout)
	if err := closeStore(closeCtx); err != nil {
		log.Warn("giving leased capacity back", zap.Error(err))
	}
	cancelClose()
	_ = adminSrv.Shutdown(drainCtx)
	log.Info("stopped")
	return runErr
}

// closeStoreTimeout bounds giving the store's leases back at shutdown.
const closeStoreTimeout = 5 * time.Second

// defaultGCPercent is the garbage collector target the gateway runs with unless GOGC is set.
// A proxy's live heap is small (a few MiB plus the memory store), so the default of 100 makes it
// collect very often; at 400 the gateway's throughput in the (c) benchmark rose by about a third
// and its CPU per request fell by about a quarter (docs/benchmarks.md), for a heap a few MiB larger.
const defaultGCPercent = 400

// tuneGC applies defaultGCPercent unless the operator chose GOGC, and returns the value in force.
func tuneGC(getenv func(string) string) int {
	if v := getenv("GOGC"); v != "" {
		// The runtime has applied it at start; read it back without changing it.
		cur := debug.SetGCPercent(100)
		debug.SetGCPercent(cur)
		return cur
	}
	debug.SetGCPercent(defaultGCPercent)
	return defaultGCPercent
}

// stopped reports whether err is the cancellation of ctx (SIGTERM or SIGINT while starting):
// a shutdown asked for, not a failure.
func stopped(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, context.Canceled)
}

// memoryLimitShare is the part of the container's memory limit given to the Go runtime as its
// soft limit: the rest is for memory the runtime does not count (stacks of cgo-free threads are
// counted; the binary, page cache of its files and kernel socket buffers are not).
const memoryLimitShare = 0.9

// tuneMemoryLimit sets the Go runtime's soft memory limit to memoryLimitShare of the container's
// cgroup limit when GOMEMLIMIT is unset and such a limit exists, and returns the limit in force
// (math.MaxInt64: none). With GOGC=400 the heap may grow to five times its live size between
// collections (about 490 MiB with a full default memory store of 1M sliding-window keys); the
// soft limit makes the collector run earlier instead of the kernel killing the container.
func tuneMemoryLimit(getenv func(string) string, cgroupMax func() (int64, bool)) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // applied by the runtime at start; read it back unchanged
	}
	if n, ok := cgroupMax(); ok && n > 0 {
		limit := int64(float64(n) * memoryLimitShare)
		debug.SetMemoryLimit(limit) // returns the previous limit
		return limit
	}
	return debug.SetMemoryLimit(-1) // a negative input reads the limit without changing it
}

// cgroupMemoryMax reads the memory limit of this process's cgroup: memory.max (cgroup v2) or
// memory.limit_in_bytes (v1). ok is false when there is none ("max", or v1's huge sentinel) or
// the files cannot be read (not in a container, or not Linux).
func cgroupMemoryMax() (int64, bool) {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		return parseCgroupLimit(string(b))
	}
	return 0, false
}

// parseCgroupLimit parses a cgroup memory limit file's content.
func parseCgroupLimit(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseInt(s, 10, 64)
	// cgroup v1 writes "no limit" as a page-rounded MaxInt64; anything above 1 PiB is no limit.
	if err != nil || n <= 0 || n >= 1<<50 {
		return 0, false
	}
	return n, true
}

// upgradeProtocols are the protocols a request may switch to: upgrade_protocols, whose default
// (websocket) the loader applied; a list written empty allows none.
func upgradeProtocols(cfg *policy.Config) []string {
	if cfg.UpgradeProtocols == nil {
		return []string{}
	}
	return cfg.UpgradeProtocols
}

// grpcRoutes are the paths whose application/grpc requests are gRPC calls: grpc_routes when
// set, else every path (nil) when the upstream speaks HTTP/2, as a gRPC upstream must, and
// none with HTTP/1.1, where no gRPC call could be forwarded anyway.
func grpcRoutes(cfg *policy.Config, p proxy.Protocol) []string {
	switch {
	case len(cfg.GRPCRoutes) > 0:
		return cfg.GRPCRoutes
	case p == proxy.HTTP1:
		return []string{}
	}
	return nil
}

// listenerProtocols are the protocols of the proxy listener. In cleartext: HTTP/1.1, and HTTP/2
// with prior knowledge (h2c), told apart by the connection preface; the `Upgrade: h2c` dance of
// RFC 7540 is not offered (RFC 9113 deprecated it, and gRPC clients never use it). Over TLS:
// HTTP/1.1 and h2, chosen by ALPN.
func listenerProtocols(tls bool) *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	if tls {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	return p
}

// serve serves l until s shuts down, over TLS when s has a TLSConfig (its certificates come from
// GetConfigForClient, so no files are named here).
func serve(s *http.Server, l net.Listener) error {
	var err error
	if s.TLSConfig != nil {
		err = s.ServeTLS(l, "", "")
	} else {
		err = s.Serve(l)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func newLogger(w io.Writer, lvl zapcore.Level) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core)
}
