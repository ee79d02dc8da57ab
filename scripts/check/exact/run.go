package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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
	Console    consoleStats       `json:"console"`
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
	memory := mode == memoryMode
	redisRun := mode == redisMode
	cl := &consoleLog{}
	table := "check-exact-" + randomHex(4)
	if !memory && !redisRun {
		client, err := dynamolocal.NewClient(ctx, ddbEndpoint)
		if err != nil {
			return res, err
		}
		if err := dynamo.CreateTable(ctx, client, table); err != nil {
			return res, err
		}
		p50, rounds, err := dynamolocal.WarmUp(ctx, client, table, "check-exact-warm-up", o.warmRounds)
		if err != nil {
			return res, err
		}
		o.logf("DynamoDB Local warmed up: UpdateItem p50 %v after %d s of writes", p50.Round(10*time.Microsecond), rounds)
	}

	faults := append([]ddbrelay.Fault(nil), o.extraFaults...)
	if slices.Contains(o.faultKinds, ddbrelay.FaultDelay) {
		// A reset of a concurrency item reads its slots, then writes: half of those writes
		// wait a while, during which other replicas take and release slots (issue 32 item 2:
		// a reset that writes what it read, unconditionally, races them).
		faults = append(faults, ddbrelay.Fault{Kind: ddbrelay.FaultDelay, Op: "UpdateItem", Item: regexp.MustCompile(`#c$`),
			Body: concurrencyReset, Rate: resetDelayRate, Delay: resetDelay})
	}
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
	if memory || redisRun {
		faults = nil // no DynamoDB calls to fault (Redis's faults are its own relay's)
	}
	relay, err := ddbrelay.New(cmp.Or(ddbEndpoint, "http://127.0.0.1:1"), ddbrelay.Options{Faults: faults, Seed: seed, Delay: o.storeDelay, Jitter: o.storeJitter, Watch: cl.watch})
	if err != nil {
		return res, err
	}
	// One listener per replica: the relay tells their writes apart (reorder swaps two writes
	// of one replica). The memory store is one replica: its counts are the process's own, so
	// a fleet of them would have a bound of replicas x limit, which says nothing of exactness.
	replicas := o.replicas
	if memory {
		replicas = 1
	}
	relayURLs := make([]string, replicas)
	for i := range relayURLs {
		u, closeRelay, err := harness.Serve(relay.Source(fmt.Sprintf("replica-%d", i)))
		if err != nil {
			return res, err
		}
		relayURLs[i] = u
		cleanups = append(cleanups, closeRelay)
	}
	var rf *redisFaults
	if redisRun {
		rf, err = startRedisFaults(ctx, o, seed, filepath.Join(o.out, fmt.Sprintf("redis-%d", seed)), replicas)
		if err != nil {
			return res, err
		}
		cleanups = append(cleanups, rf.close)
		copy(relayURLs, rf.urls)
	}
	up := newUpstream(policies())
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
	reps := make([]*replica, replicas)
	offsets := []time.Duration{0, o.offset, -o.offset}
	token := randomHex(16)
	bin, env := o.bin, []string{adminTokenEnv + "=" + token}
	if o.mutant != "" && o.mutant != exactmutant.ClockAheadUncorrected {
		bin, env = o.mutantBin, append(env, exactmutant.Env+"="+o.mutant)
	}
	addrs, err := harness.FreeAddrs(2 * replicas)
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
	var minOff, maxOff time.Duration
	for _, r := range reps {
		minOff, maxOff = min(minOff, r.offset), max(maxOff, r.offset)
	}
	con := &console{reps: reps, ps: ps, token: token, seed: seed, rng: mrand.New(mrand.NewPCG(seed, 2)), log: cl,
		minOff: minOff, maxOff: maxOff, storeTimeout: o.storeTimeout, client: newClient()}
	if memory {
		con.storeTimeout = 0 // exemptions are the replica's own: no read puts a deleted one back
		con.memory = true
	}
	loadCtx, stopLoad := context.WithTimeout(ctx, o.duration)
	defer stopLoad()
	done, consoleDone := make(chan struct{}), make(chan struct{})
	go func() { gen.run(loadCtx); close(done) }()
	go func() { con.run(loadCtx); close(consoleDone) }()
	var restart exactcheck.Window // the memory store's restart: every key full again

	if o.kill {
		// Mid-load, replica 0 dies without a chance to give anything back, and comes back.
		// The memory store's replica dies near the load's end: its exemptions die with it, and
		// the console's (one deleted, then one left to expire) come first. On Redis the store
		// itself dies (SIGKILL, no persistence: every count and exemption gone) and restarts.
		killAt := o.duration * 2 / 5
		if memory || redisRun {
			killAt = o.duration * 19 / 20
		}
		t := time.NewTimer(killAt)
		select {
		case <-t.C:
			if redisRun {
				restart.From = time.Now()
				if err := rf.restart(ctx); err != nil {
					return res, err
				}
				restart.To = time.Now()
				res.Killed = true
				o.logf("redis-server killed (SIGKILL) and restarted empty")
				break
			}
			victim := reps[0]
			if u, err := victim.leaseUnits(ctx); err == nil {
				res.UnitsAtKill = outstanding(u)
			}
			restart.From = time.Now()
			victim.kill()
			res.Killed = true
			if err := victim.start(); err != nil {
				return res, err
			}
			if err := victim.waitReady(ctx, time.Minute); err != nil {
				return res, err
			}
			restart.To = time.Now()
			o.logf("replica 0 killed (SIGKILL) and restarted; it held %.0f leased units", res.UnitsAtKill)
		case <-done:
		}
		t.Stop()
	}
	<-done
	<-consoleDone
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
	digests, err := keyDigests(reps[0].cfgPath, ps, func(k string) string {
		if k == adminTokenEnv {
			return token
		}
		return os.Getenv(k)
	})
	if err != nil {
		return res, fmt.Errorf("the policies' key digests: %w", err)
	}
	// On Redis a reset is one DEL from the replica the console asked, landing within its call,
	// as the memory store's does.
	b, cs, err := consoleBounds(cl, memory || redisRun, digests, minOff, maxOff)
	if err != nil {
		return res, err
	}
	if (memory || redisRun) && res.Killed {
		b.all = append(b.all, restart)
	}
	if rf != nil {
		for k, n := range rf.stats() {
			res.Faults[k] += n
		}
	}
	res.Console = cs
	judge(&res, ps, gen.records, reps, b)
	return res, nil
}
