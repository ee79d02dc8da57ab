package policy

import "time"

// TelemetryConfig is the telemetry block: OpenTelemetry traces and metrics over OTLP. Without
// otlp.endpoint nothing is exported and the request path runs no telemetry code.
type TelemetryConfig struct {
	OTLP    OTLPConfig             `yaml:"otlp"`
	Traces  TracesConfig           `yaml:"traces"`
	Metrics TelemetryMetricsConfig `yaml:"metrics"`
}

// OTLPConfig is where telemetry goes. The standard OTEL_EXPORTER_OTLP_* variables (headers,
// certificate, client certificate, compression, timeout) apply as the OpenTelemetry exporters
// read them; the endpoint and protocol written here win over OTEL_EXPORTER_OTLP_ENDPOINT and
// OTEL_EXPORTER_OTLP_PROTOCOL.
type OTLPConfig struct {
	// Endpoint is the OTLP receiver (a collector): host:port, or an http:// or https:// URL.
	// Setting it turns telemetry on. With http/protobuf a URL without a path gets the
	// standard /v1/traces and /v1/metrics. (Optional) default "": off.
	Endpoint string `yaml:"endpoint"`
	// Protocol is grpc or http/protobuf. (Optional) default grpc.
	Protocol string `yaml:"protocol"`
	// Insecure sends in clear text (no TLS) to a host:port endpoint; an http:// URL is clear
	// text anyway, and an https:// URL cannot be. (Optional) default false: TLS.
	Insecure bool `yaml:"insecure"`
}

// TracesConfig is how requests are traced.
type TracesConfig struct {
	// SampleRatio is the share of new traces recorded, from 0 to 1. A request that arrives
	// with a traceparent from a trusted peer (trusted_proxies) follows its parent's decision
	// instead. (Optional) default 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
}

// TelemetryMetricsConfig is whether metrics go over OTLP too.
type TelemetryMetricsConfig struct {
	// OTLP exports the series of /metrics over OTLP as well (/metrics keeps answering).
	// (Optional) default false.
	OTLP bool `yaml:"otlp"`
	// Interval is how often they are exported. (Optional) default 60s.
	Interval time.Duration `yaml:"interval"`
}

// Enabled reports whether telemetry is on: an endpoint is set.
func (t *TelemetryConfig) Enabled() bool { return t.OTLP.Endpoint != "" }

// Ratio is the sample ratio in force: SampleRatio, or DefaultSampleRatio when unset.
func (t *TracesConfig) Ratio() float64 {
	if t.SampleRatio == nil {
		return DefaultSampleRatio
	}
	return *t.SampleRatio
}

// Every is the metrics' export interval in force: Interval, or DefaultMetricsInterval when 0.
func (m *TelemetryMetricsConfig) Every() time.Duration {
	if m.Interval == 0 {
		return DefaultMetricsInterval
	}
	return m.Interval
}
