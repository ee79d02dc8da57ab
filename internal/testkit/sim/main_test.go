package sim

import (
	"os"
	rdebug "runtime/debug"
	"testing"
)

// TestMain collects garbage a quarter as often as Go's default unless GOGC says otherwise: a
// run allocates much and keeps little (a few MB a seed), and the collector was a fifth of its
// time.
func TestMain(m *testing.M) {
	if os.Getenv("GOGC") == "" {
		rdebug.SetGCPercent(400)
	}
	os.Exit(m.Run())
}
