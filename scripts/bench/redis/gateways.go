package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// gwOptions are the knobs of the rows through gateway processes.
type gwOptions struct {
	replicas int
	workers  int
	dur      time.Duration
	warmup   time.Duration
	rate     float64
	bin      string
	erlBin   string
	rounds   int // of our RLS beside theirs
	// erlConfig: envoyproxy/ratelimit's integration rule files (their checkout's
	// test/integration/runtime/current/ratelimit/config), for a second same-answers check.
	erlConfig string
}

// rig is one Redis the fleets share, with what the rows read of it.
type rig struct {
	redisURL, redisAddr string
	redisPID            int
	info                rueidis.Client
	dir                 string
}

// measureFleet runs one row through f: a warm-up, then the measured load, with the replicas',
// redis-server's and this process's CPU, and redis-server's counters, read around it.
func measureFleet(ctx context.Context, rg *rig, f *fleet, do doer, keys int, o gwOptions, rate float64) gwRow {
	runLoad(ctx, do, o.workers, o.warmup, rate)
	st0, _ := readStats(ctx, rg.info)
	within0, total0 := f.storeWithin1ms()
	gw0, rd0, self0 := procCPU(f.pids()), procCPU([]int{rg.redisPID}), selfCPU()
	gwWait0, rdWait0 := runWait(f.pids()), runWait([]int{rg.redisPID})
	r := runLoad(ctx, do, o.workers, o.dur, rate)
	gw, rd, self := procCPU(f.pids())-gw0, procCPU([]int{rg.redisPID})-rd0, selfCPU()-self0
	gwWait, rdWait := runWait(f.pids())-gwWait0, runWait([]int{rg.redisPID})-rdWait0
	st1, _ := readStats(ctx, rg.info)
	within1, total1 := f.storeWithin1ms()
	if r.firstErr != nil {
		log.Printf("%s: %d errors, the first: %v", f.front, r.errs, r.firstErr)
	}
	dn := float64(max(r.n, 1))
	st := st1.sub(st0)
	row := gwRow{
		Front: string(f.front), Replicas: len(f.cmds), Keys: keys, Workers: o.workers, Paced: rate,
		Decisions: r.n, Errors: r.errs, Over: r.over, PerSecond: float64(r.n) / r.elapsed.Seconds(),
		P50us: quantileUs(r.lat, 0.5), P99us: quantileUs(r.lat, 0.99),
		GatewayCPU: float64(gw) / 1e3 / dn, RedisCPU: float64(rd) / 1e3 / dn, LoadgenCPU: float64(self) / 1e3 / dn,
		GatewayWait: float64(gwWait) / 1e3 / dn, RedisWait: float64(rdWait) / 1e3 / dn,
		RedisScripts: st.scripts / dn, RedisCommands: st.commands / dn, RedisReads: st.reads / dn, Load1: loadAverage(),
	}
	if rate > 0 {
		row.P99SchedUs = quantileUs(r.sched, 0.99)
	}
	if total1 > total0 {
		row.StoreWithin1ms = (within1 - within0) / (total1 - total0)
	}
	log.Printf("%-22s keys %-6d %s %7.0f decisions/s p50 %6.0f us p99 %6.0f us cpu %5.1f us gateways + %5.1f us redis, run-queue wait %5.1f + %5.1f us, %.2f redis reads/decision, load %.1f",
		row.Front, keys, pacedLabel(rate), row.PerSecond, row.P50us, row.P99us, row.GatewayCPU, row.RedisCPU, row.GatewayWait, row.RedisWait, row.RedisReads, row.Load1)
	return row
}

func pacedLabel(rate float64) string {
	if rate > 0 {
		return fmt.Sprintf("paced %5.0f/s", rate)
	}
	return "closed loop  "
}

// gwLoad is one row's load: how many keys, and the pacing (0: closed loop).
type gwLoad struct {
	keys int
	rate float64
}

// doerFor is the load generator's caller of f's replicas over keys keys, and what closes it.
func doerFor(f *fleet, workers, keys int) (doer, func(), error) {
	if f.front == frontProxy {
		return httpDoer(f.addrs, workers, keys), func() {}, nil
	}
	cl, closeAll, err := grpcClients(f.addrs)
	if err != nil {
		return nil, nil, err
	}
	return rlsDoer(cl, keys), closeAll, nil
}

// measureLoads runs every load on each fleet in turn, load by load, stamping the rows with round.
func measureLoads(ctx context.Context, rg *rig, fleets []*fleet, loads []gwLoad, o gwOptions, round int) ([]gwRow, error) {
	var rows []gwRow
	for _, l := range loads {
		for _, f := range fleets {
			do, closeAll, err := doerFor(f, o.workers, l.keys)
			if err != nil {
				return rows, err
			}
			r := measureFleet(ctx, rg, f, do, l.keys, o, l.rate)
			r.Round = round
			rows = append(rows, r)
			closeAll()
		}
	}
	return rows, nil
}

// runGateways measures every front through o.replicas processes on one Redis: one key and 10,000
// keys back to back, then 10,000 keys paced at o.rate. The proxy runs once; our RLS and, with
// o.erlBin, envoyproxy/ratelimit run side by side (both fleets up at once, each load measured on
// ours and then on theirs) for o.rounds rounds: on a shared machine whose load drifts, the two
// sides of a ratio are then measured seconds apart, and the rounds show how much it moves.
func runGateways(ctx context.Context, rg *rig, o gwOptions) ([]gwRow, *sameChecks, error) {
	if _, err := os.Stat(o.bin); err != nil {
		return nil, nil, fmt.Errorf("gateway binary: %w (make bench-redis builds it)", err)
	}
	rulesDir := filepath.Join(rg.dir, "runtime")
	if err := writeRules(rulesDir); err != nil {
		return nil, nil, err
	}
	upstream, stopUp, err := harness.Serve(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header()["Content-Length"] = []string{"3"}
		_, _ = w.Write([]byte("ok\n"))
	}))
	if err != nil {
		return nil, nil, err
	}
	defer stopUp()
	spec := fleetSpec{replicas: o.replicas, bin: o.bin, redisURL: rg.redisURL, redisAddr: rg.redisAddr,
		upstream: upstream, rulesDir: rulesDir, workDir: rg.dir}
	loads := []gwLoad{{1, 0}, {10_000, 0}, {10_000, o.rate}}
	start := func(fr front, bin string) (*fleet, error) {
		s := spec
		s.front, s.bin = fr, bin
		return startFleet(ctx, s)
	}

	proxy, err := start(frontProxy, o.bin)
	if err != nil {
		return nil, nil, err
	}
	rows, err := measureLoads(ctx, rg, []*fleet{proxy}, loads, o, 1)
	proxy.stop()
	if err != nil {
		return rows, nil, err
	}

	rls, err := start(frontRLS, o.bin)
	if err != nil {
		return rows, nil, err
	}
	defer rls.stop()
	side := []*fleet{rls}
	if o.erlBin != "" {
		erl, err := start(frontERL, o.erlBin)
		if err != nil {
			return rows, nil, err
		}
		defer erl.stop()
		side = append(side, erl)
	}
	rounds := max(o.rounds, 1)
	if o.erlBin == "" {
		rounds = 1 // nothing to set beside: once is the row
	}
	for round := 1; round <= rounds && ctx.Err() == nil; round++ {
		more, err := measureLoads(ctx, rg, side, loads, o, round)
		rows = append(rows, more...)
		if err != nil {
			return rows, nil, err
		}
	}
	if o.erlBin == "" {
		return rows, nil, nil
	}
	same := &sameChecks{}
	if same.Bench, err = checkSameAnswers(ctx, spec, o.erlBin, 35, 120, sameSequence); err != nil {
		return rows, same, err
	}
	if o.erlConfig != "" {
		// Their integration tests' directory, unchanged: RUNTIME_ROOT is two levels above it
		// (RUNTIME_ROOT/ratelimit/config), and ours reads the same directory.
		s := spec
		s.rulesDir = filepath.Dir(filepath.Dir(o.erlConfig))
		if filepath.Base(o.erlConfig) != "config" || filepath.Base(filepath.Dir(o.erlConfig)) != "ratelimit" {
			return rows, same, fmt.Errorf("-erl-config %s: want a directory .../ratelimit/config, as envoyproxy/ratelimit reads", o.erlConfig)
		}
		same.Integration, err = checkSameAnswers(ctx, s, o.erlBin, 36, 150, integrationSequence)
	}
	return rows, same, err
}

// sameChecks are the same-answers checks: on the bench's rules, and on envoyproxy/ratelimit's
// integration tests' rule files when -erl-config names them.
type sameChecks struct {
	Bench       *sameAnswers `json:"bench_rules"`
	Integration *sameAnswers `json:"their_integration_rules,omitempty"`
}
