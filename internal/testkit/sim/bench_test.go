package sim

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's CPU time so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSimulator is the speed target: 1,000 seeds of 10,000 decisions each in 10
// minutes on this machine. One iteration runs one seed per CPU at once, of SIM_BENCH_DECISIONS
// decisions (default 10,000), on SIM_BACKEND's backend (default dynamodb: each backend has its
// own sub-benchmark). It reports decisions/s over all CPUs, decisions per CPU second, and the
// projected wall time of the target on all of this machine's CPUs (projected_1000x10k_s, from
// the CPU time: the wall clock of a shared machine measures its other loads), which the target
// wants at most 600.
//
// synctest.Test needs a *testing.T, which a benchmark has not: each seed runs as a test of its
// own through testing.RunTests (the runner go test itself uses).
func BenchmarkSimulator(b *testing.B) {
	decisions := 10_000
	if v := os.Getenv("SIM_BENCH_DECISIONS"); v != "" {
		if _, err := fmt.Sscan(v, &decisions); err != nil || decisions < 1 {
			b.Fatalf("SIM_BENCH_DECISIONS=%q: want a positive number", v)
		}
	}
	for _, be := range Backends {
		b.Run(be, func(b *testing.B) {
			var seed atomic.Uint64
			var total atomic.Int64
			var violations atomic.Int64
			procs := runtime.GOMAXPROCS(0)
			cpu0 := cpuTime()
			start := time.Now()
			for b.Loop() {
				var wg sync.WaitGroup
				for range procs {
					s := seed.Add(1)
					wg.Go(func() {
						ok := testing.RunTests(func(string, string) (bool, error) { return true, nil }, []testing.InternalTest{{
							Name: fmt.Sprintf("%s/seed=%d", be, s),
							F: func(t *testing.T) {
								res := Run(t, Config{Seed: s, Decisions: decisions, Backend: be})
								total.Add(int64(res.Decisions))
								violations.Add(int64(len(res.Violations)))
							},
						}})
						if !ok {
							b.Errorf("seed %d failed", s)
						}
					})
				}
				wg.Wait()
			}
			wall := time.Since(start).Seconds()
			cpu := (cpuTime() - cpu0).Seconds()
			rate := float64(total.Load()) / wall
			perCPU := float64(total.Load()) / cpu
			b.ReportMetric(rate, "decisions/s")
			b.ReportMetric(perCPU, "decisions/cpu-s")
			// On a shared machine the wall clock measures the neighbours: the projection is
			// from the CPU time, on every CPU of this one.
			b.ReportMetric(1000*10_000/(perCPU*float64(runtime.NumCPU())), "projected_1000x10k_s")
			b.ReportMetric(float64(violations.Load()), "violations")
		})
	}
}
