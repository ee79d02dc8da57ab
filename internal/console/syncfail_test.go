package console

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestSyncFailureLoggedOnceAMinute: a sync failing every second (a missing table) logs its
// first failure, then at most one line a minute with the failures since, and its recovery once.
func TestSyncFailureLoggedOnceAMinute(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	var f syncFailures
	start := time.Unix(1_800_000_000, 0)
	missing := errors.New("ResourceNotFoundException: table not found")
	for s := 0; s < 150; s++ { // 2.5 minutes of failures, one a second
		f.note(log, start.Add(time.Duration(s)*time.Second), missing)
	}
	warns := logs.FilterMessageSnippet("failed").All()
	if len(warns) != 3 { // at 0 s, 60 s, 120 s
		t.Fatalf("%d lines for 150 failures in 2.5 minutes, want 3: %v", len(warns), warns)
	}
	if n := warns[1].ContextMap()["failures_since_last_line"]; n != int64(60) {
		t.Errorf("the second line counts %v failures, want 60", n)
	}
	f.note(log, start.Add(151*time.Second), nil)
	f.note(log, start.Add(152*time.Second), nil)
	if n := logs.FilterMessageSnippet("works again").Len(); n != 1 {
		t.Errorf("recovery logged %d times, want once", n)
	}
	f.note(log, start.Add(153*time.Second), missing)
	if n := logs.FilterMessageSnippet("failed").Len(); n != 4 {
		t.Errorf("a new failure after recovery: %d lines, want it logged at once (4)", n)
	}
}
