package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The knobs (make sim sets them; make test runs the defaults):
//   - SEED=N runs seed N alone (a replay), with its history in the log when it fails;
//   - SIM_SEED_FROM=F starts the seeds at F (default 1): a long run in parts;
//   - SIM_SEEDS=N runs seeds F..F+N-1 on each backend (default 6 on DynamoDB, 3 on Redis, whose
//     runs cost twice as much: miniredis builds a Lua state for every script);
//   - SIM_DECISIONS=N decisions per seed (default 2,000);
//   - SIM_HEAL_AT=N: faults stop at decision N (default 4/5 of the decisions; a shrunk replay
//     keeps its full run's);
//   - SIM_REPEAT_SEEDS=N: the same-seed check runs seeds 1..N twice each (default 4 on
//     DynamoDB, 2 on Redis);
//   - SIM_MUTANT_SEEDS=N: each mutant runs seeds 1..N until one catches it (default 30);
//   - SIM_BACKEND=dynamodb|redis runs one backend (default both);
//   - SIM_DET_MUTANT=NAME runs that determinism mutant alone (none: no mutant);
//   - SIM_REPORT=path writes the report there (make sim: .cache/sim/report.json), with the
//     differential test's counts from SIMDDB_DIFF_OUT's file when it is there.
const (
	defaultSeeds       = 6
	defaultRedisSeeds  = 3
	defaultMutantSeeds = 30
)

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// report is .cache/sim/report.json.
type report struct {
	Seeds int `json:"seeds"`
	Steps int `json:"steps"`
	// Decisions is every run's decisions, summed.
	Decisions        int                     `json:"decisions"`
	SimulatedSeconds float64                 `json:"simulated_seconds"`
	WallSeconds      float64                 `json:"wall_seconds"`
	Violations       []string                `json:"violations"`
	Mutants          map[string]mutantResult `json:"mutants"`
	Differential     differential            `json:"differential"`
	// DifferentialRedis is the simulated Redis's differential test against redis-server
	// (SIMREDIS_DIFF_OUT's file), beside DynamoDB's.
	DifferentialRedis differential `json:"differential_redis"`
	// Runs is each seed's run: beyond the fields, its history's hash (a replay of the
	// seed has the same).
	Runs []seedRun `json:"runs"`
}

type seedRun struct {
	Seed          uint64  `json:"seed"`
	Backend       string  `json:"backend"`
	Steps         int     `json:"steps"`
	SimSeconds    float64 `json:"simulated_seconds"`
	HistorySHA256 string  `json:"history_sha256"`
	Violations    int     `json:"violations"`
}

type mutantResult struct {
	Caught    bool   `json:"caught"`
	FirstSeed uint64 `json:"first_seed"`
}

type differential struct {
	Operations int `json:"operations"`
	Mismatches int `json:"mismatches"`
}

// backendsUnderTest are the backends of a run of the tests: SIM_BACKEND's alone, or both.
func backendsUnderTest(t *testing.T) []string {
	t.Helper()
	switch b := os.Getenv("SIM_BACKEND"); b {
	case "":
		return Backends
	case string(backendDynamo), string(backendRedis):
		return []string{b}
	default:
		t.Fatalf("SIM_BACKEND=%q: want dynamodb or redis", b)
		return nil
	}
}

// run is one seed on one backend.
type run struct {
	seed    uint64
	backend string
}

// runAll runs every (seed, backend) in parallel (one per CPU) and returns their results in
// the order given.
func runAll(t *testing.T, runs []run, cfg func(r run) Config) []Result {
	out := make([]Result, len(runs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, r := range runs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(fmt.Sprintf("%s/seed=%d", r.backend, r.seed), func(t *testing.T) { out[i] = Run(t, cfg(r)) })
		})
	}
	wg.Wait()
	return out
}

// replayCmd is the command that replays a seed of a backend.
func replayCmd(r run) string {
	if backend(r.backend) == backendRedis {
		return fmt.Sprintf("make sim SIM_BACKEND=redis SEED=%d", r.seed)
	}
	return fmt.Sprintf("make sim SEED=%d", r.seed)
}

// TestSimulator runs the seeds on each backend and fails on any violation, naming the seed,
// the command that replays it, and the fewest decisions that still fail.
func TestSimulator(t *testing.T) {
	decisions := envInt(t, "SIM_DECISIONS", 2000)
	var runs []run
	for _, b := range backendsUnderTest(t) {
		if v := os.Getenv("SEED"); v != "" {
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("SEED=%q: want a seed number", v)
			}
			runs = append(runs, run{s, b})
			continue
		}
		def := defaultSeeds
		if backend(b) == backendRedis {
			def = defaultRedisSeeds
		}
		from := envInt(t, "SIM_SEED_FROM", 1)
		for s := range envInt(t, "SIM_SEEDS", def) {
			runs = append(runs, run{uint64(from + s), b})
		}
	}
	start := time.Now()
	heal := 0
	if os.Getenv("SIM_HEAL_AT") != "" {
		heal = envInt(t, "SIM_HEAL_AT", 0)
	}
	single := len(runs) == 1
	results := runAll(t, runs, func(r run) Config {
		return Config{Seed: r.seed, Decisions: decisions, HealAt: heal, Trace: single, Backend: r.backend}
	})
	rep := report{Seeds: len(runs), Mutants: map[string]mutantResult{}, Violations: []string{}}
	for i, res := range results {
		r := runs[i]
		rep.Runs = append(rep.Runs, seedRun{Seed: res.Seed, Backend: r.backend, Steps: res.Steps, SimSeconds: res.SimSeconds, HistorySHA256: res.HistorySHA256, Violations: len(res.Violations)})
		rep.Steps += res.Steps
		rep.Decisions += res.Decisions
		if single {
			t.Logf("seed %d (%s): %d steps, history_sha256 %s", res.Seed, r.backend, res.Steps, res.HistorySHA256)
		}
		rep.SimulatedSeconds += res.SimSeconds
		for _, v := range res.Violations {
			rep.Violations = append(rep.Violations, fmt.Sprintf("%s seed %d: %s", r.backend, res.Seed, v))
		}
		if len(res.Violations) > 0 {
			shortest := shrink(t, r, decisions, heal)
			t.Errorf("%s seed %d: %d violations, the first: %s\nreplay: %s SIM_DECISIONS=%d SIM_HEAL_AT=%d (the fewest decisions that still fail; %d in the full run)",
				r.backend, res.Seed, len(res.Violations), res.Violations[0], replayCmd(r), shortest, healAt(decisions, heal), decisions)
			if single {
				for _, l := range res.History {
					t.Log(l)
				}
			}
		}
	}
	rep.WallSeconds = time.Since(start).Seconds()
	t.Logf("%d runs (seeds on %v), %d decisions each: %d steps, %.0f simulated s, %.1f s wall (%.0f decisions/s), %d violations", rep.Seeds, backendsUnderTest(t),
		decisions, rep.Steps, rep.SimulatedSeconds, rep.WallSeconds, float64(rep.Decisions)/rep.WallSeconds, len(rep.Violations))
	if path := os.Getenv("SIM_REPORT"); path != "" {
		if !single || os.Getenv("SEED") == "" {
			for _, b := range backendsUnderTest(t) {
				maps.Copy(rep.Mutants, runMutants(t, b, envInt(t, "SIM_MUTANT_SEEDS", defaultMutantSeeds), decisions))
			}
		}
		if data, err := os.ReadFile(os.Getenv("SIMDDB_DIFF_OUT")); err == nil {
			_ = json.Unmarshal(data, &rep.Differential)
		}
		if data, err := os.ReadFile(os.Getenv("SIMREDIS_DIFF_OUT")); err == nil {
			_ = json.Unmarshal(data, &rep.DifferentialRedis)
		}
		writeReport(t, path, rep)
	}
}

// healAt is the decision where a run's faults stop: heal, or 4/5 of decisions.
func healAt(decisions, heal int) int {
	if heal > 0 {
		return heal
	}
	return decisions * 4 / 5
}

// shrink finds the fewest decisions of seed's workload that still fail (the same workload cut
// short: the heal phase begins where the full run's did).
func shrink(t *testing.T, r run, decisions, heal int) int {
	heal = healAt(decisions, heal)
	fails := func(n int) bool {
		var bad bool
		t.Run(fmt.Sprintf("shrink-%s-seed=%d-decisions=%d", r.backend, r.seed, n), func(t *testing.T) {
			bad = len(Run(t, Config{Seed: r.seed, Decisions: n, HealAt: heal, Backend: r.backend}).Violations) > 0
		})
		return bad
	}
	lo, hi := 0, decisions // fails(hi); !fails(lo) assumed
	for hi-lo > 1 && hi-lo > decisions/64 {
		mid := (lo + hi) / 2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func writeReport(t *testing.T, path string, rep report) {
	t.Helper()
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %s", path)
}

// mutantName is a mutant's name in the report: DynamoDB's as they are, Redis's as redis/NAME.
func mutantName(b, m string) string {
	if backend(b) == backendRedis {
		return "redis/" + m
	}
	return m
}

// runMutants runs every mutant of backend b on seeds 1..n until one catches it.
func runMutants(t *testing.T, b string, n, decisions int) map[string]mutantResult {
	out := map[string]mutantResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for _, m := range MutantsOf(b) {
		wg.Go(func() {
			res := mutantResult{}
			for s := uint64(1); s <= uint64(n) && !res.Caught; s++ {
				sem <- struct{}{}
				t.Run(fmt.Sprintf("mutant=%s/seed=%d", mutantName(b, m), s), func(t *testing.T) {
					if v := Run(t, Config{Seed: s, Decisions: decisions, Mutant: m, Backend: b, StopAtViolation: true}).Violations; len(v) > 0 {
						res = mutantResult{Caught: true, FirstSeed: s}
						t.Logf("caught: %s", v[0])
					}
				})
				<-sem
			}
			mu.Lock()
			out[mutantName(b, m)] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// TestMutantsCaught: every mutant is caught within the default seeds; a simulator that
// catches nothing proves nothing.
func TestMutantsCaught(t *testing.T) {
	if os.Getenv("SEED") != "" {
		t.Skip("SEED replays one seed of the real store")
	}
	decisions := envInt(t, "SIM_DECISIONS", 2000)
	for _, b := range backendsUnderTest(t) {
		for m, r := range runMutants(t, b, envInt(t, "SIM_MUTANT_SEEDS", defaultMutantSeeds), decisions) {
			if !r.Caught {
				t.Errorf("mutant %s: not caught in seeds 1..%d", m, envInt(t, "SIM_MUTANT_SEEDS", defaultMutantSeeds))
			} else {
				t.Logf("mutant %s: caught by seed %d", m, r.FirstSeed)
			}
		}
	}
}

// TestSameSeedSameHistory: a seed repeats its history byte for byte (its hash, and every line),
// other seeds' histories differ, and each determinism mutant (a simulator that breaks the
// promise) makes some seed's two runs part. SIM_REPEAT_SEEDS seeds (default 4) of SIM_DECISIONS
// decisions (default 2,000), each run twice.
func TestSameSeedSameHistory(t *testing.T) {
	if os.Getenv("SEED") != "" {
		t.Skip("SEED replays one seed")
	}
	decisions := envInt(t, "SIM_DECISIONS", 2000)
	var runs []run
	for _, b := range backendsUnderTest(t) {
		def := defaultRepeatSeeds
		if backend(b) == backendRedis {
			def = defaultRedisRepeatSeeds
		}
		for s := range envInt(t, "SIM_REPEAT_SEEDS", def) {
			runs = append(runs, run{uint64(s + 1), b})
		}
	}
	cfg := func(mutant string) func(run) Config {
		return func(r run) Config {
			return Config{Seed: r.seed, Decisions: decisions, Trace: true, Mutant: mutant, Backend: r.backend}
		}
	}
	first, second := runAll(t, runs, cfg("")), runAll(t, runs, cfg(""))
	byHash := map[string]run{}
	for i, a := range first {
		b, r := second[i], runs[i]
		if a.HistorySHA256 != b.HistorySHA256 {
			t.Errorf("%s seed %d: history %s, then %s; first difference:\n%s", r.backend, a.Seed, a.HistorySHA256, b.HistorySHA256, firstDifference(a.History, b.History))
		} else if d := firstDifference(a.History, b.History); len(a.History) != len(b.History) || !strings.HasPrefix(d, "one history") {
			t.Errorf("%s seed %d: equal hashes, unequal histories: %s", r.backend, a.Seed, d)
		}
		if s, ok := byHash[a.HistorySHA256]; ok {
			t.Errorf("%v and %v: the same history %s", s, r, a.HistorySHA256)
		}
		byHash[a.HistorySHA256] = r
	}
	t.Logf("%d runs of %d decisions (seeds on %v), each run twice: the same histories", len(runs), decisions, backendsUnderTest(t))
	// A mutant parts a seed's two runs only when the scheduler happens to order its goroutines
	// differently (17 of 20 seeds at 2,000 decisions): full-length runs, and more seeds than
	// the repeat check's until one parts, so that the check itself is not a coin toss. Each
	// backend's stores are broken apart: the Redis store's seams are its own.
	for _, b := range backendsUnderTest(t) {
		for _, m := range DeterminismMutantsOf(b) {
			if os.Getenv("SIM_DET_MUTANT") != "" && m != os.Getenv("SIM_DET_MUTANT") {
				continue
			}
			caught := false
			for s := uint64(1); s <= 16 && !caught; s++ {
				r := run{s, b}
				xy := runAll(t, []run{r, r}, cfg(m)) // the two runs side by side
				x, y := xy[0], xy[1]
				if x.HistorySHA256 != y.HistorySHA256 {
					t.Logf("determinism mutant %s on %s: seed %d's runs part:\n%s", m, b, s, firstDifference(x.History, y.History))
					caught = true
				}
			}
			if !caught {
				t.Errorf("determinism mutant %s on %s: every seed of 1..16 repeated its history", m, b)
			}
		}
	}
}

// defaultRepeatSeeds is how many seeds TestSameSeedSameHistory runs twice by default.
const (
	defaultRepeatSeeds      = 4
	defaultRedisRepeatSeeds = 2
)

func firstDifference(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			out := ""
			for k := max(0, i-5); k < i; k++ {
				out += "    " + a[k] + "\n"
			}
			return out + "  1st: " + a[i] + "\n  2nd: " + b[i]
		}
	}
	return fmt.Sprintf("one history is a prefix of the other (%d and %d lines)", len(a), len(b))
}
