package server

import (
	"context"
	"net/http"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/fallback"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// TestTelemetryOffBuildsNothing: without telemetry.otlp.endpoint the request path is what it
// was without telemetry: the proxy handler unwrapped, the store itself, no decision hook, no
// interceptor on the rate limit service.
func TestTelemetryOffBuildsNothing(t *testing.T) {
	g := &gateway{cfg: &policy.Config{}, st: &fallback.Store{}}
	if err := g.buildTelemetry(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := http.NotFoundHandler()
	if g.tel != nil || g.tracer() != nil || g.rlsInterceptor() != nil || g.limiter() != g.st {
		t.Errorf("telemetry off: tel %v, tracer %v, interceptor set %t, limiter wrapped %t",
			g.tel, g.tracer(), g.rlsInterceptor() != nil, g.limiter() != g.st)
	}
	if _, wrapped := g.traced(h).(http.HandlerFunc); !wrapped {
		t.Error("telemetry off: the proxy handler is wrapped")
	}
}
