package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/replay"
)

// progressPeriod is how often the progress line is redrawn.
const progressPeriod = 250 * time.Millisecond

// isTerminal reports whether w is a terminal (a character device): progress is for people
// watching, never for a file or a pipe that a script reads.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// replayProgress returns the replay's progress callback: on a terminal w, one line redrawn in
// place (lines read, lines per second, the position in the logs' time), cleared when the replay
// ends; nil (silent) when w is not a terminal.
func replayProgress(w io.Writer) func(replay.Progress) {
	if !isTerminal(w) {
		return nil
	}
	return newProgressLine(w, time.Now)
}

// newProgressLine draws progress on w with the clock now.
func newProgressLine(w io.Writer, now func() time.Time) func(replay.Progress) {
	start := now()
	var last time.Time
	return func(p replay.Progress) {
		t := now()
		if p.Done {
			fmt.Fprint(w, "\r\033[K") // erase the line: the report follows
			return
		}
		if t.Sub(last) < progressPeriod {
			return
		}
		last = t
		rate := 0.0
		if el := t.Sub(start).Seconds(); el > 0 {
			rate = float64(p.Lines) / el
		}
		at := "-"
		if !p.LogTime.IsZero() {
			at = p.LogTime.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "\r\033[Kreplay: %d lines, %.0f lines/s, log time %s", p.Lines, rate, at)
	}
}
