package main

import "fmt"

// erlRatio is our RLS against envoyproxy/ratelimit on one row: CPU per call (replicas plus
// redis-server) and p99, ours over theirs. The targets are at most 0.5 each.
type erlRatio struct {
	Keys     int     `json:"keys"`
	Paced    float64 `json:"paced_rate,omitempty"`
	CPUOurs  float64 `json:"cpu_us_per_call_ours"`
	CPUTheir float64 `json:"cpu_us_per_call_theirs"`
	CPURatio float64 `json:"cpu_ratio"`
	P99Ratio float64 `json:"p99_ratio"`
	CPUMet   bool    `json:"cpu_target_met"`
	P99Met   bool    `json:"p99_target_met"`
}

type erlRatios struct {
	Rows []erlRatio `json:"rows"`
}

// ratios pairs every rls row with the envoyproxy/ratelimit row of the same load.
func ratios(rows []gwRow) *erlRatios {
	var out erlRatios
	for _, o := range rows {
		if o.Front != string(frontRLS) {
			continue
		}
		for _, t := range rows {
			if t.Front != string(frontERL) || t.Keys != o.Keys || t.Paced != o.Paced || t.P99us == 0 {
				continue
			}
			r := erlRatio{Keys: o.Keys, Paced: o.Paced, CPUOurs: o.GatewayCPU + o.RedisCPU, CPUTheir: t.GatewayCPU + t.RedisCPU}
			if r.CPUTheir > 0 {
				r.CPURatio = r.CPUOurs / r.CPUTheir
			}
			r.P99Ratio = o.P99us / t.P99us
			r.CPUMet, r.P99Met = r.CPURatio <= 0.5, r.P99Ratio <= 0.5
			out.Rows = append(out.Rows, r)
		}
	}
	if len(out.Rows) == 0 {
		return nil
	}
	return &out
}

func printReport(rep report) {
	fmt.Printf("\n%d CPUs, load average %.1f before, %.1f after\n\n", rep.CPUs, rep.LoadBefore, rep.LoadAfter)
	fmt.Println("| front | replicas | keys | load | decisions/s | p50 µs | p99 µs | CPU µs/decision (gateways + redis) | redis reads/decision | load avg |")
	fmt.Println("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.Gateways {
		load := "closed loop"
		if r.Paced > 0 {
			load = fmt.Sprintf("paced %.0f/s (p99 from schedule %.0f µs)", r.Paced, r.P99SchedUs)
		}
		fmt.Printf("| %s | %d | %d | %s | %.0f | %.0f | %.0f | %.1f + %.1f | %.2f | %.1f |\n", r.Front, r.Replicas, r.Keys, load,
			r.PerSecond, r.P50us, r.P99us, r.GatewayCPU, r.RedisCPU, r.RedisReads, r.Load1)
	}
	if rep.Ratios != nil {
		fmt.Println("\n| ours / envoyproxy/ratelimit | keys | load | CPU per call (gateways + redis) | p99 |")
		fmt.Println("|---|---:|---|---:|---:|")
		for _, r := range rep.Ratios.Rows {
			load := "closed loop"
			if r.Paced > 0 {
				load = fmt.Sprintf("paced %.0f/s", r.Paced)
			}
			fmt.Printf("| | %d | %s | %.2f (%.1f / %.1f µs) | %.2f |\n", r.Keys, load, r.CPURatio, r.CPUOurs, r.CPUTheir, r.P99Ratio)
		}
	}
	if s := rep.SameAnswers; s != nil {
		fmt.Printf("\nsame answers: %d calls (seed %d), %d OVER_LIMIT, %d mismatches (theirs with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), %d against their default %s\n",
			s.Calls, s.Seed, s.OverLimit, s.Mismatches, s.MismatchesDefault, s.FirstMismatch)
	}
	if len(rep.Store) > 0 {
		fmt.Println("\n| store (in process) | keys | decisions/s | p50 µs | p99 µs | CPU µs/decision (process + store) | decisions per client write / per redis read |")
		fmt.Println("|---|---:|---:|---:|---:|---:|---:|")
		for _, r := range rep.Store {
			fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %.1f + %.1f | %.1f / %.1f |\n", r.Store, r.Keys, r.PerSecond, r.P50us, r.P99us,
				r.CPUus, r.StoreCPUus, r.PerClientWrite, r.PerRedisRead)
		}
	}
}
