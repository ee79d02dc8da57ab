package server

import (
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// grpc-go has its own log (grpclog), written to stderr as plain text and, at the severities
// GRPC_GO_LOG_SEVERITY_LEVEL turns on, carrying client addresses: a failed TLS handshake on the
// RLS port reads `ServerHandshake("203.0.113.7:51234") failed`. routeGRPCLog sends it into the
// process's JSON log instead (logger "grpc"), each address replaced by its pseudonym as the
// net/http error lines are, at the same severities and verbosity grpc-go's own variables ask
// for (ERROR alone when unset).

// grpcSink is where grpclog's lines go: the current serve's logger and pseudonyms. grpclog's
// logger is process-wide and may be set only once, before gRPC runs; a later serve in the same
// process (tests) swaps the sink.
type grpcSink struct {
	log *zap.Logger
	ps  *policy.Pseudonyms
}

var (
	grpcLogOnce sync.Once
	grpcLogTo   atomic.Pointer[grpcSink]
)

// routeGRPCLog routes grpclog to log (named "grpc") through ps. getenv reads grpc-go's
// variables. Call it before any gRPC server or client is created.
func routeGRPCLog(log *zap.Logger, ps *policy.Pseudonyms, getenv func(string) string) {
	grpcLogTo.Store(&grpcSink{log: log.Named("grpc"), ps: ps})
	grpcLogOnce.Do(func() {
		// grpclog writes a line of severity s to the writers of s and of every lower severity:
		// one writer is given the lowest severity asked for, as grpc-go's default logger does.
		infoW, warnW, errW := io.Discard, io.Discard, io.Discard
		w := grpcWriter{}
		switch strings.ToLower(getenv("GRPC_GO_LOG_SEVERITY_LEVEL")) {
		case "info":
			infoW = w
		case "warning":
			warnW = w
		default:
			errW = w
		}
		v, _ := strconv.Atoi(getenv("GRPC_GO_LOG_VERBOSITY_LEVEL"))
		grpclog.SetLoggerV2(grpclog.NewLoggerV2WithVerbosity(infoW, warnW, errW, v))
	})
}

// grpcWriter turns one line of grpclog's text format ("2026/12/05 06:54:00 INFO: [core] msg")
// into a log entry of that severity, its addresses as pseudonyms.
type grpcWriter struct{}

func (grpcWriter) Write(p []byte) (int, error) {
	sink := grpcLogTo.Load()
	if sink == nil {
		return len(p), nil
	}
	line := strings.TrimRight(string(p), "\n")
	level := zapcore.InfoLevel
	for _, sev := range [...]struct {
		tag   string
		level zapcore.Level
	}{{"INFO: ", zapcore.InfoLevel}, {"WARNING: ", zapcore.WarnLevel}, {"ERROR: ", zapcore.ErrorLevel}, {"FATAL: ", zapcore.ErrorLevel}} {
		if i := strings.Index(line, sev.tag); i >= 0 && i <= len("2006/01/02 15:04:05 ") {
			line, level = line[i+len(sev.tag):], sev.level
			break
		}
	}
	// FATAL is logged at error level: grpclog exits the process itself after writing it.
	if ce := sink.log.Check(level, sink.ps.ScrubAddrs(line)); ce != nil {
		ce.Write()
	}
	return len(p), nil
}
