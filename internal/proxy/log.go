package proxy

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logBurst is how many lines with the same message and level get through per second; the rest
// are dropped. Rejections and store errors can come at the request rate of an attack or an
// outage, and a log line per request would turn either into a disk-filling incident.
const logBurst = 10

// sampled wraps l so that each message is logged at most logBurst times a second.
//
// Log lines carry policy names and bucket keys in hex (bucket.Key is already a digest of the
// client value), never a raw API key, user id, token or header value.
func sampled(l *zap.Logger) *zap.Logger {
	return l.Named("proxy").WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, logBurst, 0)
	}))
}
