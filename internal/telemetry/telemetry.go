// Package telemetry exports the gateway's traces, and on request its metrics, over OTLP.
//
// It owns the OpenTelemetry SDK: the tracer provider (a parent-based ratio sampler, a batch
// span processor, an OTLP exporter over gRPC or HTTP/protobuf), and the meter provider that
// bridges the Prometheus registry of /metrics when telemetry.metrics.otlp asks for it. The
// request path reaches it through small seams: an http.Handler wrapper (one server span per
// request, W3C trace context believed only from trusted peers), the proxy's decision hook
// (Decisions), a bucket.Store wrapper (one child span per store call) and a gRPC interceptor
// for Envoy's rate limit service. Without telemetry.otlp.endpoint nothing here is built: the
// gateway's request path then runs none of it.
//
// No span carries a raw key, token or client address: keys appear as the log's pseudonyms,
// and request spans name no path, query or header.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promBridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// ScopeName names the instrumentation scope of every span the gateway makes.
const ScopeName = "github.com/ratelimit-proxy/ratelimit-proxy"

// ServiceName is the default service.name of the exported resource (OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES replace it).
const ServiceName = "ratelimit-proxy"

// Options are New's inputs besides the configuration.
type Options struct {
	// Registry is the registry of /metrics, exported over OTLP with telemetry.metrics.otlp.
	Registry prometheus.Gatherer
	// Pseudonyms turn key values into the ratelimit.key attribute. (Required)
	Pseudonyms *policy.Pseudonyms
	// Logger receives export errors. nil: none.
	Logger *zap.Logger
	// SpanExporter replaces the OTLP exporter (benchmarks). nil: OTLP as configured.
	SpanExporter sdktrace.SpanExporter
}

// Telemetry is the running SDK. Its methods are safe for concurrent use.
type Telemetry struct {
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider // nil without telemetry.metrics.otlp
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	ps     *policy.Pseudonyms
}

// New starts exporting as cfg says. cfg must be enabled (Enabled) and validated. Shutdown
// flushes and stops it.
func New(ctx context.Context, cfg policy.TelemetryConfig, o Options) (*Telemetry, error) {
	if !cfg.Enabled() {
		return nil, errors.New("telemetry: no endpoint")
	}
	if o.Pseudonyms == nil {
		return nil, errors.New("telemetry: pseudonyms are required")
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	// Export failures reach the gateway's log (the SDK's default is the standard logger).
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		if ce := log.Check(zap.WarnLevel, "telemetry export failed"); ce != nil {
			ce.Write(zap.Error(err))
		}
	}))
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(ServiceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: later detectors win
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	exp := o.SpanExporter
	if exp == nil {
		if exp, err = spanExporter(ctx, cfg.OTLP); err != nil {
			return nil, err
		}
	}
	t := &Telemetry{
		tp: sdktrace.NewTracerProvider(
			sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.Traces.Ratio()))),
			sdktrace.WithBatcher(exp), // OTEL_BSP_* apply
		),
		prop: propagation.TraceContext{},
		ps:   o.Pseudonyms,
	}
	t.tracer = t.tp.Tracer(ScopeName)
	if cfg.Metrics.OTLP {
		mexp, err := metricExporter(ctx, cfg.OTLP)
		if err != nil {
			_ = t.tp.Shutdown(ctx)
			return nil, err
		}
		gatherer := o.Registry
		if gatherer == nil {
			gatherer = prometheus.DefaultGatherer
		}
		reader := sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(cfg.Metrics.Every()),
			sdkmetric.WithProducer(promBridge.NewMetricProducer(promBridge.WithGatherer(gatherer))))
		t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(reader))
	}
	return t, nil
}

// Shutdown exports what is left and stops, within ctx.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	err := t.tp.Shutdown(ctx)
	if t.mp != nil {
		err = errors.Join(err, t.mp.Shutdown(ctx))
	}
	return err
}

// Tracer is the gateway's tracer.
func (t *Telemetry) Tracer() trace.Tracer { return t.tracer }

// target is where an exporter sends: an endpoint's parts as the exporters' options take them.
type target struct {
	url      string // a URL endpoint, its path the base of /v1/traces and /v1/metrics
	hostPort string // else host:port
	insecure bool
}

func targetOf(o policy.OTLPConfig) (target, error) {
	if !strings.Contains(o.Endpoint, "://") {
		return target{hostPort: o.Endpoint, insecure: o.Insecure}, nil
	}
	u, err := url.Parse(o.Endpoint)
	if err != nil {
		return target{}, fmt.Errorf("telemetry.otlp.endpoint: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return target{url: u.String(), insecure: u.Scheme == "http"}, nil
}

// signalURL is t's URL for one signal over HTTP: its path with /v1/traces or /v1/metrics.
func (t target) signalURL(signal string) string { return t.url + "/v1/" + signal }

func spanExporter(ctx context.Context, o policy.OTLPConfig) (sdktrace.SpanExporter, error) {
	t, err := targetOf(o)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if o.Protocol == "http/protobuf" {
		opts := []otlptracehttp.Option{}
		switch {
		case t.url != "":
			opts = append(opts, otlptracehttp.WithEndpointURL(t.signalURL("traces")))
		default:
			opts = append(opts, otlptracehttp.WithEndpoint(t.hostPort))
			if t.insecure {
				opts = append(opts, otlptracehttp.WithInsecure())
			}
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	} else {
		opts := []otlptracegrpc.Option{}
		switch {
		case t.url != "":
			opts = append(opts, otlptracegrpc.WithEndpointURL(t.url))
		default:
			opts = append(opts, otlptracegrpc.WithEndpoint(t.hostPort))
			if t.insecure {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: trace exporter: %w", err)
	}
	return exp, nil
}

func metricExporter(ctx context.Context, o policy.OTLPConfig) (sdkmetric.Exporter, error) {
	t, err := targetOf(o)
	if err != nil {
		return nil, err
	}
	var exp sdkmetric.Exporter
	if o.Protocol == "http/protobuf" {
		opts := []otlpmetrichttp.Option{}
		switch {
		case t.url != "":
			opts = append(opts, otlpmetrichttp.WithEndpointURL(t.signalURL("metrics")))
		default:
			opts = append(opts, otlpmetrichttp.WithEndpoint(t.hostPort))
			if t.insecure {
				opts = append(opts, otlpmetrichttp.WithInsecure())
			}
		}
		exp, err = otlpmetrichttp.New(ctx, opts...)
	} else {
		opts := []otlpmetricgrpc.Option{}
		switch {
		case t.url != "":
			opts = append(opts, otlpmetricgrpc.WithEndpointURL(t.url))
		default:
			opts = append(opts, otlpmetricgrpc.WithEndpoint(t.hostPort))
			if t.insecure {
				opts = append(opts, otlpmetricgrpc.WithInsecure())
			}
		}
		exp, err = otlpmetricgrpc.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: metric exporter: %w", err)
	}
	return exp, nil
}

// ShutdownTimeout is how long the gateway gives Shutdown for the final export.
const ShutdownTimeout = 5 * time.Second
