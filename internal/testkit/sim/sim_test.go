package sim

import (
	"os"
	"strconv"
	"testing"
	"time"
)

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative number", name, v)
	}
	return n
}

func TestSimOne(t *testing.T) {
	seed := uint64(envInt(t, "SEED", 1))
	start := time.Now()
	res := Run(t, Config{Seed: seed, Decisions: envInt(t, "SIM_DECISIONS", 2000), Mutant: os.Getenv("SIM_MUTANT"), Trace: os.Getenv("SIM_TRACE") != ""})
	t.Logf("seed %d: %d decisions (%d admitted, %d rejected, %d errors), %d steps, %.1f simulated s, %s wall, %s", res.Seed, res.Decisions, res.Admitted, res.Rejected, res.Errors, res.Steps, res.SimSeconds, time.Since(start), res.HistorySHA256)
	for _, v := range res.Violations {
		t.Errorf("violation: %s", v)
	}
	if os.Getenv("SIM_TRACE") != "" {
		for _, l := range res.History {
			t.Log(l)
		}
	}
}
