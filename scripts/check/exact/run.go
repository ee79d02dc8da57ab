package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// options are one check's knobs.
type options struct {
	replicas     int
	duration     time.Duration // load per run
	modes        []string      // group modes, one run each per repeat
	repeats      int
	seed         uint64
	faultRate    float64
	faultDelay   time.Duration
	faultKinds   []ddbrelay.FaultKind
	storeDelay   time.Duration // every DynamoDB call waits this long more
	storeJitter  time.Duration // plus a uniform random part in [0, this]
	offset       time.Duration // replica i runs with offset (0, +offset, -offset)[i%3]
	kill         bool
	clockCorrect bool // the replicas' store.dynamodb.clock.correct
	load         float64
	storeTimeout time.Duration
	exclude      []string // policies left out (see the short run): "name", or "name@mode" in one mode only
	bin          string
	// mutant is the self-test's mutant of this run ("": none); mutantBin the test gateway that
	// the code mutants run as (RATELIMIT_EXACT_MUTANT).
	mutant    string
	mutantBin string
	selftest  bool     // run the mutants instead of the check
	mutants   []string // the mutants the self-test runs
	// extraFaults are tried before the faultKinds' rules (the self-test's targeted faults).
	extraFaults []ddbrelay.Fault
	out         string
	endpoint    string        // a running DynamoDB Local; "" starts one
	warmRounds  int           // at most this many one-second rounds of warm-up writes
	settle      time.Duration // how long idle replicas get to account for every leased unit
	logf        func(format string, args ...any)
}

// runResult is one run: the history judged, and what the run injected.
type runResult struct {
	Seed            uint64                       `json:"seed"`
	Mode            string                       `json:"mode"`
	Offsets         []string                     `json:"offsets"`
	Decisions       int                          `json:"decisions"`
	NoAnswer        int                          `json:"no_answer"`
	Other           map[int]int                  `json:"other_statuses"`
	Faults          map[ddbrelay.FaultKind]int64 `json:"faults"`
	Killed          bool                         `json:"killed"`
	Checks          []checkResult                `json:"checks"`
	Widths          widthMS                      `json:"decision_interval_ms"`
	UnitsOpen       float64                      `json:"units_unaccounted"`
	UnitsByReplica  []map[string]float64         `json:"lease_units_by_replica"`
	UnitsAtKill     float64                      `json:"units_held_at_kill"`
	UnknownUpstream int64                        `json:"unknown_upstream"`
	Load            map[string]loadRatio         `json:"offered_vs_bound"`
	// StoreCalls are the replicas' DynamoDB calls by op (ratelimit_store_requests_total, the
	// restarted replica's since its restart): refund and release count the give-backs sent.
	StoreCalls map[string]float64 `json:"store_calls"`
	Admitted   int64              `json:"admitted_units"`
	Possible   float64            `json:"possible_units"`
	StoreP99MS float64            `json:"store_p99_ms"`
}

type widthMS struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// checkResult is one bucket's worst interval.
type checkResult struct {
	Policy   string  `json:"policy"`
	Key      string  `json:"key,omitempty"`
	Admitted int64   `json:"admitted"`
	Bound    float64 `json:"bound"`
	Excess   int64   `json:"excess"`
	FromMS   float64 `json:"from_ms"` // since the run's first request
	ToMS     float64 `json:"to_ms"`
}

// oneRun runs one scenario: a table, a fault relay, replicas, the load, a kill, the check.
func oneRun(ctx context.Context, o options, ddbEndpoint string, seed uint64, mode string) (res runResult, err error) {
	res = runResult{Seed: seed, Mode: mode, Other: map[int]int{}}
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	client, err := dynamolocal.NewClient(ctx, ddbEndpoint)
	if err != nil {
		return res, err
	}
	table := "check-exact-" + randomHex(4)
	if err := dynamo.CreateTable(ctx, client, table); err != nil {
		return res, err
	}
	p50, rounds, err := dynamolocal.WarmUp(ctx, client, table, "check-exact-warm-up", o.warmRounds)
	if err != nil {
		return res, err
	}
	o.logf("DynamoDB Local warmed up: UpdateItem p50 %v after %d s of writes", p50.Round(10*time.Microsecond), rounds)

	faults := append([]ddbrelay.Fault(nil), o.extraFaults...)
	for _, k := range o.faultKinds {
		f := ddbrelay.Fault{Kind: k, Rate: o.faultRate, Delay: o.faultDelay}
		switch k {
		case ddbrelay.FaultLateWrite:
			f.Hold = 2 * o.storeTimeout // a client without a deadline of its own learns nothing for this long
		case ddbrelay.FaultReorder:
			f.Hold = o.storeTimeout / 2 // a later write of the replica has this long to overtake it
		}
		faults = append(faults, f)
	}
	relay, err := ddbrelay.New(ddbEndpoint, ddbrelay.Options{Faults: faults, Seed: seed, Delay: o.storeDelay, Jitter: o.storeJitter})
	if err != nil {
		return res, err
	}
	// One listener per replica: the relay tells their writes apart (reorder swaps two writes
	// of one replica).
	relayURLs := make([]string, o.replicas)
	for i := range relayURLs {
		u, closeRelay, err := harness.Serve(relay.Source(fmt.Sprintf("replica-%d", i)))
		if err != nil {
			return res, err
		}
		relayURLs[i] = u
		cleanups = append(cleanups, closeRelay)
	}
	up := newUpstream()
	upURL, closeUp, err := harness.Serve(up)
	if err != nil {
		return res, err
	}
	cleanups = append(cleanups, closeUp)

	excluded := func(name string) bool {
		return slices.Contains(o.exclude, name) || slices.Contains(o.exclude, name+"@"+mode)
	}
	var ps []policy
	for _, p := range policies() {
		if !excluded(p.name) {
			ps = append(ps, p)
		}
	}
	gate := !excluded("gate")
	dir := filepath.Join(o.out, fmt.Sprintf("run-%d-%s", seed, mode))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	reps := make([]*replica, o.replicas)
	offsets := []time.Duration{0, o.offset, -o.offset}
	bin, env := o.bin, []string(nil)
	if o.mutant != "" && o.mutant != exactmutant.ClockAheadUncorrected {
		bin, env = o.mutantBin, []string{exactmutant.Env + "=" + o.mutant}
	}
	addrs, err := harness.FreeAddrs(2 * o.replicas)
	if err != nil {
		return res, err
	}
	for i := range reps {
		r := &replica{i: i, offset: offsets[i%3], proxy: addrs[2*i], admin: addrs[2*i+1], bin: bin, env: env, client: newClient(),
			cfgPath: filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i)), logPath: filepath.Join(dir, fmt.Sprintf("replica-%d.log", i))}
		correct := o.clockCorrect
		if o.mutant == exactmutant.ClockAheadUncorrected && i == 1 {
			// Judged as if its clock were within the offsets, it runs 2 s ahead, uncorrected.
			r.ahead, correct = clockAhead, false
		}
		cfg := gatewayConfig(r.proxy, r.admin, upURL, table, relayURLs[i], mode, o.storeTimeout, ps, gate, correct)
		if err := os.WriteFile(r.cfgPath, []byte(cfg), 0o600); err != nil {
			return res, err
		}
		if err := r.start(); err != nil {
			return res, err
		}
		reps[i] = r
		res.Offsets = append(res.Offsets, r.offset.String())
		cleanups = append(cleanups, r.stop)
	}
	for _, r := range reps {
		if err := r.waitReady(ctx, time.Minute); err != nil {
			return res, err
		}
	}
	o.logf("run seed %d, mode %s: %d replicas ready (clock offsets %v), table %s; %v of load", seed, mode, len(reps), res.Offsets, table, o.duration)

	gen := &generator{reps: reps, ps: ps, gate: gate, load: o.load, rng: mrand.New(mrand.NewPCG(seed, 1))}
	loadCtx, stopLoad := context.WithTimeout(ctx, o.duration)
	defer stopLoad()
	done := make(chan struct{})
	go func() { gen.run(loadCtx); close(done) }()

	if o.kill {
		// Mid-load, replica 0 dies without a chance to give anything back, and comes back.
		t := time.NewTimer(o.duration * 2 / 5)
		select {
		case <-t.C:
			victim := reps[0]
			if u, err := victim.leaseUnits(ctx); err == nil {
				res.UnitsAtKill = outstanding(u)
			}
			victim.kill()
			res.Killed = true
			if err := victim.start(); err != nil {
				return res, err
			}
			if err := victim.waitReady(ctx, time.Minute); err != nil {
				return res, err
			}
			o.logf("replica 0 killed (SIGKILL) and restarted; it held %.0f leased units", res.UnitsAtKill)
		case <-done:
		}
		t.Stop()
	}
	<-done
	if err := ctx.Err(); err != nil {
		return res, err
	}
	for _, r := range reps {
		if !r.alive() {
			return res, fmt.Errorf("replica %d exited during the load (log: %s)", r.i, r.logPath)
		}
	}

	// Every unit leased is spent, given back or expired: idle replicas settle their leases
	// within a lease's lifetime and a give-back's round trip; poll until the sum closes.
	deadline := time.Now().Add(o.settle)
	for {
		res.UnitsOpen, res.UnitsByReplica = 0, nil
		for _, r := range reps {
			u, err := r.leaseUnits(ctx)
			if err != nil {
				return res, err
			}
			res.UnitsOpen += math.Abs(outstanding(u))
			res.UnitsByReplica = append(res.UnitsByReplica, u)
		}
		if res.UnitsOpen == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling processes, with a deadline
		}
	}
	res.StoreCalls = map[string]float64{}
	for _, r := range reps {
		if calls, err := r.storeCalls(ctx); err == nil {
			for op, n := range calls {
				res.StoreCalls[op] += n
			}
		}
	}
	relay.Close() // the copies still held land now, before the relay's figures are read
	st := relay.Stats()
	res.Faults = st.Faults
	if res.Killed {
		res.Faults[faultKill]++
	}
	for _, r := range reps {
		if r.offset != 0 {
			res.Faults[faultClockOffset]++
		}
	}
	res.StoreP99MS = float64(st.Latency.P99) / 1e6
	up.mu.Lock()
	res.UnknownUpstream = up.extra
	for _, rec := range gen.records {
		if t, ok := up.seen[rec.id]; ok {
			rec.enter, rec.exit = t[0], t[1]
		}
	}
	up.mu.Unlock()
	judge(&res, ps, gen.records, reps)
	return res, nil
}

// judge checks every bucket of the run's history.
func judge(res *runResult, ps []policy, recs []*record, reps []*replica) {
	var minOff, maxOff time.Duration
	for _, r := range reps {
		minOff, maxOff = min(minOff, r.offset), max(maxOff, r.offset)
	}
	res.Load = offeredVsBound(ps, recs)
	chargeOn := map[string]bool{}
	for _, p := range ps {
		chargeOn[p.name] = p.chargeOn
	}
	var first time.Time
	byBucket := map[[2]string][]exactcheck.Decision{}
	intervals := map[string][]exactcheck.Interval{}
	offered := map[string]int64{}
	var all []exactcheck.Decision
	for _, rec := range recs {
		if first.IsZero() || rec.sent.Before(first) {
			first = rec.sent
		}
		switch {
		case rec.status == 0:
			res.NoAnswer++
		case rec.status == http.StatusOK || rec.status == http.StatusTooManyRequests || rec.status == http.StatusUnauthorized:
			res.Decisions++
		default:
			res.Other[rec.status]++
		}
		if rec.by != "gate" && rec.status != 0 {
			offered[rec.policy] += rec.cost
		}
		if rec.enter.IsZero() || (chargeOn[rec.policy] && !charged(rec.id)) {
			continue // not admitted, or admitted and given back (charge_on)
		}
		// The decision was made after the request was sent and before the upstream saw it.
		d := exactcheck.Decision{Replica: rec.replica, Key: rec.policy, Start: rec.sent, End: rec.enter, Cost: rec.cost}
		all = append(all, d)
		byBucket[[2]string{rec.policy, ""}] = append(byBucket[[2]string{rec.policy, ""}], d)
		if rec.gate != "" {
			g := d
			g.Cost = 1
			byBucket[[2]string{"gate", rec.gate}] = append(byBucket[[2]string{"gate", rec.gate}], g)
		}
		intervals[rec.policy] = append(intervals[rec.policy], exactcheck.Interval{Enter: rec.enter, Exit: rec.exit})
	}
	w := exactcheck.Widths(all)
	res.Widths = widthMS{P50: ms(w.P50), P99: ms(w.P99), Max: ms(w.Max)}
	since := func(t time.Time) float64 {
		if t.IsZero() {
			return 0 // a bucket without admissions has no worst interval
		}
		return ms(t.Sub(first))
	}
	add := func(policy, key string, v exactcheck.Violation) {
		res.Checks = append(res.Checks, checkResult{Policy: policy, Key: key, Admitted: v.Admitted, Bound: v.Bound, Excess: v.Excess(), FromMS: since(v.From), ToMS: since(v.To)})
	}
	var last time.Time
	for _, rec := range recs {
		if rec.recv.After(last) {
			last = rec.recv
		}
	}
	span := last.Sub(first)
	for _, p := range ps {
		if p.concurrency > 0 {
			add(p.name, "", exactcheck.CheckConcurrency(p.concurrency, intervals[p.name]))
			continue
		}
		l := p.limit
		l.MinOffset, l.MaxOffset = minOff, maxOff
		ds := byBucket[[2]string{p.name, ""}]
		add(p.name, "", exactcheck.Check(l, ds))
		var admitted int64
		for _, d := range ds {
			admitted += d.Cost
		}
		res.Admitted += admitted
		res.Possible += math.Min(float64(offered[p.name]), capacity(p.limit, span))
	}
	gl := exactcheck.Limit{Kind: exactcheck.GCRA, Rate: gateRate, Burst: gateBurst, MinOffset: minOff, MaxOffset: maxOff}
	keys := []string{}
	for k := range byBucket {
		if k[0] == "gate" {
			keys = append(keys, k[1])
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		add("gate", k, exactcheck.Check(gl, byBucket[[2]string{"gate", k}]))
	}
}

// loadRatio is one policy's offered load against its bound over the intervals the checker
// judges: Offered and Bound in units over the run (a concurrency limit: requests in flight on
// average, and the limit), Ratio = Offered / Bound. Below 1 a gateway that limits nothing
// would pass; the check asks for at least minLoadRatio.
type loadRatio struct {
	Offered float64 `json:"offered"`
	Bound   float64 `json:"bound"`
	Ratio   float64 `json:"ratio"`
}

// minLoadRatio is how far past its bound every policy must be offered.
const minLoadRatio = 2

// offeredVsBound computes each policy's loadRatio from what the generator sent (answered or
// not), over the span from the run's first request to its last: a bucket's burst + rate x span,
// a window's limit x span / window (at least one window's).
func offeredVsBound(ps []policy, recs []*record) map[string]loadRatio {
	var first, last time.Time
	units := map[string]float64{}
	reqs := map[string]float64{}
	chargeOn := map[string]bool{}
	for _, p := range ps {
		chargeOn[p.name] = p.chargeOn
	}
	for _, rec := range recs {
		if first.IsZero() || rec.sent.Before(first) {
			first = rec.sent
		}
		if rec.sent.After(last) {
			last = rec.sent
		}
		if chargeOn[rec.policy] && !charged(rec.id) {
			continue // its charge is given back: no load on the bound
		}
		units[rec.policy] += float64(rec.cost)
		reqs[rec.policy]++
	}
	span := last.Sub(first).Seconds()
	out := map[string]loadRatio{}
	if span <= 0 {
		return out
	}
	for _, p := range ps {
		var lr loadRatio
		l := p.limit
		switch {
		case p.concurrency > 0:
			lr = loadRatio{Offered: reqs[p.name] * concurrencyHold.Seconds() / span, Bound: float64(p.concurrency)}
		case l.Kind == exactcheck.GCRA:
			lr = loadRatio{Offered: units[p.name], Bound: l.Burst + l.Rate*span}
		default: // a window's limit per window, over the windows the run lasts (at least one)
			lr = loadRatio{Offered: units[p.name], Bound: float64(l.Limit) * max(1, span/l.Window.Seconds())}
		}
		lr.Offered, lr.Bound = round3(lr.Offered), round3(lr.Bound)
		if lr.Bound > 0 {
			lr.Ratio = round3(lr.Offered / lr.Bound)
		}
		out[p.name] = lr
	}
	return out
}

// capacity is the most a bucket may admit over a span: what under-admission is measured against.
func capacity(l exactcheck.Limit, span time.Duration) float64 {
	switch l.Kind {
	case exactcheck.GCRA:
		return l.Burst + l.Rate*span.Seconds()
	case exactcheck.SlidingWindow:
		return float64(l.Limit) * math.Ceil(span.Seconds()/l.Window.Seconds())
	default:
		return float64(l.Limit) * (math.Floor(span.Seconds()/l.Window.Seconds()) + 1)
	}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
