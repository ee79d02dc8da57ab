package main

import (
	"math"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// TestRatiosPairTheSameLoad: each of our RLS rows is set against theirs of the same keys,
// pacing and round, ours over theirs, and the targets are at most half.
func TestRatiosPairTheSameLoad(t *testing.T) {
	rows := []gwRow{
		{Front: "proxy", Keys: 1, Round: 1, GatewayCPU: 1, RedisCPU: 1, P99us: 1},
		{Front: "rls", Keys: 1, Round: 1, GatewayCPU: 30, RedisCPU: 10, P99us: 400},
		{Front: "envoyproxy/ratelimit", Keys: 1, Round: 1, GatewayCPU: 70, RedisCPU: 10, P99us: 1000},
		{Front: "rls", Keys: 10_000, Paced: 5000, Round: 1, GatewayCPU: 60, RedisCPU: 40, P99us: 900},
		{Front: "envoyproxy/ratelimit", Keys: 10_000, Paced: 5000, Round: 1, GatewayCPU: 150, RedisCPU: 50, P99us: 1000},
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
	if ratios(rows[:2]) != nil {
		t.Error("without their rows: want no ratios")
	}
}

// TestRatiosMedianOverRounds: rounds pair only with their own round (theirs of round 2 against
// ours of round 2), and each load's median is over the rounds.
func TestRatiosMedianOverRounds(t *testing.T) {
	var rows []gwRow
	for i, cpu := range []float64{100, 300, 120} { // ours per round; theirs 200 each round
		rows = append(rows,
			gwRow{Front: "rls", Keys: 1, Round: i + 1, GatewayCPU: cpu, P99us: 100 * float64(i+1)},
			gwRow{Front: "envoyproxy/ratelimit", Keys: 1, Round: i + 1, GatewayCPU: 200 * float64(i+1), P99us: 1000})
	}
	r := ratios(rows)
	if r == nil || len(r.Rows) != 3 || len(r.Medians) != 1 {
		t.Fatalf("ratios = %+v, want 3 rows (one per round) and 1 median", r)
	}
	for i, want := range []float64{0.5, 0.75, 0.2} { // 100/200, 300/400, 120/600
		if got := r.Rows[i]; got.Round != i+1 || math.Abs(got.CPURatio-want) > 1e-9 {
			t.Errorf("round %d: %+v, want cpu ratio %.2f", i+1, got, want)
		}
	}
	m := r.Medians[0]
	if math.Abs(m.CPURatio-0.5) > 1e-9 || math.Abs(m.P99Ratio-0.2) > 1e-9 || !m.CPUMet || !m.P99Met || m.Round != 0 {
		t.Errorf("median: %+v, want cpu 0.5 and p99 0.2, both met", m)
	}
}

// TestSameSequenceIsDeterministic: one seed and run give the same calls, byte for byte (the
// check sends each system the same sequence), and another run other values.
func TestSameSequenceIsDeterministic(t *testing.T) {
	for name, seq := range map[string]func(uint64, int, string) []*pb.RateLimitRequest{"bench": sameSequence, "integration": integrationSequence} {
		t.Run(name, func(t *testing.T) { deterministic(t, seq) })
	}
}

func deterministic(t *testing.T, seq func(uint64, int, string) []*pb.RateLimitRequest) {
	a, b, c := seq(35, 50, "x"), seq(35, 50, "x"), seq(35, 50, "y")
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
