package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestValidateTelemetry(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"off", "", nil},
		{"grpc host:port", "telemetry: {otlp: {endpoint: 'collector:4317', insecure: true}}", nil},
		{"http url", "telemetry: {otlp: {endpoint: 'http://collector:4318', protocol: http/protobuf}, traces: {sample_ratio: 0.25}, metrics: {otlp: true, interval: 10s}}", nil},
		{"ratio zero", "telemetry: {otlp: {endpoint: 'collector:4317'}, traces: {sample_ratio: 0}}", nil},
		{"bad protocol", "telemetry: {otlp: {endpoint: 'collector:4317', protocol: http}}",
			[]string{`telemetry.otlp.protocol: "http": must be grpc or http/protobuf`}},
		{"no port", "telemetry: {otlp: {endpoint: collector}}",
			[]string{`telemetry.otlp.endpoint: "collector": must be host:port or an http:// or https:// URL`}},
		{"bad port", "telemetry: {otlp: {endpoint: 'collector:99999'}}",
			[]string{`telemetry.otlp.endpoint: "collector:99999": port must be from 1 to 65535`}},
		{"bad scheme", "telemetry: {otlp: {endpoint: 'grpc://collector:4317'}}",
			[]string{`telemetry.otlp.endpoint: "grpc://collector:4317": scheme must be http or https`}},
		{"credentials", "telemetry: {otlp: {endpoint: 'https://u:hunter2@collector:4318'}}",
			[]string{`telemetry.otlp.endpoint: "https://u:xxxxx@collector:4318": must not hold credentials`}},
		{"https insecure", "telemetry: {otlp: {endpoint: 'https://collector:4318', insecure: true}}",
			[]string{`telemetry.otlp.endpoint: "https://collector:4318": is https, but telemetry.otlp.insecure is true`}},
		{"ratio past 1", "telemetry: {otlp: {endpoint: 'collector:4317'}, traces: {sample_ratio: 1.5}}",
			[]string{`telemetry.traces.sample_ratio: "1.5": must be from 0 to 1`}},
		{"ratio negative", "telemetry: {otlp: {endpoint: 'collector:4317'}, traces: {sample_ratio: -0.1}}",
			[]string{`telemetry.traces.sample_ratio: "-0.1": must be from 0 to 1`}},
		{"interval short", "telemetry: {otlp: {endpoint: 'collector:4317'}, metrics: {otlp: true, interval: 10ms}}",
			[]string{`telemetry.metrics.interval: "10ms": must be from 1s to 24h`}},
		{"metrics without endpoint", "telemetry: {metrics: {otlp: true}}",
			[]string{`telemetry.metrics.otlp: "true": needs telemetry.otlp.endpoint`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustParse(t, minimal+tc.yaml+"\n", noEnv)
			got := errorLines(t, cfg.Validate(noEnv))
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("got %q, want it to start with %q", got[i], w)
				}
			}
			if strings.Contains(strings.Join(got, "\n"), "hunter2") {
				t.Errorf("an endpoint's password is quoted: %q", got)
			}
		})
	}
}

// TestTelemetryDefaultsAndEnv: without the block telemetry is off with its documented
// defaults, and every field takes its RATELIMIT_TELEMETRY_* variable, the ratio included.
func TestTelemetryDefaultsAndEnv(t *testing.T) {
	cfg := mustParse(t, minimal, noEnv)
	if cfg.Telemetry.Enabled() || cfg.Telemetry.Traces.Ratio() != 1 || cfg.Telemetry.Metrics.Every() != time.Minute {
		t.Errorf("defaults: got %+v", cfg.Telemetry)
	}
	cfg = mustParse(t, minimal, env(
		"RATELIMIT_TELEMETRY_OTLP_ENDPOINT", "http://127.0.0.1:4318",
		"RATELIMIT_TELEMETRY_OTLP_PROTOCOL", "http/protobuf",
		"RATELIMIT_TELEMETRY_OTLP_INSECURE", "true",
		"RATELIMIT_TELEMETRY_TRACES_SAMPLE_RATIO", "0.5",
		"RATELIMIT_TELEMETRY_METRICS_OTLP", "true",
		"RATELIMIT_TELEMETRY_METRICS_INTERVAL", "5s",
	))
	tc := cfg.Telemetry
	if !tc.Enabled() || tc.OTLP.Protocol != "http/protobuf" || !tc.OTLP.Insecure || tc.Traces.Ratio() != 0.5 ||
		!tc.Metrics.OTLP || tc.Metrics.Every() != 5*time.Second {
		t.Errorf("from the environment: got %+v (ratio %v)", tc, tc.Traces.Ratio())
	}
	_, err := Parse([]byte(minimal), LoadOptions{Getenv: env("RATELIMIT_TELEMETRY_TRACES_SAMPLE_RATIO", "half")})
	if got := errorLines(t, err); !slices.ContainsFunc(got, func(l string) bool {
		return strings.HasPrefix(l, `RATELIMIT_TELEMETRY_TRACES_SAMPLE_RATIO: "half": must be a number`)
	}) {
		t.Errorf("a ratio that is no number: got %q", got)
	}
}
