package main

import (
	"fmt"
	"slices"
)

// erlRatio is our RLS against envoyproxy/ratelimit on one row: CPU per call (replicas plus
// redis-server) and p99, ours over theirs. The targets are at most 0.5 each.
type erlRatio struct {
	Keys     int     `json:"keys"`
	Paced    float64 `json:"paced_rate,omitempty"`
	Round    int     `json:"round,omitempty"` // 0 in a median
	CPUOurs  float64 `json:"cpu_us_per_call_ours"`
	CPUTheir float64 `json:"cpu_us_per_call_theirs"`
	CPURatio float64 `json:"cpu_ratio"`
	P99Ratio float64 `json:"p99_ratio"`
	CPUMet   bool    `json:"cpu_target_met"`
	P99Met   bool    `json:"p99_target_met"`
}

// erlRatios are the rounds' ratios and, per load, their medians (what the targets are read
// from: one round on a shared machine can be a noisy neighbour's).
type erlRatios struct {
	Rows    []erlRatio `json:"rows"`
	Medians []erlRatio `json:"medians"`
}

// ratios pairs every rls row with the envoyproxy/ratelimit row of the same load and round.
func ratios(rows []gwRow) *erlRatios {
	var out erlRatios
	for _, o := range rows {
		if o.Front != string(frontRLS) {
			continue
		}
		for _, t := range rows {
			if t.Front != string(frontERL) || t.Keys != o.Keys || t.Paced != o.Paced || t.Round != o.Round || t.P99us == 0 {
				continue
			}
			r := erlRatio{Keys: o.Keys, Paced: o.Paced, Round: o.Round, CPUOurs: o.GatewayCPU + o.RedisCPU, CPUTheir: t.GatewayCPU + t.RedisCPU}
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
	type load struct {
		keys  int
		paced float64
	}
	var order []load
	by := map[load][]erlRatio{}
	for _, r := range out.Rows {
		l := load{r.Keys, r.Paced}
		if _, ok := by[l]; !ok {
			order = append(order, l)
		}
		by[l] = append(by[l], r)
	}
	for _, l := range order {
		rs := by[l]
		m := erlRatio{Keys: l.keys, Paced: l.paced,
			CPUOurs:  median(rs, func(r erlRatio) float64 { return r.CPUOurs }),
			CPUTheir: median(rs, func(r erlRatio) float64 { return r.CPUTheir }),
			CPURatio: median(rs, func(r erlRatio) float64 { return r.CPURatio }),
			P99Ratio: median(rs, func(r erlRatio) float64 { return r.P99Ratio })}
		m.CPUMet, m.P99Met = m.CPURatio <= 0.5, m.P99Ratio <= 0.5
		out.Medians = append(out.Medians, m)
	}
	return &out
}

// median of f over rs (the mean of the middle two for an even count).
func median(rs []erlRatio, f func(erlRatio) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

func printReport(rep report) {
	fmt.Printf("\n%d CPUs, load average %.1f before, %.1f after\n\n", rep.CPUs, rep.LoadBefore, rep.LoadAfter)
	fmt.Println("| front | round | replicas | keys | load | decisions/s | p50 µs | p99 µs | CPU µs/decision (gateways + redis) | run-queue wait µs/decision (gateways + redis) | redis reads/decision | load avg |")
	fmt.Println("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.Gateways {
		load := "closed loop"
		if r.Paced > 0 {
			load = fmt.Sprintf("paced %.0f/s (p99 from schedule %.0f µs)", r.Paced, r.P99SchedUs)
		}
		fmt.Printf("| %s | %d | %d | %d | %s | %.0f | %.0f | %.0f | %.1f + %.1f | %.1f + %.1f | %.2f | %.1f |\n", r.Front, r.Round, r.Replicas, r.Keys, load,
			r.PerSecond, r.P50us, r.P99us, r.GatewayCPU, r.RedisCPU, r.GatewayWait, r.RedisWait, r.RedisReads, r.Load1)
	}
	if rep.Ratios != nil {
		fmt.Println("\n| ours / envoyproxy/ratelimit | round | keys | load | CPU per call (gateways + redis) | p99 |")
		fmt.Println("|---|---|---:|---|---:|---:|")
		for _, r := range append(rep.Ratios.Rows, rep.Ratios.Medians...) {
			load := "closed loop"
			if r.Paced > 0 {
				load = fmt.Sprintf("paced %.0f/s", r.Paced)
			}
			round := "median"
			if r.Round > 0 {
				round = fmt.Sprint(r.Round)
			}
			fmt.Printf("| | %s | %d | %s | %.2f (%.1f / %.1f µs) | %.2f |\n", round, r.Keys, load, r.CPURatio, r.CPUOurs, r.CPUTheir, r.P99Ratio)
		}
	}
	if c := rep.SameAnswers; c != nil {
		for _, x := range []struct {
			what string
			s    *sameAnswers
		}{{"the bench's rules", c.Bench}, {"their integration tests' rule files", c.Integration}} {
			if s := x.s; s != nil {
				fmt.Printf("\nsame answers on %s: %d calls (seed %d), %d OVER_LIMIT, %d mismatches (theirs with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), %d against their default %s\n",
					x.what, s.Calls, s.Seed, s.OverLimit, s.Mismatches, s.MismatchesDefault, s.FirstMismatch)
			}
		}
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
