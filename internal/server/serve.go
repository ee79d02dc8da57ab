package server

import (
	"context"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
)

// running is what serve started and drain stops.
type running struct {
	errc      chan error    // a listener that failed
	stopWatch func()        // ends the reload watcher
	watchDone chan struct{} // closed when it has ended
}

// serve starts the listeners, the console's sync and the reload watcher (SIGHUP and file
// changes), then logs that the gateway serves and calls Options.Ready.
func (g *gateway) serve(ctx context.Context, hup <-chan os.Signal) *running {
	// Watching before serving (and so before /readyz or the log says ready): a change made once
	// the gateway serves is never missed.
	watcher, err := g.rl.StartWatch()
	if err != nil {
		g.log.Error("config watcher not started; SIGHUP still reloads", zap.Error(err))
	}
	r := &running{errc: make(chan error, 3), watchDone: make(chan struct{})}
	if g.proxyL != nil {
		go func() { r.errc <- serve(g.proxySrv, g.proxyL) }()
	}
	go func() { r.errc <- serve(g.adminSrv, g.adminL) }()
	if g.rls != nil {
		go func() { r.errc <- g.rls.serve() }()
	}
	consoleCtx, stopConsole := context.WithCancel(ctx)
	g.onClose(stopConsole)
	go runConsole(consoleCtx, g.console)

	watchCtx, stopWatch := context.WithCancel(ctx)
	r.stopWatch = stopWatch
	g.onClose(stopWatch)
	go func() {
		defer close(r.watchDone)
		if watcher != nil {
			watcher.Run(watchCtx, hup)
			return
		}
		for {
			select {
			case <-watchCtx.Done():
				return
			case <-hup:
				_ = g.rl.Reload()
			}
		}
	}()

	g.logServing()
	if g.o.Ready != nil {
		var proxyAddr net.Addr
		if g.proxyL != nil {
			proxyAddr = g.proxyL.Addr()
		}
		g.o.Ready(proxyAddr, g.adminL.Addr())
	}
	return r
}

// logServing writes the line that says the gateway serves, and what.
func (g *gateway) logServing() {
	set := g.rl.Set()
	fields := []zap.Field{zap.String("admin_listen", g.adminL.Addr().String())}
	if g.proxyL != nil {
		fields = append(fields, zap.String("listen", g.proxyL.Addr().String()), zap.String("upstream", g.upstream.Redacted()),
			zap.Int("policies", len(set.Policies())))
	}
	if g.rls != nil {
		fields = append(fields, zap.String("rls_listen", g.rls.l.Addr().String()), zap.Int("rls_rules", set.RLS().Len()),
			zap.Strings("rls_domains", set.RLS().Domains()))
	}
	fields = append(fields,
		zap.String("store", g.cfg.Store.Backend),
		zap.Bool("tls", g.cfg.TLS != nil),
		zap.Int("gogc", g.gcPercent),
		zap.Int64("memory_limit_bytes", g.memLimit))
	g.log.Info("ratelimit-proxy serving", fields...)
}

// drain waits until ctx ends or a listener fails, then shuts down: lame duck for
// server.shutdown_delay, the proxy and the rate limit service drained within
// server.drain_timeout, the store's leases given back, the admin listener last (it answers
// /metrics and /readyz meanwhile). It returns the listener's error, if one failed.
func (g *gateway) drain(ctx context.Context, r *running) error {
	defer g.close()
	runErr := g.lameDuck(ctx, r)
	g.draining.Store(true)
	r.stopWatch()
	<-r.watchDone

	drainCtx, cancel := context.WithTimeout(context.Background(), g.cfg.Server.DrainTimeout)
	defer cancel()
	rlsDrained := make(chan struct{})
	go func() {
		defer close(rlsDrained)
		if g.rls != nil {
			g.rls.drain(drainCtx)
		}
	}()
	if err := g.proxySrv.Shutdown(drainCtx); err != nil {
		g.log.Warn("drain timeout reached; closing remaining connections", zap.Error(err))
		_ = g.proxySrv.Close()
	}
	<-rlsDrained
	// Leased capacity this replica did not spend goes back to the shared pool, so the other
	// replicas can use it at once rather than after the leases' TTL.
	if err := g.closeStore(); err != nil {
		g.log.Warn("giving leased capacity back", zap.Error(err))
	}
	_ = g.adminSrv.Shutdown(drainCtx)
	g.log.Info("stopped")
	return runErr
}

// lameDuck waits for the end of ctx or a listener's failure. After ctx ends, /readyz answers
// 503 while the proxy still serves for server.shutdown_delay, so that whoever routes to this
// replica stops before its listener closes and refuses connections.
func (g *gateway) lameDuck(ctx context.Context, r *running) error {
	select {
	case err := <-r.errc:
		g.log.Error("listener failed", zap.Error(err))
		return err
	case <-ctx.Done():
	}
	g.draining.Store(true)
	if g.rls != nil {
		g.rls.notServing() // the gRPC health service says so, as /readyz does
	}
	if d := g.cfg.Server.ShutdownDelay; d > 0 {
		g.log.Info("shutting down: /readyz answers 503; still serving for server.shutdown_delay", zap.Duration("shutdown_delay", d))
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case err := <-r.errc:
			g.log.Error("listener failed", zap.Error(err))
			return err
		}
	}
	g.log.Info("shutting down: draining in-flight requests", zap.Duration("drain_timeout", g.cfg.Server.DrainTimeout))
	return nil
}
