package server

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)

	if got := tuneGC(func(string) string { return "" }); got != defaultGCPercent {
		t.Errorf("without GOGC: got %d, want %d", got, defaultGCPercent)
	}
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Errorf("without GOGC the runtime runs at %d, want %d", got, defaultGCPercent)
	}

	// With GOGC set, the runtime's value (applied at start) is kept.
	debug.SetGCPercent(150)
	env := func(k string) string {
		if k == "GOGC" {
			return "150"
		}
		return ""
	}
	if got := tuneGC(env); got != 150 {
		t.Errorf("with GOGC=150: got %d, want 150 kept", got)
	}
	if got := debug.SetGCPercent(100); got != 150 {
		t.Errorf("with GOGC=150 the runtime runs at %d, want 150", got)
	}
}
