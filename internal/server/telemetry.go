package server

import (
	"context"
	"net/http"
	"net/netip"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/telemetry"
)

// buildTelemetry starts the OTLP exporters when telemetry.otlp.endpoint is set. Without it
// g.tel stays nil and the request path gets none of the wrappers below.
func (g *gateway) buildTelemetry(ctx context.Context) error {
	if !g.cfg.Telemetry.Enabled() {
		return nil
	}
	t, err := telemetry.New(ctx, g.cfg.Telemetry, telemetry.Options{
		Registry:   g.reg,
		Pseudonyms: g.pseudonyms,
		Logger:     g.log.Named("telemetry"),
	})
	if err != nil {
		return err
	}
	g.tel = t
	g.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), telemetry.ShutdownTimeout)
		defer cancel()
		if err := t.Shutdown(ctx); err != nil {
			g.log.Warn("telemetry: final export failed", zap.Error(err))
		}
	})
	return nil
}

// trusted is the trust decision of the set in force about a direct peer (trusted_proxies):
// whom forwarding headers, and trace context, are believed from.
func (g *gateway) trusted(peer netip.Addr) bool { return g.rl.Set().Trusted(peer) }

// limiter is the store as the front ends call it: with a span per call when tracing.
func (g *gateway) limiter() bucket.Releaser {
	if g.tel == nil {
		return g.st
	}
	return g.tel.Store(g.st, g.cfg.Store.Backend)
}

// tracer is the proxy's decision hook, nil without telemetry.
func (g *gateway) tracer() proxy.Tracer {
	if g.tel == nil {
		return nil
	}
	return g.tel.Decisions()
}

// traced wraps the proxy handler with its request spans when tracing.
func (g *gateway) traced(h http.Handler) http.Handler {
	if g.tel == nil {
		return h
	}
	return g.tel.Handler(h, g.trusted)
}

// rlsInterceptor is the rate limit service's span per call, nil without telemetry.
func (g *gateway) rlsInterceptor() grpc.UnaryServerInterceptor {
	if g.tel == nil {
		return nil
	}
	return g.tel.RLSInterceptor(g.trusted, func() *envoyrules.Rules { return g.rl.Set().RLS() })
}
