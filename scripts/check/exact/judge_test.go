package main

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
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
	ok := Summary{FaultsInjected: map[ddbrelay.FaultKind]int64{}, Console: consoleStats{Resets: 3, ResetsFailed: 1, ExemptionsExpired: 1, ExemptionsDeleted: 1}}
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
	idle := ok
	idle.Console.ExemptionsDeleted = 0
	for _, tc := range []struct {
		s    Summary
		want string
	}{{over, "over_admits 1"}, {lost, "units_unaccounted 3"}, {missing, "fault drop_response was never injected"},
		{unknown, "unknown_upstream 2"}, {light, "policy sw was offered 1.90x its bound"},
		{idle, "0 deleted"}} {
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
	judge(&res, ps, recs, reps, noConsole())
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
	judge(&res, ps, recs, reps, noConsole())
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
	spans, _, _ := spansOf(policies(), recs, noConsole(), 0, 0)
	got := offeredVsBound(policies(), recs, spans)
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

func noConsole() *bounds {
	return &bounds{windows: map[string][]exactcheck.Window{}, live: map[string][]exactcheck.Window{}}
}

// TestJudgeCutsAtResets: 10 admitted before a reset and 10 after it, inside one window of fw,
// pass (the reset made the key full where it landed); the same 20 with the reset not seen
// land are 10 over. The reset's landing comes from the relay's watch, attributed to the
// reset's policy by its items' key digest.
func TestJudgeCutsAtResets(t *testing.T) {
	base := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return base.Add(d) }
	var recs []*record
	for i := range 20 {
		sent := at(200*time.Millisecond + time.Duration(i)*80*time.Millisecond)
		if i >= 10 {
			sent = sent.Add(200 * time.Millisecond) // after the reset at [1.0 s, 1.1 s]
		}
		recs = append(recs, &record{id: int64(i), policy: "fw", cost: 1, sent: sent, recv: sent.Add(5 * time.Millisecond),
			status: 200, enter: sent.Add(2 * time.Millisecond), exit: sent.Add(3 * time.Millisecond)})
	}
	var ps []policy
	for _, p := range policies() {
		if p.name == "fw" {
			ps = append(ps, p)
		}
	}
	reps := []*replica{{offset: 0}}
	cl := &consoleLog{resets: []resetRec{{Policy: "fw", Sent: at(time.Second), Answered: at(1100 * time.Millisecond), Status: 200}}}
	cl.watch(ddbrelay.Write{Op: "UpdateItem", Items: []ddbrelay.Item{{Table: "t", Key: "abcd#w123"}},
		Body: []byte(`{"UpdateExpression":"SET #count = :zero"}`), Sent: at(1010 * time.Millisecond), Answered: at(1020 * time.Millisecond)})
	cl.watch(ddbrelay.Write{Op: "UpdateItem", Items: []ddbrelay.Item{{Table: "t", Key: "abcd#w123"}},
		Body: []byte(`{"UpdateExpression":"ADD #count :one"}`), Sent: at(1010 * time.Millisecond), Answered: at(1020 * time.Millisecond)})
	b, st, err := consoleBounds(cl, false, map[string]string{"abcd": "fw"}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Resets != 1 || st.ResetWrites != 1 || len(b.windows["fw"]) != 1 {
		t.Fatalf("got stats %+v, windows %v; want one reset, one reset write (the take is none)", st, b.windows)
	}
	res := runResult{Other: map[int]int{}}
	judge(&res, ps, recs, reps, b)
	if res.Checks[0].Excess != 0 || res.Console.DecisionsJudged != 20 {
		t.Errorf("10 and 10 around a reset: checks %+v, judged %d; want no excess, 20 judged", res.Checks, res.Console.DecisionsJudged)
	}
	res = runResult{Other: map[int]int{}}
	judge(&res, ps, recs, reps, noConsole())
	if res.Checks[0].Excess != 10 {
		t.Errorf("without the reset: checks %+v, want excess 10", res.Checks)
	}
	// A reset that answered 200 with no reset write seen: the judge would miss it.
	cl = &consoleLog{resets: []resetRec{{Policy: "fw", Sent: at(time.Second), Answered: at(1100 * time.Millisecond), Status: 200}}}
	if _, _, err := consoleBounds(cl, false, nil, 0, 0); err == nil || !strings.Contains(err.Error(), "resetWrite") {
		t.Errorf("a reset without its write: got %v, want an error naming resetWrite", err)
	}
}

// TestConsoleBoundsOfExemptions: an expired exemption's limit applies from when every replica
// listed it to its expiry's window (widened by the clock offsets); a deleted one's until its
// delete was sent; a failed one is judged nowhere in its life; one the load ended before its
// expiry is judged as one expired, and not counted as expired.
func TestConsoleBoundsOfExemptions(t *testing.T) {
	base := time.Date(2026, 12, 3, 20, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	cl := &consoleLog{exempts: []*exemptRec{
		{Policy: "fx", Created: 201, CreateSent: at(1), LiveFrom: at(2), ExpiresAt: at(4), Outcome: "expired"},
		{Policy: "fx", Created: 201, CreateSent: at(5), LiveFrom: at(6), ExpiresAt: at(9), DeleteSent: at(7), GoneAt: at(8), Deleted: 200, Outcome: "deleted"},
		{Policy: "fx", Created: 503, CreateSent: at(10), ExpiresAt: at(12), Outcome: "failed"},
		// The load ended before its expiry: judged as an expired one, not counted as one.
		{Policy: "fx", Created: 201, CreateSent: at(13), LiveFrom: at(13.5), ExpiresAt: at(16), Outcome: "ended"},
	}}
	off := 100 * time.Millisecond
	b, st, err := consoleBounds(cl, false, nil, -off, off)
	if err != nil {
		t.Fatal(err)
	}
	if st.ExemptionsCreated != 3 || st.ExemptionsExpired != 1 || st.ExemptionsDeleted != 1 || st.ExemptionsFailed != 1 {
		t.Errorf("stats got %+v", st)
	}
	wantLive := []exactcheck.Window{{From: at(2), To: at(4).Add(-off - expiryMargin)}, {From: at(6), To: at(7)}, {From: at(13.5), To: at(16).Add(-off - expiryMargin)}}
	if !slices.Equal(b.live["fx"], wantLive) {
		t.Errorf("live got %v, want %v", b.live["fx"], wantLive)
	}
	var fx policy
	for _, p := range policies() {
		if p.name == "fx" {
			fx = p
		}
	}
	spans := exactcheck.Spans(at(0), at(14), b.windowsOf("fx"), b.limitAt(fx, fx.limit), 0)
	var limits []int64
	for _, sp := range spans {
		limits = append(limits, sp.Limit.Limit)
	}
	if want := []int64{10, 15, 10, 15, 10, 10, 15}; !slices.Equal(limits, want) {
		t.Errorf("span limits got %v (%+v), want %v", limits, spans, want)
	}
}

// TestResetWritesRecognised: the reset writes of internal/dynamo in both forms, and as the
// reset mutants send them, are reset writes; a take, a release and a reap of a concurrency
// item, a give-back, and a counter's take, are not.
func TestResetWritesRecognised(t *testing.T) {
	for body, want := range map[string]bool{
		`{"Key":{"pk":{"S":"ab#g"}},"UpdateExpression":"REMOVE #tat, #lv, #w1, #c1"}`:                                                      true,
		`{"Key":{"pk":{"S":"ab#c"}},"UpdateExpression":"REMOVE #count, #l0, #l1"}`:                                                         true,
		`{"Key":{"pk":{"S":"ab#w9"}},"UpdateExpression":"SET #count = :zero"}`:                                                             true,
		`{"ConditionExpression":"attribute_exists(#l0) AND attribute_exists(#l1)","UpdateExpression":"ADD #count :minus REMOVE #l0, #l1"}`: true,
		`{"ConditionExpression":"attribute_exists(#l0)","UpdateExpression":"ADD #count :minus REMOVE #l0"}`:                                true,
		`{"ConditionExpression":"attribute_exists(#l)","UpdateExpression":"ADD #count :minus REMOVE #l"}`:                                  false,
		`{"ConditionExpression":"#l0 = :e0 AND #l1 = :e1","UpdateExpression":"ADD #count :minus REMOVE #l0, #l1"}`:                         false,
		`{"UpdateExpression":"ADD #count :one SET #l = :exp, #ttl = :ttl"}`:                                                                false,
		`{"UpdateExpression":"ADD #count :one SET #ttl = :ttl"}`:                                                                           false,
		`{"UpdateExpression":"ADD #count :minus, #g :gs"}`:                                                                                 false,
		`{"UpdateExpression":"ADD #count :minus SET #g = :gs, #e = :next"}`:                                                                false,
		// The reset mutants' forms: no slot removed, no condition.
		`{"Key":{"pk":{"S":"ab#c"}},"UpdateExpression":"ADD #count :minus"}`:                 true,
		`{"Key":{"pk":{"S":"ab#c"}},"UpdateExpression":"ADD #count :minus REMOVE #l0, #l1"}`: true,
	} {
		if got := isResetWrite([]byte(body)); got != want {
			t.Errorf("isResetWrite(%s) got %t, want %t", body, got, want)
		}
		conc := want && (strings.Contains(body, "REMOVE #count") || strings.Contains(body, ":minus")) ||
			strings.Contains(body, "#l0 = :e0") // a reap: the pattern cannot tell it from a reset

		if got := concurrencyReset.MatchString(body); got != conc {
			t.Errorf("concurrencyReset(%s) got %t, want %t", body, got, conc)
		}
	}
}

// TestKeyDigestsOfTheConfig: every policy of a replica's configuration has a digest of its own
// (the key its items begin with), computed as the gateway computes it.
func TestKeyDigestsOfTheConfig(t *testing.T) {
	path := t.TempDir() + "/replica.yaml"
	ps := policies()
	cfg := gatewayConfig("127.0.0.1:1", "127.0.0.1:2", "http://127.0.0.1:3", "check-exact-t", "http://127.0.0.1:4", "refund", time.Second, ps, true, true)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ds, err := keyDigests(path, ps, func(k string) string {
		if k == adminTokenEnv {
			return "0123456789abcdef0123456789abcdef"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != len(ps) {
		t.Fatalf("digests got %d (%v), want one per policy (%d)", len(ds), ds, len(ps))
	}
	for d, p := range ds {
		if len(d) != 32 || strings.Contains(d, "#") {
			t.Errorf("policy %s: digest %q, want 32 hex digits (a 16-byte key)", p, d)
		}
	}
}
