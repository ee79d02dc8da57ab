package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/replay"
)

// TestReplayProgressLine checks the terminal's progress line (lines, lines/s, the log's time,
// redrawn at most every 250ms, erased at the end) and that it stays silent off a terminal.
func TestReplayProgressLine(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	var b bytes.Buffer
	f := newProgressLine(&b, func() time.Time { return now })
	now = t0.Add(2 * time.Second)
	f(replay.Progress{Lines: 100000, LogTime: time.Date(2024, 5, 1, 9, 15, 0, 0, time.UTC)})
	now = now.Add(100 * time.Millisecond) // too soon: not redrawn
	f(replay.Progress{Lines: 120000})
	want := "\r\033[Kreplay: 100000 lines, 50000 lines/s, log time 2024-05-01T09:15:00Z"
	if b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
	f(replay.Progress{Lines: 130000, Done: true})
	if !strings.HasSuffix(b.String(), "\r\033[K") {
		t.Fatalf("the line is not erased at the end: %q", b.String())
	}
	if replayProgress(&b) != nil {
		t.Fatal("progress on a buffer, want silence off a terminal")
	}
}
