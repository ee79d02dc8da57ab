// Command exact is `make check-exact`: the adversary of the shared store. It runs gateway
// replicas (the test gateway, `bin/ratelimit-test-gateway serve`: the real command line with the
// test seams of internal/testkit/gateway) on one DynamoDB Local table behind a
// fault-injecting relay (internal/testkit/ddbrelay: responses dropped after the write landed, requests
// duplicated, connections reset, calls delayed and throttled, writes applied after their client
// gave up, copies applied after other writes landed, two writes of one replica reordered), kills
// one replica with SIGKILL mid-load and restarts it, runs the replicas with offset clocks (the
// test gateway's RATELIMIT_TEST_CLOCK_OFFSET), and drives every algorithm with leases on and off, in each
// group mode, each offered at least twice its bound, while the console resets keys and gives
// one exemptions (console.go; the judge cuts each history where those writes landed), then
// runs the memory store on one replica. It records every decision on one clock (the
// load generator's, shared with the test upstream) and checks the exact bound of every bucket
// over every interval of the history (internal/testkit/exactcheck). It writes .cache/check/exact.json:
//
//	runs, decisions, faults_injected{kind: n} (the relay's kinds, kill, clock_offset),
//	over_admits, units_unaccounted, under_admit_ratio, unknown_upstream,
//	offered_vs_bound{policy: ratio}, console{resets, exemptions...}, duration_s
//
// and .cache/check/exact-runs.json, the details of every run: its seed, each bucket's worst
// interval, the faults, how wide the decisions' intervals were. It exits non-zero when
// over_admits, units_unaccounted or unknown_upstream is not 0, a fault kind was never injected,
// or a policy was offered less than twice its bound.
//
// With CHECK_EXACT_SELFTEST=1 it runs the same scenario against each mutant instead (selftest.go:
// the test gateway as each mutant of internal/testkit/exactmutant, and a clock mutant), writes
// .cache/check/selftest.json, and exits non-zero unless every mutant is caught.
//
// Every knob is a flag with an environment default (CHECK_EXACT_*): see -h. A failing run names
// its seed; CHECK_EXACT_SEED=<seed> CHECK_EXACT_REPEATS=1 CHECK_EXACT_MODES=<mode> repeats it
// (the faults each call draws follow the seed; the interleaving of calls does not, so a repeat
// is likely, not certain, to fail the same way). Everything listens on loopback; every process it
// starts is stopped at the end, on errors and on Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// Summary is exact.json: the exact field set, and offered_vs_bound (each policy's
// lowest offered load against its bound over the runs: see loadRatio).
type Summary struct {
	Runs             int                          `json:"runs"`
	Decisions        int                          `json:"decisions"`
	FaultsInjected   map[ddbrelay.FaultKind]int64 `json:"faults_injected"`
	OverAdmits       int64                        `json:"over_admits"`
	UnitsUnaccounted float64                      `json:"units_unaccounted"`
	UnderAdmitRatio  float64                      `json:"under_admit_ratio"`
	UnknownUpstream  int64                        `json:"unknown_upstream"`
	OfferedVsBound   map[string]float64           `json:"offered_vs_bound"`
	// Console is what the console workload did (resets, exemptions) and how many admitted
	// decisions the spans between its writes judged.
	Console   consoleStats `json:"console"`
	DurationS float64      `json:"duration_s"`
}

// memoryMode is the run on the memory store (one replica), beside the DynamoDB group modes.
const memoryMode = "memory"

// redisMode is the run on one redis-server behind a TCP fault relay (redisfaults.go).
const redisMode = "redis"

// The faults the orchestrator injects itself, counted in faults_injected beside the relay's: a
// replica SIGKILLed (and restarted), a replica run with its clock offset.
const (
	faultKill        ddbrelay.FaultKind = "kill"
	faultClockOffset ddbrelay.FaultKind = "clock_offset"
)

// expectedFaults are the kinds a check must inject, each at least once.
func (o options) expectedFaults() []ddbrelay.FaultKind {
	var kinds []ddbrelay.FaultKind
	if slices.ContainsFunc(o.modes, func(m string) bool { return m != redisMode && m != memoryMode }) {
		kinds = append(kinds, o.faultKinds...)
	}
	if slices.Contains(o.modes, redisMode) {
		kinds = append(kinds, redisFaultKinds...)
	}
	if o.kill {
		kinds = append(kinds, faultKill)
	}
	if o.offset != 0 {
		kinds = append(kinds, faultClockOffset)
	}
	return kinds
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("check-exact", flag.ContinueOnError)
	var modes, kinds, exclude, seed string
	var kill, correct, self string
	fs.IntVar(&o.replicas, "replicas", harness.Atoi(envOr("CHECK_EXACT_REPLICAS", "3")), "gateway processes per run, at least 3 (CHECK_EXACT_REPLICAS)")
	fs.DurationVar(&o.duration, "duration", harness.Dur(envOr("CHECK_EXACT_DURATION", "60s")), "load per run (CHECK_EXACT_DURATION)")
	defModes := "refund,transaction,memory"
	if os.Getenv("CHECK_EXACT_STORE") == redisMode {
		defModes = redisMode
	}
	fs.StringVar(&modes, "modes", envOr("CHECK_EXACT_MODES", defModes), "runs per repeat: the DynamoDB group modes refund and transaction (3 replicas behind the fault relay), memory (the memory store, one replica: its counts are the process's own), and redis (3 replicas on one redis-server behind a TCP fault relay; CHECK_EXACT_STORE=redis makes it the default) (CHECK_EXACT_MODES)")
	fs.IntVar(&o.repeats, "repeats", harness.Atoi(envOr("CHECK_EXACT_REPEATS", "2")), "runs of every mode, each with its own seed (CHECK_EXACT_REPEATS)")
	fs.StringVar(&seed, "seed", envOr("CHECK_EXACT_SEED", ""), "the first run's seed, the next ones follow (CHECK_EXACT_SEED; default: random, printed)")
	fs.Float64Var(&o.faultRate, "fault-rate", harness.Atof(envOr("CHECK_EXACT_FAULT_RATE", "0.02")), "probability of each fault kind per DynamoDB call (CHECK_EXACT_FAULT_RATE)")
	fs.DurationVar(&o.faultDelay, "fault-delay", harness.Dur(envOr("CHECK_EXACT_FAULT_DELAY", "150ms")), "a delay fault's extra wait (CHECK_EXACT_FAULT_DELAY)")
	fs.StringVar(&kinds, "faults", envOr("CHECK_EXACT_FAULTS", "drop_response,duplicate,reset,delay,throttle,late_write,delayed_duplicate,reorder"), "fault kinds injected (CHECK_EXACT_FAULTS)")
	fs.DurationVar(&o.offset, "clock-offset", harness.Dur(envOr("CHECK_EXACT_CLOCK_OFFSET", "100ms")), "replicas run with clocks offset by 0, +this, -this (CHECK_EXACT_CLOCK_OFFSET)")
	fs.DurationVar(&o.storeDelay, "store-delay", harness.Dur(envOr("CHECK_EXACT_STORE_DELAY", "0s")), "every DynamoDB call waits this long more at the relay (CHECK_EXACT_STORE_DELAY)")
	fs.DurationVar(&o.storeJitter, "store-jitter", harness.Dur(envOr("CHECK_EXACT_STORE_JITTER", "0s")), "plus a uniform random part in [0, this] (CHECK_EXACT_STORE_JITTER)")
	fs.StringVar(&correct, "clock-correct", envOr("CHECK_EXACT_CLOCK_CORRECT", "1"), "1: the replicas correct their clocks against DynamoDB's Date (the default of store.dynamodb.clock.correct); 0: they decide on their offset clocks as they are (CHECK_EXACT_CLOCK_CORRECT)")
	fs.StringVar(&kill, "kill", envOr("CHECK_EXACT_KILL", "1"), "1: SIGKILL replica 0 mid-load and restart it (CHECK_EXACT_KILL)")
	fs.Float64Var(&o.load, "load", harness.Atof(envOr("CHECK_EXACT_LOAD", "1")), "offered load as a multiple of the base rates (1: about 3 times each policy's bound; below about 0.7 the check fails, as a gateway that limits nothing could pass) (CHECK_EXACT_LOAD)")
	fs.DurationVar(&o.storeTimeout, "store-timeout", harness.Dur(envOr("CHECK_EXACT_STORE_TIMEOUT", "2s")), "the replicas' store.timeout (CHECK_EXACT_STORE_TIMEOUT)")
	fs.StringVar(&exclude, "exclude", envOr("CHECK_EXACT_EXCLUDE", ""), "policies left out, of tb, tbl, lb, fw, fwl, sw, co, q, cc, cr, fx and gate (gate: no group is ever rejected by a second policy); name@mode leaves it out in one group mode only, e.g. gate@refund (CHECK_EXACT_EXCLUDE)")
	fs.StringVar(&self, "selftest", envOr("CHECK_EXACT_SELFTEST", "0"), "1: instead of the check, its self-test: one run against each mutant ("+strings.Join(mutants, ", ")+"), in the first mode; writes selftest.json and fails unless every mutant is caught and every policy over-admits under admit-everything (CHECK_EXACT_SELFTEST)")
	var ms string
	fs.StringVar(&ms, "mutants", envOr("CHECK_EXACT_MUTANTS", strings.Join(mutants, ",")), "the mutants the self-test runs (CHECK_EXACT_MUTANTS)")
	fs.StringVar(&o.bin, "bin", "bin/ratelimit-test-gateway", "the gateway binary: the test gateway (internal/testkit/gateway), whose clock a replica can shift")
	fs.StringVar(&o.mutantBin, "mutant-bin", "bin/ratelimit-test-gateway-mutant", "where the self-test builds the test gateway it runs as each mutant")
	fs.StringVar(&o.out, "out", ".cache/check", "where exact.json, exact-runs.json and the replicas' logs go")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.endpoint = os.Getenv("DYNAMODB_ENDPOINT")
	o.warmRounds = 15
	o.settle = 15 * time.Second
	o.modes = split(modes)
	o.exclude = split(exclude)
	for _, k := range split(kinds) {
		o.faultKinds = append(o.faultKinds, ddbrelay.FaultKind(k))
	}
	o.kill = kill == "1" || kill == "true"
	o.clockCorrect = correct == "1" || correct == "true"
	o.selftest = self == "1" || self == "true"
	o.mutants = split(ms)
	for _, m := range o.mutants {
		if !slices.Contains(mutants, m) {
			return o, fmt.Errorf("-mutants: %q is not one of %v", m, mutants)
		}
	}
	if seed == "" {
		o.seed = uint64(time.Now().UnixNano()) % 1e9
	} else if s, err := strconv.ParseUint(seed, 10, 64); err == nil {
		o.seed = s
	} else {
		return o, fmt.Errorf("-seed / CHECK_EXACT_SEED %q: want a number", seed)
	}
	switch {
	case o.replicas < 3:
		return o, fmt.Errorf("-replicas %d: want at least 3", o.replicas)
	case o.duration <= 0 || o.repeats < 1 || len(o.modes) == 0:
		return o, fmt.Errorf("-duration %v, -repeats %d, -modes %q: want a positive duration, a repeat and a mode", o.duration, o.repeats, modes)
	case o.faultRate < 0 || o.faultRate > 1 || o.load <= 0 || o.offset < 0 || o.storeTimeout <= 0 || o.storeDelay < 0 || o.storeJitter < 0:
		return o, fmt.Errorf("-fault-rate %v, -load %v, -clock-offset %v, -store-timeout %v: out of range", o.faultRate, o.load, o.offset, o.storeTimeout)
	}
	for _, m := range o.modes {
		if m != "refund" && m != "transaction" && m != memoryMode && m != redisMode {
			return o, fmt.Errorf("-modes: %q is not refund, transaction, memory or redis", m)
		}
	}
	return o, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	o, err := parseFlags(os.Args[1:])
	if err == nil {
		o.logf = func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
		if o.selftest {
			var st SelfTest
			if err = buildMutant(ctx, "./internal/testkit/gateway", o.mutantBin); err == nil {
				st, err = selftest(ctx, o, o.mutants, os.Stdout)
			}
			if err == nil {
				err = st.verdict()
			}
		} else {
			var sum Summary
			sum, _, err = check(ctx, o, os.Stdout)
			if err == nil {
				err = sum.verdict(o.expectedFaults())
			}
		}
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "check-exact:", err)
		os.Exit(1)
	}
}

// verdict is the check's pass or fail.
func (s Summary) verdict(kinds []ddbrelay.FaultKind) error {
	var errs []error
	if s.OverAdmits != 0 {
		errs = append(errs, fmt.Errorf("over_admits %d: the bound was exceeded (exact-runs.json names each bucket, interval and seed)", s.OverAdmits))
	}
	if s.UnknownUpstream != 0 {
		errs = append(errs, fmt.Errorf("unknown_upstream %d: the upstream saw a request twice or without an id (an admission no client saw)", s.UnknownUpstream))
	}
	for _, p := range slices.Sorted(maps.Keys(s.OfferedVsBound)) {
		if r := s.OfferedVsBound[p]; r < minLoadRatio {
			errs = append(errs, fmt.Errorf("policy %s was offered %.2fx its bound, want at least %dx: a gateway that limits nothing could pass (raise -load)", p, r, minLoadRatio))
		}
	}
	if s.UnitsUnaccounted != 0 {
		errs = append(errs, fmt.Errorf("units_unaccounted %v: leased units neither spent, refunded nor expired", s.UnitsUnaccounted))
	}
	for _, k := range kinds {
		if s.FaultsInjected[k] == 0 {
			errs = append(errs, fmt.Errorf("fault %s was never injected", k))
		}
	}
	c := s.Console
	if c.Resets-c.ResetsFailed == 0 || c.ExemptionsExpired == 0 || c.ExemptionsDeleted == 0 {
		errs = append(errs, fmt.Errorf("console: %d resets answered, %d exemptions expired, %d deleted: want some of each (the check judges none of them otherwise)",
			c.Resets-c.ResetsFailed, c.ExemptionsExpired, c.ExemptionsDeleted))
	}
	return errors.Join(errs...)
}

// check runs every run and writes exact.json and exact-runs.json under o.out.
func check(ctx context.Context, o options, stdout io.Writer) (Summary, []runResult, error) {
	start := time.Now()
	sum := Summary{FaultsInjected: map[ddbrelay.FaultKind]int64{}, OfferedVsBound: map[string]float64{}}
	for _, k := range o.expectedFaults() {
		sum.FaultsInjected[k] = 0
	}
	if _, err := os.Stat(o.bin); err != nil {
		return sum, nil, fmt.Errorf("gateway binary: %w (make check-exact builds it)", err)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return sum, nil, err
	}
	endpoint, stopDDB, err := dynamoEndpoint(ctx, o)
	if err != nil {
		return sum, nil, err
	}
	defer stopDDB()
	if len(o.exclude) > 0 {
		o.logf("EXCLUDED policies (not checked in this run): %v", o.exclude)
	}
	var runs []runResult
	var admitted int64
	var possible float64
	seed := o.seed
	for range o.repeats {
		for _, mode := range o.modes {
			res, err := oneRun(ctx, o, endpoint, seed, mode)
			if err != nil {
				return sum, runs, fmt.Errorf("run seed %d mode %s: %w", seed, mode, err)
			}
			runs = append(runs, res)
			sum.Runs++
			sum.Decisions += res.Decisions
			for k, n := range res.Faults {
				sum.FaultsInjected[k] += n
			}
			sum.UnknownUpstream += res.UnknownUpstream
			sum.Console.add(res.Console)
			for p, lr := range res.Load {
				if r, ok := sum.OfferedVsBound[p]; !ok || lr.Ratio < r {
					sum.OfferedVsBound[p] = lr.Ratio
				}
			}
			for _, c := range res.Checks {
				sum.OverAdmits += c.Excess
				if c.Excess > 0 {
					o.logf("OVER-ADMISSION seed %d mode %s policy %s%s: %d admitted in [%.1f ms, %.1f ms] where the bound is %.2f",
						seed, mode, c.Policy, keySuffix(c.Key), c.Admitted, c.FromMS, c.ToMS, c.Bound)
				}
			}
			sum.UnitsUnaccounted += res.UnitsOpen
			admitted += res.Admitted
			possible += res.Possible
			o.logf("run seed %d mode %s: console %+v", seed, mode, res.Console)
			o.logf("run seed %d mode %s: %d decisions, faults %v, over-admitted %d, units unaccounted %v (held at kill %v), unknown upstream %d, give-backs sent %v, decision intervals p50 %.1f ms p99 %.1f ms, store p99 %.1f ms, offered vs bound %v",
				seed, mode, res.Decisions, res.Faults, excess(res), res.UnitsOpen, res.UnitsAtKill, res.UnknownUpstream, res.StoreCalls["refund"]+res.StoreCalls["release"], res.Widths.P50, res.Widths.P99, res.StoreP99MS, ratios(res.Load))
			seed++
		}
	}
	if possible > 0 {
		sum.UnderAdmitRatio = round3(1 - float64(admitted)/possible)
	}
	sum.DurationS = round3(time.Since(start).Seconds())
	if err := writeJSON(filepath.Join(o.out, "exact.json"), sum); err != nil {
		return sum, runs, err
	}
	if err := writeJSON(filepath.Join(o.out, "exact-runs.json"), map[string]any{"excluded_policies": o.exclude, "runs": runs}); err != nil {
		return sum, runs, err
	}
	b, _ := json.MarshalIndent(sum, "", "  ")
	fmt.Fprintf(stdout, "%s\n", b)
	return sum, runs, nil
}

// dynamoEndpoint is o.endpoint, or a DynamoDB Local started for the check (stop stops it).
func dynamoEndpoint(ctx context.Context, o options) (endpoint string, stop func(), err error) {
	if o.endpoint != "" {
		return o.endpoint, func() {}, nil
	}
	ddb, err := dynamolocal.Start(ctx, filepath.Join(o.out, "dynamodb-local"))
	if err != nil && ctx.Err() == nil {
		// The script gives Java 30 s to answer, which a machine busy with other work can miss.
		o.logf("%v; trying once more", err)
		ddb, err = dynamolocal.Start(ctx, filepath.Join(o.out, "dynamodb-local"))
	}
	stop = func() {
		if ddb != nil {
			if err := ddb.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
	}
	if err != nil {
		stop()
		return "", nil, err
	}
	return ddb.Endpoint, stop, nil
}

func ratios(m map[string]loadRatio) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s %.1fx ", p, m[p].Ratio)
	}
	return strings.TrimSpace(b.String())
}

func excess(r runResult) (n int64) {
	for _, c := range r.Checks {
		n += c.Excess
	}
	return n
}

func keySuffix(k string) string {
	if k == "" {
		return ""
	}
	return " key " + k
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
