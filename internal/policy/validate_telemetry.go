package policy

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Bounds of telemetry.metrics.interval: shorter exports cost the collector more than they
// tell; a day is as long as an export may wait.
const (
	minMetricsInterval = time.Second
	maxMetricsInterval = 24 * time.Hour
)

// checkTelemetry checks the telemetry block: an endpoint a host:port or an http(s) URL, a known
// protocol, a ratio from 0 to 1, and no setting that needs an endpoint without one.
func checkTelemetry(es *Errors, t *TelemetryConfig) {
	o := &t.OTLP
	switch o.Protocol {
	case "", "grpc", "http/protobuf":
	default:
		es.add("telemetry.otlp.protocol", o.Protocol, "must be grpc or http/protobuf")
	}
	if o.Endpoint != "" {
		if err := checkOTLPEndpoint(o.Endpoint, o.Insecure); err != "" {
			es.add("telemetry.otlp.endpoint", redactedEndpoint(o.Endpoint), err)
		}
	}
	if r := t.Traces.SampleRatio; r != nil && !(*r >= 0 && *r <= 1) {
		es.add("telemetry.traces.sample_ratio", strconv.FormatFloat(*r, 'g', -1, 64), "must be from 0 to 1")
	}
	if d := t.Metrics.Interval; d != 0 && (d < minMetricsInterval || d > maxMetricsInterval) {
		es.add("telemetry.metrics.interval", d.String(), "must be from 1s to 24h")
	}
	if o.Endpoint == "" {
		switch {
		case t.Metrics.OTLP:
			es.add("telemetry.metrics.otlp", "true", "needs telemetry.otlp.endpoint")
		case o.Insecure:
			es.add("telemetry.otlp.insecure", "true", "needs telemetry.otlp.endpoint")
		}
	}
}

// checkOTLPEndpoint returns what is wrong with an endpoint, or "".
func checkOTLPEndpoint(e string, insecure bool) string {
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		switch {
		case err != nil:
			return "must be host:port or an http:// or https:// URL"
		case u.Scheme != "http" && u.Scheme != "https":
			return "scheme must be http or https"
		case u.Host == "" || u.Port() == "" && strings.HasSuffix(u.Host, ":"):
			return "must name a host"
		case u.User != nil:
			return "must not hold credentials (send them in OTEL_EXPORTER_OTLP_HEADERS)"
		case u.RawQuery != "" || u.Fragment != "":
			return "must not have a query or fragment"
		case u.Scheme == "https" && insecure:
			return "is https, but telemetry.otlp.insecure is true"
		}
		return ""
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil || host == "" {
		return "must be host:port or an http:// or https:// URL"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "port must be from 1 to 65535"
	}
	return ""
}

// redactedEndpoint is an endpoint as an error quotes it: a URL's password hidden.
func redactedEndpoint(e string) string {
	if u, err := url.Parse(e); err == nil && u.User != nil {
		return u.Redacted()
	}
	return e
}
