package server

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestLogDurationsHaveUnits: a duration in a log line carries its unit ("30s"), not bare
// seconds.
func TestLogDurationsHaveUnits(t *testing.T) {
	var buf bytes.Buffer
	newLogger(&buf, zapcore.InfoLevel).Info("draining", zap.Duration("drain_timeout", 30*time.Second), zap.Duration("offset", 1200*time.Microsecond))
	for _, want := range []string{`"drain_timeout":"30s"`, `"offset":"1.2ms"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log line %s lacks %s", buf.String(), want)
		}
	}
}
