package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

// The self-test (CHECK_EXACT_SELFTEST=1): the same scenarios, each run against a mutant, which
// the check must catch. A checker that passes a store admitting everything proves nothing.

// mutants are the self-test's mutants, in the order they run. The code mutants live in
// internal/testkit/exactmutant, which the test gateway becomes (internal/testkit/gateway); the clock mutant
// is a configuration: replica 1 runs clockAhead ahead of its judged offset, with its clock
// correction off.
var mutants = []string{
	exactmutant.AdmitEverything,
	exactmutant.GiveBackTwice,
	exactmutant.ResendWithoutMarker,
	exactmutant.ClockAheadUncorrected,
	exactmutant.ResetLeavesSlots,
	exactmutant.ResetUnconditional,
	exactmutant.ExemptionOutlivesExpiry,
}

// resendDropRate is the share of give-backs whose answers the re-send mutant's run loses after
// the write landed, on top of the check's faults. Only give-backs (the writes that carry their
// own id, ":gid"): losing charges' answers too made the store look down, and a run whose
// requests are mostly denied rarely fills a window enough to show one unit given back twice
// (0 or 1 over-admits a minute, caught by chance).
const resendDropRate = 0.5

// giveBackBody matches the request body of a give-back (internal/dynamo: every form carries its
// own id as :gid).
var giveBackBody = regexp.MustCompile(`":gid"`)

// clockAhead is how far the clock mutant's replica runs ahead.
const clockAhead = 2 * time.Second

// SelfTest is selftest.json.
type SelfTest struct {
	// Policies: each policy under the admit-everything mutant (over_admits must be > 0), its
	// offered load against its bound there, and the mutants it caught.
	Policies map[string]*policySelfTest `json:"policies"`
	// Mutants: whether each was caught, and by which policies.
	Mutants   map[string]*mutantSelfTest `json:"mutants"`
	DurationS float64                    `json:"duration_s"`
}

type policySelfTest struct {
	OverAdmits     int64    `json:"over_admits"`
	OfferedVsBound float64  `json:"offered_vs_bound"`
	Catches        []string `json:"catches"`
}

type mutantSelfTest struct {
	Caught     bool             `json:"caught"`
	CaughtBy   []string         `json:"caught_by"`
	OverAdmits map[string]int64 `json:"over_admits"` // by policy
	Seed       uint64           `json:"seed"`
	Mode       string           `json:"mode"`
	Decisions  int              `json:"decisions"`
	// Control is the run of the real store with the mutant's extra faults, where it has any:
	// its over-admits must be 0.
	Control *controlRun `json:"control,omitempty"`
}

type controlRun struct {
	OverAdmits int64 `json:"over_admits"`
	Decisions  int   `json:"decisions"`
}

// buildMutant builds the test gateway (internal/testkit/gateway, which becomes the mutant that
// RATELIMIT_EXACT_MUTANT names) from the package directory pkg.
func buildMutant(ctx context.Context, pkg, dst string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dst, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the mutant gateway: %w\n%s", err, out)
	}
	return nil
}

// selftest runs each of names (mutants) once, in the first of o.modes, and writes
// selftest.json under o.out.
func selftest(ctx context.Context, o options, names []string, stdout io.Writer) (SelfTest, error) {
	start := time.Now()
	st := SelfTest{Policies: map[string]*policySelfTest{}, Mutants: map[string]*mutantSelfTest{}}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return st, err
	}
	endpoint, stopDDB, err := dynamoEndpoint(ctx, o)
	if err != nil {
		return st, err
	}
	defer stopDDB()
	mode := o.modes[0]
	seed := o.seed
	for _, name := range names {
		mo := o
		mo.mutant = name
		if name == exactmutant.ResendWithoutMarker {
			// Its fault is a lost answer to a give-back: this run loses many of them.
			mo.extraFaults = []ddbrelay.Fault{{Kind: ddbrelay.FaultDropResponse, Op: "UpdateItem", Body: giveBackBody, Rate: resendDropRate}}
		}
		res, err := oneRun(ctx, mo, endpoint, seed, mode)
		if err != nil {
			return st, fmt.Errorf("mutant %s, seed %d mode %s: %w", name, seed, mode, err)
		}
		m := &mutantSelfTest{OverAdmits: map[string]int64{}, Seed: seed, Mode: mode, Decisions: res.Decisions}
		for _, c := range res.Checks {
			m.OverAdmits[c.Policy] += c.Excess
		}
		if len(mo.extraFaults) > 0 {
			// The control: the same faults and seed on the real store. Were it to over-admit
			// too, the mutant's run would say nothing about the mutant.
			co := mo
			co.mutant = ""
			cres, err := oneRun(ctx, co, endpoint, seed, mode)
			if err != nil {
				return st, fmt.Errorf("control of mutant %s, seed %d mode %s: %w", name, seed, mode, err)
			}
			m.Control = &controlRun{Decisions: cres.Decisions}
			for _, c := range cres.Checks {
				m.Control.OverAdmits += c.Excess
			}
			o.logf("control of %s (the real store, same faults): %d decisions, over-admits %d", name, cres.Decisions, m.Control.OverAdmits)
		}
		for _, p := range slices.Sorted(maps.Keys(m.OverAdmits)) {
			pt := st.Policies[p]
			if pt == nil {
				pt = &policySelfTest{Catches: []string{}}
				st.Policies[p] = pt
			}
			if name == exactmutant.AdmitEverything {
				pt.OverAdmits = m.OverAdmits[p]
				pt.OfferedVsBound = res.Load[p].Ratio
			}
			if m.OverAdmits[p] > 0 {
				m.CaughtBy = append(m.CaughtBy, p)
				pt.Catches = append(pt.Catches, name)
			}
		}
		m.Caught = len(m.CaughtBy) > 0
		st.Mutants[name] = m
		o.logf("mutant %s (seed %d mode %s): %d decisions, give-backs sent %v, over-admits by policy %v: caught %t", name, seed, mode, res.Decisions, res.StoreCalls["refund"]+res.StoreCalls["release"], m.OverAdmits, m.Caught)
		seed++
	}
	st.DurationS = round3(time.Since(start).Seconds())
	if err := writeJSON(filepath.Join(o.out, "selftest.json"), st); err != nil {
		return st, err
	}
	fmt.Fprint(stdout, st.table())
	return st, nil
}

// verdict fails when a mutant went uncaught, or a policy did not over-admit under
// admit-everything.
func (s SelfTest) verdict() error {
	var errs []error
	for _, m := range slices.Sorted(maps.Keys(s.Mutants)) {
		if !s.Mutants[m].Caught {
			errs = append(errs, fmt.Errorf("mutant %s was not caught by any policy", m))
		}
		if c := s.Mutants[m].Control; c != nil && c.OverAdmits > 0 {
			errs = append(errs, fmt.Errorf("the real store over-admitted %d under mutant %s's faults: the gateway is not exact there", c.OverAdmits, m))
		}
	}
	if _, ok := s.Mutants[exactmutant.AdmitEverything]; ok {
		for _, p := range slices.Sorted(maps.Keys(s.Policies)) {
			if s.Policies[p].OverAdmits == 0 {
				errs = append(errs, fmt.Errorf("policy %s shows no over-admission under %s: the check cannot fail for it", p, exactmutant.AdmitEverything))
			}
		}
	}
	return errors.Join(errs...)
}

// table is the self-test as text: a row per mutant, a column per policy, the over-admits.
func (s SelfTest) table() string {
	ps := slices.Sorted(maps.Keys(s.Policies))
	out := fmt.Sprintf("%-42s", "mutant \\ policy")
	for _, p := range ps {
		out += fmt.Sprintf(" %6s", p)
	}
	out += "  caught\n"
	for _, m := range mutants {
		r, ok := s.Mutants[m]
		if !ok {
			continue
		}
		out += fmt.Sprintf("%-42s", m)
		for _, p := range ps {
			out += fmt.Sprintf(" %6d", r.OverAdmits[p])
		}
		out += fmt.Sprintf("  %t\n", r.Caught)
	}
	return out
}
