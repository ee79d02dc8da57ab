package main

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

var local dynamolocal.Lazy

func TestMain(m *testing.M) {
	code := m.Run()
	local.Stop()
	os.Exit(code)
}

// shortExcluded are the policies the short run leaves out, each with why: a class whose fix
// has not landed yet. `make check-exact` checks them all; never weaken a bound instead.
var shortExcluded = map[string]string{
	// Empty since b93bf7e: gate@refund (a token bucket given back after its group was rejected
	// in refund mode) over-admitted by one unit at seeds 200, 220, 611 and 186978473 before the
	// give-back chain landed; those seeds and every run since have been clean.
}

// TestCheckExactShort is `make check-exact` in small: the same orchestrator, 3 real gateway
// processes on DynamoDB Local behind the fault relay, a SIGKILL and restart, offset clocks,
// every algorithm with leases on and off, both group modes, then the memory store on one
// replica, a few seconds each, with the console's resets and exemptions (one exemption in each
// DynamoDB run, one run's left to expire, the other's deleted; in the memory store's run one
// deleted, then one left to expire). It fails on any
// over-admission, any leased unit unaccounted, any upstream request seen twice or without an
// id, a fault kind never injected, or a policy offered less than twice its bound, and names the
// seed that reproduces it (go run ./scripts/check/exact -seed N, see docs/development.md). Then
// the same scenario against the admit-everything mutant (the test gateway
// as that mutant): every policy must over-admit, or the check could not fail for it.
func TestCheckExactShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the check starts 6 gateway processes")
	}
	ddb, err := local.Get()
	if err != nil {
		dynamolocal.Unavailable(t, err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ratelimit-proxy")
	build := exec.Command("go", "build", "-o", bin, "../../../internal/testkit/gateway")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the gateway: %v\n%s", err, out)
	}
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	o.endpoint = ddb.Endpoint
	o.bin = bin
	o.out = filepath.Join(dir, "check")
	o.duration = 6 * time.Second // an exemption's life, with every replica applying it
	o.repeats = 1
	o.warmRounds = 2
	o.settle = 5 * time.Second
	// A few seconds of calls: a higher rate makes every kind show up in each run.
	o.faultRate = 0.04
	o.seed = uint64(time.Now().UnixNano()) % 1e9
	o.logf = t.Logf
	for _, p := range slices.Sorted(maps.Keys(shortExcluded)) {
		why := shortExcluded[p]
		o.exclude = append(o.exclude, p)
		t.Logf("EXCLUDED from the short run: policy %s: %s", p, why)
	}
	t.Logf("seed %d (reproduce: CHECK_EXACT_SEED=%d make check-exact)", o.seed, o.seed)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sum, runs, err := check(ctx, o, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if err := sum.verdict(o.expectedFaults()); err != nil {
		for _, r := range runs {
			t.Logf("run seed %d mode %s: checks %+v, lease units by replica %v", r.Seed, r.Mode, r.Checks, r.UnitsByReplica)
		}
		t.Errorf("seed %d: %v", o.seed, err)
	}
	if sum.Runs != 3 || sum.Decisions == 0 {
		t.Errorf("got %d runs, %d decisions; want 3 runs with decisions", sum.Runs, sum.Decisions)
	}
	for _, k := range append(ddbrelay.FaultKinds, faultKill, faultClockOffset) {
		if sum.FaultsInjected[k] == 0 {
			t.Errorf("fault %s never injected", k)
		}
	}
	if len(sum.OfferedVsBound) != len(policies()) {
		t.Errorf("offered_vs_bound got %v, want every one of the %d policies", sum.OfferedVsBound, len(policies()))
	}

	o.mutantBin = filepath.Join(dir, "ratelimit-proxy-exactmutant")
	if err := buildMutant(ctx, "../../../internal/testkit/gateway", o.mutantBin); err != nil {
		t.Fatal(err)
	}
	o.duration = 3 * time.Second // enough for every policy to over-admit
	st, err := selftest(ctx, o, []string{exactmutant.AdmitEverything}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.verdict(); err != nil {
		t.Errorf("seed %d: %v", o.seed, err)
	}
	// Every policy, the gate included, took part.
	if got, want := len(st.Policies), len(policies())+1; got != want {
		t.Errorf("self-test policies got %d (%v), want %d", got, slices.Sorted(maps.Keys(st.Policies)), want)
	}
}

// TestCheckExactRedisShort is `CHECK_EXACT_STORE=redis make check-exact` in small: 3 real gateway
// processes on one redis-server behind TCP fault relays (connections reset before a command,
// answers lost after it ran, delays), offset clocks, redis-server SIGKILLed and restarted empty,
// the console's resets and exemptions; two runs of 14 s (consecutive seeds: one exemption left
// to expire and one deleted in each). It fails on any over-admission beyond the restart's (every
// key full again), a fault kind never injected or a policy offered less than twice its bound.
// Then the admit-everything mutant on Redis: every policy must over-admit.
func TestCheckExactRedisShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the check starts 3 gateway processes and redis-server")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ratelimit-proxy")
	build := exec.Command("go", "build", "-o", bin, "../../../internal/testkit/gateway")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the gateway: %v\n%s", err, out)
	}
	o, err := parseFlags([]string{"-modes", redisMode})
	if err != nil {
		t.Fatal(err)
	}
	o.bin = bin
	o.out = filepath.Join(dir, "check")
	o.duration = 14 * time.Second // an exemption's life and a deletion, with every replica applying them
	o.repeats = 2
	o.settle = 2 * time.Second
	o.faultRate = 0.01 // a tenth of the relays' slices faulty: the console's calls mostly get through
	o.seed = uint64(time.Now().UnixNano()) % 1e9
	o.logf = t.Logf
	t.Logf("seed %d (reproduce: CHECK_EXACT_STORE=redis CHECK_EXACT_SEED=%d make check-exact)", o.seed, o.seed)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sum, _, err := check(ctx, o, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if err := sum.verdict(o.expectedFaults()); err != nil {
		t.Errorf("seed %d: %v", o.seed, err)
	}
	for _, k := range append(append([]ddbrelay.FaultKind(nil), redisFaultKinds...), faultKill, faultClockOffset) {
		if sum.FaultsInjected[k] == 0 {
			t.Errorf("fault %s never injected", k)
		}
	}
	o.mutantBin = filepath.Join(dir, "ratelimit-proxy-exactmutant")
	if err := buildMutant(ctx, "../../../internal/testkit/gateway", o.mutantBin); err != nil {
		t.Fatal(err)
	}
	o.duration = 4 * time.Second
	st, err := selftest(ctx, o, []string{exactmutant.AdmitEverything}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.verdict(); err != nil {
		t.Errorf("seed %d: %v", o.seed, err)
	}
	if got, want := len(st.Policies), len(policies())+1; got != want {
		t.Errorf("self-test policies got %d (%v), want %d", got, slices.Sorted(maps.Keys(st.Policies)), want)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
