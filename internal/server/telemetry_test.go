package server

import (
	"context"
	"net/http"
	"slices"
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

// TestTelemetryNeedsRestart: a reload that changes the telemetry block says that it needs a
// restart (the exporters are built once); one that leaves it alone does not.
func TestTelemetryNeedsRestart(t *testing.T) {
	half, other := 0.5, 0.5
	old := &policy.Config{Telemetry: policy.TelemetryConfig{OTLP: policy.OTLPConfig{Endpoint: "collector:4317"},
		Traces: policy.TracesConfig{SampleRatio: &half}}}
	same := &policy.Config{Telemetry: policy.TelemetryConfig{OTLP: policy.OTLPConfig{Endpoint: "collector:4317"},
		Traces: policy.TracesConfig{SampleRatio: &other}}}
	if got := restartOnly(old, same); len(got) != 0 {
		t.Errorf("same telemetry block: restart for %v", got)
	}
	moved := &policy.Config{Telemetry: policy.TelemetryConfig{OTLP: policy.OTLPConfig{Endpoint: "collector2:4317"}}}
	if got := restartOnly(old, moved); !slices.Contains(got, "telemetry") {
		t.Errorf("a new endpoint: restart for %v, want telemetry", got)
	}
}
