package replay

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestReplayProgress checks that Options.Progress hears the lines read and the log's time every
// progressEvery lines, and Done from Finish.
func TestReplayProgress(t *testing.T) {
	set := compile(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 10/s, burst: 10}\n")
	var got []Progress
	r, err := New(Options{Set: set, Progress: func(p Progress) { got = append(got, p) }})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for range 2*progressEvery + 5 {
		b.WriteString(clf("192.0.2.1", "01/May/2024:09:15:00", "/x", "-"))
	}
	if err := r.Read(context.Background(), "log", strings.NewReader(b.String())); err != nil {
		t.Fatal(err)
	}
	r.Finish()
	if len(got) != 3 || got[0].Lines != progressEvery || got[1].Lines != 2*progressEvery || !got[2].Done || got[2].Lines != 2*progressEvery+5 {
		t.Fatalf("progress calls %+v, want at %d and %d lines, then Done at %d", got, progressEvery, 2*progressEvery, 2*progressEvery+5)
	}
	if want := time.Date(2024, 5, 1, 9, 15, 0, 0, time.UTC); !got[1].LogTime.Equal(want) {
		t.Fatalf("log time %v, want %v", got[1].LogTime, want)
	}
}
