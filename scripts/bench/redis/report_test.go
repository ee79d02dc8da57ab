package main

import (
	"math"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestRatiosPairTheSameLoad: each of our RLS rows is set against theirs of the same keys and
// pacing, ours over theirs, and the targets are at most half.
func TestRatiosPairTheSameLoad(t *testing.T) {
	rows := []gwRow{
		{Front: "proxy", Keys: 1, GatewayCPU: 1, RedisCPU: 1, P99us: 1},
		{Front: "rls", Keys: 1, GatewayCPU: 30, RedisCPU: 10, P99us: 400},
		{Front: "rls", Keys: 10_000, Paced: 5000, GatewayCPU: 60, RedisCPU: 40, P99us: 900},
		{Front: "envoyproxy/ratelimit", Keys: 1, GatewayCPU: 70, RedisCPU: 10, P99us: 1000},
		{Front: "envoyproxy/ratelimit", Keys: 10_000, Paced: 5000, GatewayCPU: 150, RedisCPU: 50, P99us: 1000},
	}
	r := ratios(rows)
	if r == nil || len(r.Rows) != 2 {
		t.Fatalf("ratios = %+v, want 2 rows", r)
	}
	one, paced := r.Rows[0], r.Rows[1]
	if one.Keys != 1 || math.Abs(one.CPURatio-0.5) > 1e-9 || math.Abs(one.P99Ratio-0.4) > 1e-9 || !one.CPUMet || !one.P99Met {
		t.Errorf("one key: %+v, want cpu 40/80 = 0.5 met, p99 0.4 met", one)
	}
	if paced.Paced != 5000 || math.Abs(paced.CPURatio-0.5) > 1e-9 || math.Abs(paced.P99Ratio-0.9) > 1e-9 || paced.P99Met {
		t.Errorf("paced: %+v, want cpu 100/200 = 0.5, p99 0.9 not met", paced)
	}
	if ratios(rows[:3]) != nil {
		t.Error("without their rows: want no ratios")
	}
}

// TestSameSequenceIsDeterministic: one seed and run give the same calls, byte for byte (the
// check sends each system the same sequence), and another run other values.
func TestSameSequenceIsDeterministic(t *testing.T) {
	a, b, c := sameSequence(35, 50, "x"), sameSequence(35, 50, "x"), sameSequence(35, 50, "y")
	differ := false
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			t.Fatalf("call %d: %v then %v", i, a[i], b[i])
		}
		differ = differ || !proto.Equal(a[i], c[i])
	}
	if !differ {
		t.Error("another run's values: the same calls")
	}
}
