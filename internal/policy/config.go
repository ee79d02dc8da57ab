package policy

import "time"

// Config is the configuration file, field for field. Field names are the contract with users:
// add fields, never rename them. Every field's doc says (Required) or (Optional) and its default.
type Config struct {
	// Listen is the proxy's address. (Optional) default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// AdminListen serves /metrics, /healthz and /readyz. (Optional) default 127.0.0.1:9090.
	AdminListen string `yaml:"admin_listen"`
	// Upstream is the URL of the guarded service. (Required)
	Upstream string `yaml:"upstream"`
	// UpstreamTimeout bounds the wait for the upstream's response headers after the request was
	// sent; past it the client gets 504. Streams are not cut: it ends when the headers arrive.
	// gRPC calls have grpc_upstream_timeout instead. (Optional) default 60s.
	UpstreamTimeout time.Duration `yaml:"upstream_timeout"`
	// GRPCUpstreamTimeout is the upstream_timeout of gRPC calls (content-type application/grpc,
	// +proto, +json), which upstream_timeout does not bound: a gRPC server may send a stream's
	// headers only with its first message, so a header timer would cut a watch that stays
	// silent. A gRPC call is bounded by its own deadline (grpc-timeout) instead. When set, the
	// call gets DEADLINE_EXCEEDED past it. (Optional) default 0s: no bound but the call's deadline.
	GRPCUpstreamTimeout time.Duration `yaml:"grpc_upstream_timeout"`
	// UpstreamProtocol is the HTTP version spoken to the upstream: http1 (HTTP/1.1), h2c (HTTP/2
	// always: cleartext with prior knowledge to an http:// upstream, h2 negotiated by ALPN to an
	// https:// one) or auto (HTTP/2 when the client's request came in over HTTP/2, else HTTP/1.1).
	// gRPC upstreams need h2c or auto. (Optional) default http1.
	UpstreamProtocol string `yaml:"upstream_protocol"`
	// UpgradeProtocols are the protocols a request may switch the connection to (the Upgrade
	// header; names compared case-insensitively, versions ignored). The request that opens the
	// tunnel is judged like any other; what then travels in it is not, so only protocols that
	// carry one conversation per tunnel belong here, never h2c (refused: a tunnel of HTTP/2
	// streams that no policy would see). Any other protocol is removed from Upgrade before
	// forwarding, and the request goes on as a plain one. (Optional) default [websocket];
	// [] allows none.
	UpgradeProtocols []string `yaml:"upgrade_protocols"`
	// GRPCRoutes are the path prefixes (such as /helloworld.Greeter/) whose requests are gRPC
	// calls when their content-type says application/grpc: answered with gRPC statuses, bounded
	// by grpc_upstream_timeout and server.grpc_idle_timeout instead of upstream_timeout and
	// server.read_timeout. Elsewhere that content-type is an ordinary request's. (Optional)
	// default: every path when upstream_protocol is h2c or auto (a gRPC upstream needs
	// HTTP/2), none with http1.
	GRPCRoutes []string `yaml:"grpc_routes"`
	// TrustedProxies are the CIDRs (or single addresses) whose X-Forwarded-For / Forwarded headers
	// are believed. (Optional) default: none.
	TrustedProxies []string       `yaml:"trusted_proxies"`
	Identity       IdentityConfig `yaml:"identity"`
	Headers        HeadersConfig  `yaml:"headers"`
	Store          StoreConfig    `yaml:"store"`
	Server         ServerConfig   `yaml:"server"`
	// TLS terminates TLS on the proxy listener (HTTP/1.1 and h2 by ALPN). (Optional) default:
	// cleartext HTTP/1.1 and h2c.
	TLS *TLSConfig `yaml:"tls"`
	Log LogConfig  `yaml:"log"`
	// Policies are evaluated in order, coarse to fine. (Required) at least one, unless upstream
	// is empty and rls is set: then there is no proxy, and no policies either.
	Policies []PolicyConfig `yaml:"policies"`

	// MethodOverride says what happens to the method-override headers (X-HTTP-Method-Override,
	// X-HTTP-Method, X-Method-Override), which Express, Laravel, Symfony, Rails and ASP.NET
	// Core can be set to honour, running the handler of the method named there: judge (the
	// request is charged by the policies that match its method and those that match every
	// method the headers name, each policy once) or strip (they are removed before forwarding;
	// only the request's method is judged). (Optional) default judge.
	MethodOverride string `yaml:"method_override"`

	// --- Envoy's rate limit service (docs/envoy.md) ---

	// RLS serves envoy.service.ratelimit.v3.RateLimitService on its own gRPC port, from
	// envoyproxy/ratelimit's configuration files, on the same store. With upstream empty the
	// gateway serves RLS alone. (Optional) default: off.
	RLS *RLSConfig `yaml:"rls"`

	// Protect guards the upstream itself: a concurrency limit (fixed or adaptive) on requests
	// in flight to it, and shedding by priority when it is reached (docs/configuration.md,
	// "Protecting the upstream"). (Optional) default: off.
	Protect *ProtectConfig `yaml:"protect"`
	// Admin configures the operators' console on admin_listen: the /v1/ API, the live page at
	// / and `ratelimit-proxy admin` (docs/operations.md, "The operators' console").
	Admin AdminConfig `yaml:"admin"`
	// Telemetry exports traces, and on request the /metrics series, over OpenTelemetry's
	// OTLP (docs/observability.md). (Optional) default: off.
	Telemetry TelemetryConfig `yaml:"telemetry"`

	// src is where Parse read the file, for placing validation's problems.
	src source
}

// AdminConfig is the admin block: the operators' console.
type AdminConfig struct {
	// TokenEnv names the environment variable holding the bearer token that admin writes
	// (resets, exemptions) need. Without it every write answers 403. The variable's name is
	// who the audit log says wrote. (Optional) default "": writes are off.
	TokenEnv string `yaml:"token_env"`
	// ReadTokenEnv names the environment variable holding the bearer token that admin reads
	// (GET /v1/...) need; the write token is accepted too. (Optional) default "": reads are
	// open like /metrics.
	ReadTokenEnv string `yaml:"read_token_env"`
	// TopK is how many keys the heavy-hitter sketch of each policy tracks: its memory, and its
	// error bound (a count is overstated by at most the requests seen / top_k, plus a sampling
	// error past 1,000 requests a second). (Optional) default 100, from 1 to 10000.
	TopK int `yaml:"top_k"`
	// MaxExemptions bounds the live exemptions (POST /v1/exemptions past it answers 409), on
	// the memory store per replica and on DynamoDB for the whole table (its index item, about
	// 31 bytes an exemption). Expired exemptions do not count. (Optional) default 1000, from 1
	// to 5000.
	MaxExemptions int `yaml:"max_exemptions"`
	// Hosts are the names (or IP literals, without a port) that the admin listener answers
	// besides its own: localhost, loopback addresses, the address a connection arrived on and
	// admin_listen's host. A request whose Host is none of them answers 421, so that a web page
	// re-pointed at the listener by DNS (rebinding) cannot read it. List the names operators
	// and scrapers use: a Service name, a load balancer's. (Optional) default: none.
	Hosts []string `yaml:"hosts"`
}

// RLSConfig is the rls block: Envoy's rate limit service.
type RLSConfig struct {
	// Listen is the gRPC address (HTTP/2 cleartext, or TLS with the tls block's certificate)
	// of ShouldRateLimit and of the standard gRPC health service. (Required)
	Listen string `yaml:"listen"`
	// ConfigDir is a folder of envoyproxy/ratelimit configuration files (*.yaml, *.yml; hidden
	// files and subfolders skipped), watched and reloaded with the config. (Required)
	ConfigDir string `yaml:"config_dir"`
	// ResponseHeaders are the headers answered in response_headers_to_add for Envoy to pass to
	// the client: ietf (RateLimit and RateLimit-Policy), x-ratelimit (X-RateLimit-Limit,
	// -Remaining, -Reset, as headers.reset says), all (both) or none. (Optional) default ietf.
	ResponseHeaders string `yaml:"response_headers"`
	// ShadowMode answers OK to every call while counting and labelling as usual, as
	// envoyproxy/ratelimit's SHADOW_MODE. (Optional) default false.
	ShadowMode bool `yaml:"shadow_mode"`
}

// Values of method_override.
const (
	MethodOverrideJudge = "judge"
	MethodOverrideStrip = "strip"
)

// IdentityConfig says where API keys and users come from.
type IdentityConfig struct {
	// APIKeyHeader carries the API key. (Optional) default X-Api-Key.
	APIKeyHeader string `yaml:"api_key_header"`
	// UserHeader carries a user id set by a trusted auth sidecar. (Optional) exclusive with JWT.
	// With TrustedProxies set it is read only from requests whose TCP peer is trusted; without,
	// it is read from every request, so a sidecar in front must overwrite it.
	UserHeader string     `yaml:"user_header"`
	JWT        *JWTConfig `yaml:"jwt"`
	// IPv6Prefix is how many leading bits of an IPv6 client address make its ip key: one
	// customer usually holds a whole /64 and could rotate through it, so all its addresses share
	// one bucket. 128 keys every address on its own. IPv4 clients (and IPv4-mapped IPv6 ones)
	// are keyed per address. (Optional) default 64, from 1 to 128.
	IPv6Prefix int `yaml:"ipv6_prefix"`
}

// JWTConfig verifies `Authorization: Bearer` tokens and takes the user from a claim.
type JWTConfig struct {
	// Claim names the user claim. (Optional) default sub.
	Claim string `yaml:"claim"`
	// HS256SecretEnv names the environment variable holding the HMAC secret.
	HS256SecretEnv string `yaml:"hs256_secret_env"`
	// RS256PublicKeyFile is a PEM file with the RSA public key. At least one of the two is required.
	RS256PublicKeyFile string `yaml:"rs256_public_key_file"`
	// Issuer and Audience, when set, must match the token's iss / aud. (Optional)
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// Leeway tolerates clock skew on exp/nbf. (Optional) default 0s.
	Leeway time.Duration `yaml:"leeway"`
}

// HeadersConfig shapes the X-RateLimit-* response headers.
type HeadersConfig struct {
	// Reset is unix (epoch seconds) or delta (seconds until). (Optional) default unix.
	Reset string `yaml:"reset"`
	// IETFDraft adds RateLimit-Policy and RateLimit. (Optional) default false.
	IETFDraft bool `yaml:"ietf_draft"`
}

// StoreConfig selects where bucket state lives.
type StoreConfig struct {
	// Backend is memory, dynamodb or redis. (Optional) default memory.
	Backend string `yaml:"backend"`
	// OnError is allow (fail open), deny (fail closed, 503) or local (decide from this replica's
	// memory with every limit divided by Replicas) while the store fails. (Optional) default allow.
	OnError string `yaml:"on_error"`
	// Timeout bounds each decision's store calls. (Optional) default 50ms.
	Timeout time.Duration `yaml:"timeout"`
	// MaxKeys bounds the memory store; idle keys are evicted first. With on_error local it also
	// bounds the fallback's private memory store. (Optional) default 1000000.
	MaxKeys int `yaml:"max_keys"`
	// Replicas is how many gateway replicas share the limits. With on_error local each replica
	// enforces every limit divided by it while the shared store is failing. (Required with
	// on_error local, at least 1; ignored otherwise.) No default: a silent 1 would let every
	// replica admit the whole limit during an outage.
	Replicas int `yaml:"replicas"`
	// DynamoDB configures backend dynamodb. (Required with backend dynamodb; an error with
	// backend memory, because a forgotten `backend: dynamodb` would silently enforce every limit
	// per replica.)
	DynamoDB *DynamoDBConfig `yaml:"dynamodb"`
	// Redis configures backend redis (Redis 7+ or Valkey 8+). (Required with backend redis; an
	// error with another backend, for the same reason as dynamodb.)
	Redis *RedisConfig `yaml:"redis"`
}

// RedisConfig is the shared Redis (or Valkey) store: see docs/redis.md for what each mode
// guarantees.
type RedisConfig struct {
	// URL is redis://[user@]host:port[/db] (rediss:// for TLS). With mode single the node;
	// with cluster or sentinel it supplies the database, TLS and credentials, and is the seed
	// when Addrs is empty (cluster). A password in it is refused: use PasswordEnv. (Required
	// with mode single.)
	URL string `yaml:"url"`
	// Mode is single, sentinel or cluster. (Optional) default single.
	Mode string `yaml:"mode"`
	// Addrs are the cluster's seed nodes or the Sentinels, host:port each. (Required with
	// mode sentinel.)
	Addrs []string `yaml:"addrs"`
	// SentinelMaster is the master name the Sentinels monitor. (Required with mode sentinel.)
	SentinelMaster string `yaml:"sentinel_master"`
	// Username is the ACL user. (Optional) default: the URL's, else the default user.
	Username string `yaml:"username"`
	// PasswordEnv names the environment variable that holds the password (never the value
	// itself). (Optional) default "": no password.
	PasswordEnv string `yaml:"password_env"`
	// KeyPrefix starts every key this gateway writes. (Optional) default "rl:".
	KeyPrefix string `yaml:"key_prefix"`
	// WaitReplicas makes every decision's write wait (WAIT) until that many replicas have it,
	// within store.timeout; a decision not confirmed in time follows store.on_error. It shrinks
	// what a failover can lose (docs/redis.md). (Optional) default 0: no wait.
	WaitReplicas int `yaml:"wait_replicas"`
}

// DynamoDBConfig is the shared DynamoDB store. Credentials come from the standard AWS chain
// (environment, shared config and credentials files, web identity, container and instance roles).
type DynamoDBConfig struct {
	// Table is the table's name. (Required)
	Table string `yaml:"table"`
	// Region is the table's AWS region. (Optional) default: the AWS chain's region (AWS_REGION,
	// the profile); serve fails at start when neither names one.
	Region string `yaml:"region"`
	// Endpoint is the http(s) base URL of a DynamoDB-API server such as DynamoDB Local.
	// (Optional) default "": the AWS endpoint of Region.
	Endpoint string `yaml:"endpoint"`
	// CreateTable creates the table (on-demand billing) and enables TTL at start when missing;
	// it needs CreateTable, DescribeTable, DescribeTimeToLive and UpdateTimeToLive rights.
	// (Optional) default false.
	CreateTable bool `yaml:"create_table"`
	// Mode is refund (concurrent conditional writes, compensating refunds) or transaction (one
	// TransactWriteItems per multi-policy request). (Optional) default refund.
	Mode string `yaml:"mode"`
	// DenyCache answers clients known to be limited locally until they may retry, without a
	// DynamoDB write. (Optional) default true.
	DenyCache bool `yaml:"deny_cache"`
	// SlotLease is how long a concurrency slot stays taken without a renewal: each replica
	// renews the slots it holds every SlotLease/3, so the slots of a replica that crashed come
	// back at most SlotLease after its last renewal. (Optional) default 30s, from 3s to 10m.
	SlotLease time.Duration `yaml:"slot_lease"`
	// Namespace scopes this gateway's bucket keys in the table, so that two services sharing a
	// table do not share a policy's buckets because both named it alike. Policies with a pool
	// ignore it: a pool is shared on purpose. (Optional) default "": keys as without it.
	// Letters, digits, '-', '_', '.', at most 64.
	Namespace string `yaml:"namespace"`
	// Clock is how the gateway measures its clock against DynamoDB's and corrects it. (Optional)
	Clock ClockConfig `yaml:"clock"`
}

// ClockConfig is store.dynamodb.clock. Every replica measures its clock's offset from the Date
// header of DynamoDB's answers (bracketed to about the round trip; see internal/clockref).
type ClockConfig struct {
	// Correct makes decisions use the clock corrected by the measured offset: the least change
	// that agrees with every measurement, so a clock in sync is never moved. (Optional)
	// default true.
	Correct bool `yaml:"correct"`
	// MaxCorrection bounds the correction's magnitude. (Optional) default 5s, from 1ms to 1h.
	MaxCorrection time.Duration `yaml:"max_correction"`
	// WarnOffset: a warning is logged (once a minute) while this host's clock is off by more
	// than it for certain. (Optional) default 100ms, from 1ms to 1h.
	WarnOffset time.Duration `yaml:"warn_offset"`
	// MaxOffset: /readyz answers 503 while the clock decisions use is off by more than it for
	// certain (after the correction). (Optional) default 0s: the clock never makes a replica
	// unready; else from 1ms to 1h.
	MaxOffset time.Duration `yaml:"max_offset"`
}

// ServerConfig holds the proxy listener's timeouts.
type ServerConfig struct {
	// ReadHeaderTimeout bounds slow clients sending headers. (Optional) default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, body included, so a client that sends its body
	// slowly cannot hold a connection and an upstream request open forever. Raise it for large
	// uploads over slow links. (Optional) default 60s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// GRPCIdleTimeout bounds how long the body of a gRPC call (see grpc_routes) may stay silent
	// over HTTP/2: read_timeout does not apply to it (a streaming call may rightly last longer),
	// but a client that sends nothing for this long gets DEADLINE_EXCEEDED, so a stalled call
	// cannot hold a concurrency slot and an upstream stream for ever. Every message received
	// starts it again; a call's own deadline (grpc-timeout) still ends it sooner. (Optional)
	// default 5m.
	GRPCIdleTimeout time.Duration `yaml:"grpc_idle_timeout"`
	// WriteStallTimeout bounds how long an answer may make no progress towards its client: a
	// client that stops reading (a slow reader holding a large answer, on purpose or not)
	// loses the request, its upstream concurrency slot and, over HTTP/1.1, its connection once
	// a write has waited this long. Every write that goes through starts it again, so a long
	// stream (SSE, gRPC streams, downloads) that is being read is never cut, however long it
	// lasts or however long it stays silent. (Optional) default 30s, from 100ms to 1h.
	WriteStallTimeout time.Duration `yaml:"write_stall_timeout"`
	// IdleTimeout closes idle keep-alive connections. (Optional) default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// DrainTimeout is the upper bound on finishing in-flight requests at shutdown. (Optional) default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// ShutdownDelay is how long the gateway keeps serving after SIGTERM while /readyz already
	// answers 503, so that load balancers and Kubernetes endpoints stop sending it new
	// connections before its listener closes. (Optional) default 0s: close at once.
	ShutdownDelay time.Duration `yaml:"shutdown_delay"`
	// MaxHeaderBytes bounds request headers. (Optional) default 65536.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxConcurrentStreams bounds the streams one HTTP/2 client connection may have open at once
	// (each stream is one request); handlers beyond it are not started. (Optional) default 250,
	// from 1 to 10000.
	MaxConcurrentStreams int `yaml:"max_concurrent_streams"`
}

// LogConfig shapes the zap logger.
type LogConfig struct {
	// Level is debug, info, warn or error. (Optional) default info.
	Level string `yaml:"level"`
	// Access writes one JSON line per request (logger "access", message "request"): time,
	// method, path, status, duration, decision, the rejecting policy and the client's key
	// values as pseudonyms, never raw. `ratelimit-replay` reads these lines. Unsampled:
	// at high request rates it is a line per request. (Optional) default false.
	Access bool `yaml:"access"`
	// PseudonymSecretEnv names an environment variable holding the secret (at least 16 bytes)
	// that keys the HMAC pseudonyms of client keys in log lines. With it, pseudonyms are stable
	// across restarts and replicas, and `replay` shows the same ones. (Optional) default "": a
	// random secret per process, so the same client has another pseudonym after a restart.
	PseudonymSecretEnv string `yaml:"pseudonym_secret_env"`
}

// PolicyConfig is one policy as written in the file.
type PolicyConfig struct {
	// Name is unique among policies. (Required) letters, digits, '-', '_', '.'.
	Name string `yaml:"name"`
	// Key is ip, api_key, user, global or header:NAME. (Required)
	Key string `yaml:"key"`
	// Algorithm is token_bucket, leaky_bucket, fixed_window, sliding_window, concurrency or
	// quota. (Required)
	Algorithm string `yaml:"algorithm"`
	// Cost is how much of the budget one matching request spends, all or nothing: with cost 5 a
	// request passes only when 5 fit. Overrides keep it. (Optional) default 1; at most what
	// the limit holds (burst for token_bucket, burst+1 for leaky_bucket, limit otherwise).
	Cost int64 `yaml:"cost"`
	// Costs give some of the policy's requests another cost than Cost, so that one budget
	// charges routes differently (POST /search 5, the rest 1): the first entry whose methods
	// and path_prefix both match the request decides. (Optional)
	Costs []CostConfig `yaml:"costs"`
	// Rate is N/s, N/m or N/h (buckets).
	Rate string `yaml:"rate"`
	// Burst is the capacity (token bucket) or queue length (leaky bucket).
	Burst int64 `yaml:"burst"`
	// Limit is requests per Window (windows), or requests in flight at once (concurrency).
	Limit int64 `yaml:"limit"`
	// Window is a Go duration (windows).
	Window time.Duration `yaml:"window"`
	Match  MatchConfig   `yaml:"match"`
	// ChargeOn lists the answers that consume the budget: status codes (401) or classes (5xx).
	// A request is still checked before it is forwarded (an exhausted budget rejects it), and
	// its charge is reserved; an answer not listed gives the reservation back. (Optional)
	// default: every admitted request is charged. token_bucket, fixed_window, sliding_window
	// and quota only.
	ChargeOn []string `yaml:"charge_on"`
	// Period is day, week or month: a quota's calendar period. (Required for quota)
	Period string `yaml:"period"`
	// TimeZone is the IANA time zone whose calendar a quota follows, e.g. Europe/Berlin; its
	// periods start at midnight there. (Optional, quota) default UTC.
	TimeZone string `yaml:"time_zone"`
	// Offset moves a quota's period start by whole days, as API Gateway's usage-plan offset:
	// for week the weekday it starts on, 0 (Sunday) to 6 (Saturday); for month the day after
	// the 1st, 0 to 27 (offset 14: from the 15th to the 15th); 0 for day. (Optional, quota)
	// default 0.
	Offset int `yaml:"offset"`
	// windowSet and costSet record that the file wrote window or cost, so that `window: 0s`
	// and `cost: 0` are reported as the zeros they are rather than as fields left out. Set by
	// Parse.
	windowSet, costSet bool
	// Mode is enforce or shadow. (Optional) default enforce.
	Mode      string           `yaml:"mode"`
	Overrides []OverrideConfig `yaml:"overrides"`
	// Pool names the policy's buckets in the store instead of the policy's name: gateways that
	// name the same pool on the same table share its buckets (an account-wide budget drawn by
	// several services). They must give it the same algorithm, key and limits. (Optional)
	// letters, digits, '-', '_', '.', at most 64.
	Pool string `yaml:"pool"`
	// Lease serves the policy's buckets from capacity leased in batches (DynamoDB store; see
	// docs/shared-pools.md). (Optional) default off.
	Lease *LeaseConfig `yaml:"lease"`
}

// LeaseConfig is a policy's lease mode: each replica reserves a batch of capacity from the
// shared item in one conditional write and admits from it locally.
type LeaseConfig struct {
	// Enabled turns lease mode on. (Required to use leases) default false.
	Enabled bool `yaml:"enabled"`
	// Shards is how many items the bucket is split over, each with rate/shards and its share of
	// the burst (or limit), which add up to the whole exactly. (Optional) default 1, at most 64
	// and at most the burst (limit).
	Shards int `yaml:"shards"`
	// TTL is how long a leased unit may be held before it is spent. (Optional) default: 150ms,
	// or for a token bucket half of burst/rate if that is shorter. A token bucket's TTL must
	// be shorter than burst/rate: leases take their units from the burst less rate*ttl.
	TTL time.Duration `yaml:"ttl"`
}

// CostConfig is one entry of a policy's costs.
type CostConfig struct {
	// Methods and PathPrefix select the requests, as a policy's match does; at least one of
	// the two. (Optional each)
	Methods    []string `yaml:"methods"`
	PathPrefix string   `yaml:"path_prefix"`
	// Cost is what those requests spend instead of the policy's cost. (Required) at least 1,
	// at most what the limit holds.
	Cost int64 `yaml:"cost"`
}

// MatchConfig restricts a policy to some requests; empty matches everything. Requests match by
// their canonical method and path (docs/algorithms.md): methods and, unless PathCaseSensitive,
// paths case-insensitively, `;` parameters and repeated slashes ignored, and a PathPrefix that
// ends in '/' also matches the path without it.
type MatchConfig struct {
	// Methods are upper-case HTTP methods; GET also matches HEAD. (Optional) default: any.
	Methods []string `yaml:"methods"`
	// PathPrefix starts with '/', without `;`, '\', repeated slashes, "." or ".." segments.
	// (Optional) default: any path.
	PathPrefix string `yaml:"path_prefix"`
	// PathCaseSensitive matches PathPrefix (and the costs' path_prefix) in its case, for an
	// upstream that routes /Files and /files to different handlers. (Optional) default false:
	// case-insensitive, as Express and ASP.NET route, so that no spelling escapes the policy.
	PathCaseSensitive bool `yaml:"path_case_sensitive"`
}

// OverrideConfig replaces a policy's limit for some keys, or exempts them.
type OverrideConfig struct {
	// Key is "sha256:<lowercase hex of the raw key value>", or for ip policies an address or CIDR.
	Key       string        `yaml:"key"`
	Rate      string        `yaml:"rate"`
	Burst     int64         `yaml:"burst"`
	Limit     int64         `yaml:"limit"`
	Window    time.Duration `yaml:"window"`
	Unlimited bool          `yaml:"unlimited"`
	// windowSet: see PolicyConfig.
	windowSet bool
}

// ProtectConfig is the protect block: the upstream's own concurrency limit and the priorities
// by which requests are shed when it is reached. Requests the policies admit take a slot; a
// request that finds none (after waiting up to queue_timeout) is shed.
type ProtectConfig struct {
	Concurrency ProtectConcurrencyConfig `yaml:"concurrency"`
	// Priorities sort requests into the classes critical, default and sheddable: the first
	// entry whose match matches decides; anything else is default. Sheddable requests are shed
	// first, then default ones; critical ones only when the limit is full. (Optional)
	Priorities []PriorityConfig `yaml:"priorities"`
	// Status is the HTTP status of a shed request: 503 or 429 (gRPC: UNAVAILABLE or
	// RESOURCE_EXHAUSTED). (Optional) default 503.
	Status int `yaml:"status"`
	// MaxBufferedBody: a request body of at most this many bytes is read whole before the
	// request takes a concurrency slot, so that the slot covers the upstream's time and not
	// the client's upload (a client trickling its body holds no slot; server.read_timeout
	// bounds it). Larger bodies, and gRPC calls, stream through their slot. The gateway
	// holds at most this much per request in memory. (Optional) default 65536, from 0 (every
	// body streams) to 67108864.
	MaxBufferedBody int64 `yaml:"max_buffered_body"`
	// StreamShare is the share of the limit that one client's requests with streaming bodies
	// (past max_buffered_body) may hold at once, at least one slot: its further ones are shed,
	// so that one client trickling large uploads cannot take the slots everyone else needs.
	// The client is the one the policies see (trusted_proxies). (Optional) default 0.1, above
	// 0 and at most 1.
	StreamShare float64 `yaml:"stream_share"`
}

// ProtectConcurrencyConfig is protect.concurrency: how many requests may be in flight to the
// upstream at once.
type ProtectConcurrencyConfig struct {
	// Adaptive makes the limit follow the upstream's latency (a gradient controller, see
	// docs/configuration.md) between min_limit and max_limit; false: a fixed limit of limit.
	// (Optional) default true.
	Adaptive bool `yaml:"adaptive"`
	// Limit is the fixed limit, or the adaptive limit's starting point. (Optional) default 50,
	// from 1 to 100000.
	Limit int `yaml:"limit"`
	// MinLimit is the adaptive limit's floor. (Optional) default 2, at least 1.
	MinLimit int `yaml:"min_limit"`
	// MaxLimit is the adaptive limit's ceiling. (Optional) default 1000, at most 100000.
	MaxLimit int `yaml:"max_limit"`
	// QueueTimeout is how long a request may wait for a slot; waiting requests get slots by
	// priority, first in first out within one. (Optional) default 0s: no waiting, at most 1m.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
}

// PriorityConfig is one entry of protect.priorities.
type PriorityConfig struct {
	// Name is the class: critical, default or sheddable. (Required)
	Name string `yaml:"name"`
	// Match selects the requests of the class; empty matches every request. (Optional)
	Match PriorityMatchConfig `yaml:"match"`
	// Reserve is the share of the limit that only this class (and the classes above it) may
	// use: the classes below it are shed once the rest is in use. (Optional) default 0, below
	// 1; not for sheddable, which has no class below it.
	Reserve float64 `yaml:"reserve"`
}

// PriorityMatchConfig selects the requests of a priority class: the forms of a policy's match,
// and headers.
type PriorityMatchConfig struct {
	// Methods are upper-case HTTP methods; GET also matches HEAD. (Optional) default: any.
	Methods []string `yaml:"methods"`
	// PathPrefix is matched as a policy's path_prefix is. (Optional) default: any path.
	PathPrefix string `yaml:"path_prefix"`
	// PathCaseSensitive is as a policy's. (Optional) default false.
	PathCaseSensitive bool `yaml:"path_case_sensitive"`
	// Headers must all be present with exactly these values (names case-insensitive).
	// (Optional) default: none.
	Headers map[string]string `yaml:"headers"`
}
