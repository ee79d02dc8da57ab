package policy

import (
	"net/http"
	"time"
)

// The defaults of the configuration, all in this file: SetDefaults fills in a block before the
// file is decoded into it, so that a field the file leaves out keeps its default and a field
// it writes (even as 0) keeps what it says and is validated. Optional blocks (identity.jwt,
// store.dynamodb, protect) and policies get theirs when the file (or an environment override)
// creates them: a default must never create a block, which would switch JWT or protection on.

// SetDefaults fills in the documented defaults of the fields that exist whatever the file says.
func (c *Config) SetDefaults() {
	c.Listen = "127.0.0.1:8080"
	c.AdminListen = "127.0.0.1:9090"
	c.UpstreamTimeout = 60 * time.Second
	c.GRPCUpstreamTimeout = 0
	c.UpstreamProtocol = "http1"
	c.UpgradeProtocols = []string{"websocket"}
	c.MethodOverride = MethodOverrideJudge
	c.Identity.APIKeyHeader = "X-Api-Key"
	c.Identity.IPv6Prefix = defaultIPv6Prefix
	c.Headers.Reset = "unix"
	c.Store.Backend = "memory"
	c.Store.OnError = "allow"
	c.Store.Timeout = 50 * time.Millisecond
	c.Store.MaxKeys = 1000000
	c.Server = ServerConfig{
		ReadHeaderTimeout:    10 * time.Second,
		ReadTimeout:          60 * time.Second,
		GRPCIdleTimeout:      5 * time.Minute,
		WriteStallTimeout:    30 * time.Second,
		IdleTimeout:          120 * time.Second,
		DrainTimeout:         30 * time.Second,
		ShutdownDelay:        0,
		MaxHeaderBytes:       65536,
		MaxConcurrentStreams: 250,
	}
	c.Log.Level = "info"
	c.Admin.TopK = 100
	c.Admin.MaxExemptions = 1000
	c.Telemetry.OTLP.Protocol = "grpc"
	c.Telemetry.Metrics.Interval = DefaultMetricsInterval
	// telemetry.traces.sample_ratio stays nil, read through TracesConfig.Ratio: an unset
	// pointer is how a TelemetryConfig built in code (not parsed) asks for the default too.
}

// SetDefaults fills in identity.jwt's defaults.
func (j *JWTConfig) SetDefaults() { j.Claim = defaultClaim }

// SetDefaults fills in a policy's defaults.
func (p *PolicyConfig) SetDefaults() { p.Mode = modeEnforce }

// SetDefaults fills in store.dynamodb's defaults.
func (d *DynamoDBConfig) SetDefaults() {
	d.Mode = dynamoModeRefund
	d.DenyCache = true
	d.SlotLease = defaultSlotLease
	d.Clock = ClockConfig{Correct: true, MaxCorrection: defaultMaxCorrection, WarnOffset: defaultWarnOffset}
}

// SetDefaults fills in store.redis's defaults.
func (r *RedisConfig) SetDefaults() {
	r.Mode = redisSingle
	r.KeyPrefix = "rl:"
}

// SetDefaults fills in the protect block's defaults: `protect: {}` is protection with all of
// them.
func (p *ProtectConfig) SetDefaults() {
	p.Concurrency = ProtectConcurrencyConfig{
		Adaptive: true,
		Limit:    defaultProtectLimit,
		MinLimit: defaultProtectMinLimit,
		MaxLimit: defaultProtectMaxLimit,
	}
	p.Status = defaultProtectStatus
	p.MaxBufferedBody = defaultMaxBufferedBody
	p.StreamShare = defaultStreamShare
}

const (
	defaultClaim      = "sub"
	defaultIPv6Prefix = 64
	modeEnforce       = "enforce"
	modeShadow        = "shadow"

	// store.dynamodb
	defaultSlotLease     = 30 * time.Second
	defaultMaxCorrection = 5 * time.Second
	defaultWarnOffset    = 100 * time.Millisecond

	// protect
	defaultProtectLimit    = 50
	defaultProtectMinLimit = 2
	defaultProtectMaxLimit = 1000
	defaultProtectStatus   = http.StatusServiceUnavailable
	defaultMaxBufferedBody = 64 << 10
	defaultStreamShare     = 0.1
)

// Defaults of the telemetry block, exported for the TelemetryConfig accessors (Ratio, Every)
// that apply them to a config built in code.
const (
	// DefaultSampleRatio is telemetry.traces.sample_ratio's default.
	DefaultSampleRatio = 1.0
	// DefaultMetricsInterval is telemetry.metrics.interval's default.
	DefaultMetricsInterval = 60 * time.Second
)

// The values of store.dynamodb.mode.
const (
	dynamoModeRefund      = "refund"
	dynamoModeTransaction = "transaction"
)
