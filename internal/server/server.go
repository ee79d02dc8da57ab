// Package server wires the gateway together.
//
// It wires the gateway together: it loads the configuration, builds the store, the
// proxy handler and the admin handler, serves both listeners, reloads policies on change and
// drains in-flight requests on shutdown. It is the only place that knows every other package.
package server

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
)

// Options configure Run.
type Options struct {
	// ConfigPath is the YAML file. (Required)
	ConfigPath string
	// Getenv reads RATELIMIT_* overrides and JWT secrets. nil means os.Getenv.
	Getenv func(string) string
	// Log receives the JSON log lines. nil means os.Stderr.
	Log io.Writer
	// Now is the host's clock as the gateway reads it: every instant it decides with (the
	// proxy's decisions, the store's leases and slot renewals, JWT expiry) comes from it.
	// (Optional) default time.Now; test harnesses shift it to run replicas whose clocks
	// disagree (internal/testkit/gateway).
	Now func() time.Time
	// Ready, when set, is called once both listeners accept connections, with their addresses.
	Ready func(proxyAddr, adminAddr net.Addr)
	// Hooks are test seams. (Optional) the shipped binary sets none.
	Hooks Hooks
}

// Hooks let a test harness replace parts of the gateway as Run builds them, in the manner of
// httputil.ReverseProxy's func fields: a nil field leaves its part as built. The self-test's
// mutants and fault injectors reach the gateway through them (internal/testkit/gateway), so
// the shipped binary holds no test code and reads no test variable.
type Hooks struct {
	// DynamoDB wraps the DynamoDB client the shared store writes through.
	DynamoDB func(dynamo.API) dynamo.API
	// Store wraps the shared store, whatever its backend, before the fallback and the front ends
	// see it. The memory store is not wrapped.
	Store func(bucket.Store) bucket.Store
}

func (h Hooks) dynamoDB(api dynamo.API) dynamo.API {
	if h.DynamoDB == nil {
		return api
	}
	return h.DynamoDB(api)
}

func (h Hooks) store(s bucket.Store) bucket.Store {
	if h.Store == nil {
		return s
	}
	return h.Store(s)
}

// Run serves the gateway until ctx ends, then drains in-flight requests (bounded by
// server.drain_timeout) and returns nil. A config that does not validate is an error before any
// listener opens. It runs in three phases, as Caddy's modules do: build every part from the
// configuration (newGateway), serve, drain.
func Run(ctx context.Context, o Options) error {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	// SIGHUP is caught from the start: its default action would kill a gateway that is still
	// starting (building the DynamoDB store may take a minute with create_table). One that
	// arrives before the watcher runs waits in the channel and reloads then.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	g, err := newGateway(ctx, o)
	if g != nil {
		defer func() { _ = g.log.Sync() }()
	}
	if err != nil {
		if g != nil && stopped(ctx, err) {
			g.log.Info("shut down before serving")
			return nil
		}
		return err
	}
	running := g.serve(ctx, hup)
	return g.drain(ctx, running)
}

// closeStoreTimeout bounds giving the store's leases back at shutdown.
const closeStoreTimeout = 5 * time.Second

// defaultGCPercent is the garbage collector target the gateway runs with unless GOGC is set.
// A proxy's live heap is small (a few MiB plus the memory store), so the default of 100 makes it
// collect very often; at 400 the gateway's throughput in the (c) benchmark rose by about a third
// and its CPU per request fell by about a quarter (docs/benchmarks.md), for a heap a few MiB larger.
const defaultGCPercent = 400

// tuneGC applies defaultGCPercent unless the operator chose GOGC, and returns the value in force.
func tuneGC(getenv func(string) string) int {
	if v := getenv("GOGC"); v != "" {
		// The runtime has applied it at start; read it back without changing it.
		cur := debug.SetGCPercent(100)
		debug.SetGCPercent(cur)
		return cur
	}
	debug.SetGCPercent(defaultGCPercent)
	return defaultGCPercent
}

// stopped reports whether err is the cancellation of ctx (SIGTERM or SIGINT while starting):
// a shutdown asked for, not a failure.
func stopped(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, context.Canceled)
}

// memoryLimitShare is the part of the container's memory limit given to the Go runtime as its
// soft limit: the rest is for memory the runtime does not count (stacks of cgo-free threads are
// counted; the binary, page cache of its files and kernel socket buffers are not).
const memoryLimitShare = 0.9

// tuneMemoryLimit sets the Go runtime's soft memory limit to memoryLimitShare of the container's
// cgroup limit when GOMEMLIMIT is unset and such a limit exists, and returns the limit in force
// (math.MaxInt64: none). With GOGC=400 the heap may grow to five times its live size between
// collections (about 490 MiB with a full default memory store of 1M sliding-window keys); the
// soft limit makes the collector run earlier instead of the kernel killing the container.
func tuneMemoryLimit(getenv func(string) string, cgroupMax func() (int64, bool)) int64 {
	if getenv("GOMEMLIMIT") != "" {
		return debug.SetMemoryLimit(-1) // applied by the runtime at start; read it back unchanged
	}
	if n, ok := cgroupMax(); ok && n > 0 {
		limit := int64(float64(n) * memoryLimitShare)
		debug.SetMemoryLimit(limit) // returns the previous limit
		return limit
	}
	return debug.SetMemoryLimit(-1) // a negative input reads the limit without changing it
}

// cgroupMemoryMax reads the memory limit of this process's cgroup: memory.max (cgroup v2) or
// memory.limit_in_bytes (v1). ok is false when there is none ("max", or v1's huge sentinel) or
// the files cannot be read (not in a container, or not Linux).
func cgroupMemoryMax() (int64, bool) {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		return parseCgroupLimit(string(b))
	}
	return 0, false
}

// parseCgroupLimit parses a cgroup memory limit file's content.
func parseCgroupLimit(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	n, err := strconv.ParseInt(s, 10, 64)
	// cgroup v1 writes "no limit" as a page-rounded MaxInt64; anything above 1 PiB is no limit.
	if err != nil || n <= 0 || n >= 1<<50 {
		return 0, false
	}
	return n, true
}

// upgradeProtocols are the protocols a request may switch to: upgrade_protocols, whose default
// (websocket) the loader applied; a list written empty allows none.
func upgradeProtocols(cfg *policy.Config) []string {
	if cfg.UpgradeProtocols == nil {
		return []string{}
	}
	return cfg.UpgradeProtocols
}

// grpcRoutes are the paths whose application/grpc requests are gRPC calls: grpc_routes when
// set, else every path (nil) when the upstream speaks HTTP/2, as a gRPC upstream must, and
// none with HTTP/1.1, where no gRPC call could be forwarded anyway.
func grpcRoutes(cfg *policy.Config, p proxy.Protocol) []string {
	switch {
	case len(cfg.GRPCRoutes) > 0:
		return cfg.GRPCRoutes
	case p == proxy.HTTP1:
		return []string{}
	}
	return nil
}

// listenerProtocols are the protocols of the proxy listener. In cleartext: HTTP/1.1, and HTTP/2
// with prior knowledge (h2c), told apart by the connection preface; the `Upgrade: h2c` dance of
// RFC 7540 is not offered (RFC 9113 deprecated it, and gRPC clients never use it). Over TLS:
// HTTP/1.1 and h2, chosen by ALPN.
func listenerProtocols(tls bool) *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	if tls {
		p.SetHTTP2(true)
	} else {
		p.SetUnencryptedHTTP2(true)
	}
	return p
}

// serve serves l until s shuts down, over TLS when s has a TLSConfig (its certificates come from
// GetConfigForClient, so no files are named here).
func serve(s *http.Server, l net.Listener) error {
	var err error
	if s.TLSConfig != nil {
		err = s.ServeTLS(l, "", "")
	} else {
		err = s.Serve(l)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func newLogger(w io.Writer, lvl zapcore.Level) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	// Durations with their unit ("30s", "1.2ms"): the production default writes bare seconds
	// ("drain_timeout":30), which a reader has to guess.
	enc.EncodeDuration = zapcore.StringDurationEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core)
}
