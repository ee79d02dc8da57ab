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

func TestTuneMemoryLimit(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(orig)
	noEnv := func(string) string { return "" }

	// A container limit of 256 MiB: the runtime gets 90% of it.
	limit := int64(256 << 20)
	want := int64(float64(limit) * memoryLimitShare)
	if got := tuneMemoryLimit(noEnv, func() (int64, bool) { return limit, true }); got != want {
		t.Errorf("with a 256 MiB cgroup limit: got %d, want %d", got, want)
	}
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Errorf("the runtime's limit is %d, want 90%% of 256 MiB", got)
	}

	// GOMEMLIMIT set by the operator: left as the runtime applied it.
	debug.SetMemoryLimit(100 << 20)
	env := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "100MiB"
		}
		return ""
	}
	if got := tuneMemoryLimit(env, func() (int64, bool) { return 256 << 20, true }); got != 100<<20 {
		t.Errorf("with GOMEMLIMIT=100MiB: got %d, want %d kept", got, 100<<20)
	}

	// No cgroup limit: nothing changes.
	debug.SetMemoryLimit(orig)
	if got := tuneMemoryLimit(noEnv, func() (int64, bool) { return 0, false }); got != orig {
		t.Errorf("without a cgroup limit: got %d, want the runtime's %d", got, orig)
	}
}

func TestParseCgroupLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"268435456\n", 268435456, true},
		{"max\n", 0, false},
		{"9223372036854771712\n", 0, false}, // cgroup v1's "no limit"
		{"", 0, false},
		{"0\n", 0, false},
		{"garbage", 0, false},
	} {
		if got, ok := parseCgroupLimit(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("parseCgroupLimit(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
