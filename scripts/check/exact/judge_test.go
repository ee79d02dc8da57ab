package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

func TestParseLeaseUnits(t *testing.T) {
	page := `# HELP ratelimit_dynamodb_lease_units_total Units of leased capacity
# TYPE ratelimit_dynamodb_lease_units_total counter
ratelimit_dynamodb_lease_units_total{outcome="expired"} 2
ratelimit_dynamodb_lease_units_total{outcome="leased"} 17
ratelimit_dynamodb_lease_units_total{outcome="refunded"} 5
ratelimit_dynamodb_lease_units_total{outcome="spent"} 9
ratelimit_dynamodb_leases_total{result="granted"} 4
`
	u := parseLeaseUnits([]byte(page))
	if u["leased"] != 17 || u["spent"] != 9 || u["refunded"] != 5 || u["expired"] != 2 || len(u) != 4 {
		t.Fatalf("got %v, want leased 17, spent 9, refunded 5, expired 2", u)
	}
	if got := outstanding(u); got != 1 {
		t.Errorf("outstanding got %v, want 17-9-5-2 = 1", got)
	}
}

func TestVerdictFailsOnEachClass(t *testing.T) {
	kinds := append(ddbrelay.FaultKinds, faultKill, faultClockOffset)
	ok := Summary{FaultsInjected: map[ddbrelay.FaultKind]int64{}}
	for _, k := range kinds {
		ok.FaultsInjected[k] = 1
	}
	if err := ok.verdict(kinds); err != nil {
		t.Fatalf("a clean summary: %v", err)
	}
	over := ok
	over.OverAdmits = 1
	lost := ok
	lost.UnitsUnaccounted = 3
	missing := ok
	missing.FaultsInjected = map[ddbrelay.FaultKind]int64{ddbrelay.FaultReset: 1}
	unknown := ok
	unknown.UnknownUpstream = 2
	light := ok
	light.OfferedVsBound = map[string]float64{"tb": 2.5, "sw": 1.9}
	for _, tc := range []struct {
		s    Summary
		want string
	}{{over, "over_admits 1"}, {lost, "units_unaccounted 3"}, {missing, "fault drop_response was never injected"},
		{unknown, "unknown_upstream 2"}, {light, "policy sw was offered 1.90x its bound"}} {
		if err := tc.s.verdict(kinds); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("verdict got %v, want one saying %q", err, tc.want)
		}
	}
}

// TestJudgeCatchesAnOverAdmissionInARecordedHistory feeds judge what the generator and the
// upstream record: the fixed window of 10 per 2 s admitting 11 inside one window is caught,
// and a decision the upstream never saw (a 503, a request lost) never counts.
func TestJudgeCatchesAnOverAdmissionInARecordedHistory(t *testing.T) {
	base := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC) // a window starts here
	var recs []*record
	for i := range 11 {
		sent := base.Add(100*time.Millisecond + time.Duration(i)*150*time.Millisecond)
		recs = append(recs, &record{id: int64(i), policy: "fw", cost: 1, sent: sent, recv: sent.Add(5 * time.Millisecond),
			status: 200, enter: sent.Add(2 * time.Millisecond), exit: sent.Add(3 * time.Millisecond)})
	}
	recs = append(recs, &record{id: 99, policy: "fw", cost: 1, sent: base.Add(time.Second), recv: base.Add(time.Second), status: 503})
	var ps []policy
	for _, p := range policies() {
		if p.name == "fw" {
			ps = append(ps, p)
		}
	}
	reps := []*replica{{offset: 0}, {offset: 100 * time.Millisecond}, {offset: -100 * time.Millisecond}}
	var res runResult
	res.Other = map[int]int{}
	judge(&res, ps, recs, reps)
	if len(res.Checks) != 1 || res.Checks[0].Excess != 1 || res.Checks[0].Admitted != 11 {
		t.Fatalf("checks got %+v, want fw with 11 admitted, excess 1", res.Checks)
	}
	if res.Decisions != 11 || res.Other[503] != 1 {
		t.Errorf("decisions %d, other %v; want 11 and one 503", res.Decisions, res.Other)
	}
	// The same 11 with the last one sent before the window's sure part: within ±100 ms of
	// skew the checker cannot place it, and says nothing.
	recs[0].sent, recs[0].enter = base.Add(50*time.Millisecond), base.Add(60*time.Millisecond)
	res = runResult{Other: map[int]int{}}
	judge(&res, ps, recs, reps)
	if res.Checks[0].Excess != 0 {
		t.Errorf("with one decision in the skew margin: excess %d, want 0", res.Checks[0].Excess)
	}
}

// TestOfferedVsBound: what was sent (answered or not) against each kind's bound over the run.
func TestOfferedVsBound(t *testing.T) {
	base := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	var recs []*record
	send := func(policy string, n int, cost int64, over time.Duration) {
		for i := range n {
			recs = append(recs, &record{policy: policy, cost: cost, sent: base.Add(time.Duration(i) * over / time.Duration(n-1))})
		}
	}
	const s10 = 10 * time.Second
	send("tb", 100, 3, s10)  // 300 units in 10 s against 5 + 10 x 10
	send("fw", 40, 1, s10/2) // 40 units in [0 s, 5 s] (the run lasts 10 s): 5 windows of 10
	send("sw", 11, 1, s10)   // 11 units in 10 s: 5 windows of 10
	send("q", 30, 1, s10)    // 30 against one day's 10
	send("cc", 500, 1, s10)  // 50/s held 100 ms: 5 in flight against 2
	got := offeredVsBound(policies(), recs)
	want := map[string]loadRatio{
		"tb":  {Offered: 300, Bound: 105, Ratio: 2.857},
		"fw":  {Offered: 40, Bound: 50, Ratio: 0.8},
		"sw":  {Offered: 11, Bound: 50, Ratio: 0.22},
		"q":   {Offered: 30, Bound: 10, Ratio: 3},
		"cc":  {Offered: 5, Bound: 2, Ratio: 2.5},
		"fwl": {Bound: 60}, "tbl": {Bound: 106}, "lb": {Bound: 84},
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: got %+v, want %+v", p, got[p], w)
		}
	}
}

func TestPulses(t *testing.T) {
	cycle := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC) // a multiple of 4 s
	for _, tc := range []struct {
		at time.Duration
		in bool
	}{{0, false}, {199 * time.Millisecond, false}, {200 * time.Millisecond, true}, {1999 * time.Millisecond, true}, {2 * time.Second, false}, {3999 * time.Millisecond, false}} {
		if got := inPulse(cycle.Add(tc.at)); got != tc.in {
			t.Errorf("inPulse(cycle + %v) got %t, want %t", tc.at, got, tc.in)
		}
		if got, want := pulseStart(cycle.Add(tc.at)), cycle.Add(pulseFrom); !got.Equal(want) {
			t.Errorf("pulseStart(cycle + %v) got %v, want %v", tc.at, got, want)
		}
	}
}

// TestSelfTestVerdict: the self-test fails on an uncaught mutant, on a control run (the real
// store under a mutant's faults) that over-admits, and on a policy admit-everything could not
// push over its bound; it passes when none of these holds.
func TestSelfTestVerdict(t *testing.T) {
	good := func() SelfTest {
		return SelfTest{
			Policies: map[string]*policySelfTest{"fw": {OverAdmits: 5}},
			Mutants: map[string]*mutantSelfTest{
				exactmutant.AdmitEverything:     {Caught: true},
				exactmutant.ResendWithoutMarker: {Caught: true, Control: &controlRun{}},
			},
		}
	}
	if err := good().verdict(); err != nil {
		t.Fatalf("a self-test that caught everything: %v", err)
	}
	for name, spoil := range map[string]func(*SelfTest){
		"uncaught mutant":     func(s *SelfTest) { s.Mutants[exactmutant.ResendWithoutMarker].Caught = false },
		"control over-admits": func(s *SelfTest) { s.Mutants[exactmutant.ResendWithoutMarker].Control.OverAdmits = 1 },
		"policy cannot fail":  func(s *SelfTest) { s.Policies["fw"].OverAdmits = 0 },
	} {
		s := good()
		spoil(&s)
		if s.verdict() == nil {
			t.Errorf("%s: the verdict passed", name)
		}
	}
}
