package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
)

// staticUpstream answers 200 without a network.
type staticUpstream struct{}

func (staticUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// discardExporter drops finished spans: the benchmark measures the gateway and the SDK, not a
// collector.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

const benchConfig = `upstream: http://upstream.invalid
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1000/s, burst: 1000}
  - {name: per-key, key: api_key, algorithm: token_bucket, rate: 100/s, burst: 100}
`

// BenchmarkHandlerTelemetry is an admitted request through the proxy handler as the gateway
// builds it: off (no telemetry block: the handler alone, as before telemetry existed), on with
// a sample ratio of 0 (a span context made, propagated upstream and dropped) and on with 1
// (every request recorded: request span, decision attributes, store span, batch export to a
// discarding exporter).
func BenchmarkHandlerTelemetry(b *testing.B) {
	cfg, err := policy.Parse([]byte(benchConfig), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		b.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		ratio float64 // < 0: off
	}{{"off", -1}, {"unsampled", 0}, {"sampled", 1}} {
		b.Run(c.name, func(b *testing.B) {
			o := proxy.Options{
				Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
				Policies:  func() proxy.Policies { return set },
				Limiter:   okStore{},
				Transport: staticUpstream{},
			}
			var tel *Telemetry
			if c.ratio >= 0 {
				ratio := c.ratio
				tel, err = New(context.Background(), policy.TelemetryConfig{OTLP: policy.OTLPConfig{Endpoint: "127.0.0.1:4317"},
					Traces: policy.TracesConfig{SampleRatio: &ratio}},
					Options{Pseudonyms: policy.NewPseudonyms(nil), SpanExporter: discardExporter{}})
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = tel.Shutdown(context.Background()) }()
				o.Limiter, o.Tracer = tel.Store(okStore{}, "memory"), tel.Decisions()
			}
			p, err := proxy.New(o)
			if err != nil {
				b.Fatal(err)
			}
			var h http.Handler = p
			if tel != nil {
				h = tel.Handler(p, set.Trusted)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest(http.MethodGet, "http://proxy.local/v1/items", nil)
				req.RemoteAddr = "192.0.2.1:1234"
				req.Header.Set("X-Api-Key", "bench-key")
				for pb.Next() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusOK {
						b.Fatalf("status = %d, want 200", rec.Code)
					}
				}
			})
		})
	}
}
