package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
)

// policy is one algorithm under test: a path prefix of its own, one global bucket, a limit the
// checker knows, and the load offered to it.
type policy struct {
	name string // also the path prefix: /name/
	yaml string // the policy's body in the gateway's config
	// limit is the bound the checker holds it to (its kind; the offsets are filled per run).
	limit exactcheck.Limit
	// concurrency: the in-flight limit, checked at the upstream; 0 for the others.
	concurrency int64
	// offered is the open-loop rate (requests/s) at load 1.
	offered float64
	// postCost is the cost of a POST (a `costs` route); 0: the generator sends only GETs.
	postCost int64
	lease    bool
	// pulse: the load comes in pulses, only in [pulseFrom, pulseTo) of every pulseCycle of the
	// recording clock (at the same average rate): every pulse starts on windows nobody has
	// touched for a while, the transient where a clock running ahead over-admits (a steady load
	// hides it: whoever comes first fills each window), and on buckets that were idle.
	pulse bool
	// chargeOn: the policy charges only answers 401 (charge_on), which the upstream gives to
	// every third request (charged); the others' charges are given back (Release), so every
	// run sends give-backs by the thousand. The bound holds the charged answers.
	chargeOn bool
	// hold: how long the upstream holds a concurrency policy's request (its slot).
	hold time.Duration
	// leaseYAML is the policy's pool and lease, on the DynamoDB store only (the memory store
	// has no leases: the policy is checked there as a plain bucket).
	leaseYAML string
	// reset: the console workload resets the policy's key while the load runs (console.go).
	reset bool
	// exempt: the console workload gives the key exemptions (created, expiring, deleted)
	// of this limit (exemptLimit), one at a time.
	exempt bool
}

// charged reports whether the upstream answers request id 401: a charge_on policy keeps its
// charge.
func charged(id int64) bool { return id%3 == 0 }

// The pulses: the first of every two 2 s windows (aligned to the Unix epoch, as fixed windows
// are), clear of the ±100 ms clock offsets of a normal run.
const (
	pulseCycle = 4 * time.Second
	pulseFrom  = 200 * time.Millisecond
	pulseTo    = 2 * time.Second
)

// pulseStart is the start of the pulse of t's cycle.
func pulseStart(t time.Time) time.Time {
	t = t.Round(0) // wall clock only: every instant of a cycle gives the same start
	return t.Add(-time.Duration(t.UnixNano() % int64(pulseCycle))).Add(pulseFrom)
}

// inPulse reports whether t lies in a pulse.
func inPulse(t time.Time) bool {
	at := time.Duration(t.UnixNano() % int64(pulseCycle))
	return at >= pulseFrom && at < pulseTo
}

// The gate policy (left out with -exclude gate): a token bucket per X-Gate value, which a part of the requests
// carries. Most of those it rejects after the other policy of their group has charged, so every
// run exercises the group's give-back (refund mode) or transaction (transaction mode).
const (
	gateRate   = 2.0
	gateBurst  = 3.0
	gateValues = 5
	gateShare  = 0.3
)

// policies are every algorithm, with leases on and off where leases apply (token bucket and
// fixed window). Limits are small, and each policy is offered about 3 times its bound at load
// 1 (the default) over the intervals the checker judges, in a run of a few seconds as in one of
// a minute: a gateway that limits nothing must over-admit on every policy, or the check proves
// nothing for it (the self-test's admit-everything mutant shows it does). loadRatio computes
// the offered load against the bound of every run.
func policies() []policy {
	const w = 2 * time.Second
	return []policy{
		// Cost 1.5 on average (a quarter are POSTs of cost 3): 36 units/s against 10/s.
		{name: "tb", reset: true, limit: exactcheck.Limit{Kind: exactcheck.GCRA, Rate: 10, Burst: 5}, offered: 24, postCost: 3, yaml: `
    algorithm: token_bucket
    rate: 10/s
    burst: 5
    costs: [{methods: [POST], cost: 3}]`},
		{name: "tbl", lease: true, limit: exactcheck.Limit{Kind: exactcheck.GCRA, Rate: 10, Burst: 6}, offered: 36, yaml: `
    algorithm: token_bucket
    rate: 10/s
    burst: 6`, leaseYAML: `
    pool: check-tbl
    lease: {enabled: true, shards: 2}`},
		// A leaky bucket's decisions are GCRA with tau = (burst + 1) x T: burst waiting behind the
		// one served.
		{name: "lb", reset: true, limit: exactcheck.Limit{Kind: exactcheck.GCRA, Rate: 8, Burst: 4}, offered: 28, yaml: `
    algorithm: leaky_bucket
    rate: 8/s
    burst: 3`},
		// Cost 1.25 on average, in pulses: 90 units in every other 2 s window against 10 (the
		// spans the resets cut may hold an idle window's part: 14 was 1.89x at a short run).
		{name: "fw", reset: true, limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 10, Window: w}, offered: 18, postCost: 2, pulse: true, yaml: `
    algorithm: fixed_window
    limit: 10
    window: 2s
    costs: [{methods: [POST], cost: 2}]`},
		{name: "fwl", lease: true, limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 12, Window: w}, offered: 18, yaml: `
    algorithm: fixed_window
    limit: 12
    window: 2s`, leaseYAML: `
    pool: check-fwl
    lease: {enabled: true, shards: 2}`},
		{name: "sw", reset: true, limit: exactcheck.Limit{Kind: exactcheck.SlidingWindow, Limit: 10, Window: w}, offered: 15, yaml: `
    algorithm: sliding_window
    limit: 10
    window: 2s`},
		// charge_on: a third of the answers are charged: 10 charged units/s against 2.5/s.
		{name: "co", reset: true, chargeOn: true, limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 5, Window: w}, offered: 30, yaml: `
    algorithm: fixed_window
    limit: 5
    window: 2s
    charge_on: [401]`},
		// One UTC day: the whole run is one period (a run that crosses midnight UTC checks two).
		{name: "q", reset: true, limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 10, Window: 24 * time.Hour}, offered: 10, yaml: `
    algorithm: quota
    limit: 10
    period: day`},
		// 60/s held 100 ms each: 6 in flight against 2.
		{name: "cc", reset: true, concurrency: 2, hold: 100 * time.Millisecond, offered: 60, yaml: `
    algorithm: concurrency
    limit: 2`},
		// 150/s held 2 s each: 300 in flight against 120, so that a reset lands with more than
		// 100 slots taken (issue 32 item 1: a reset that removed the first 100 only).
		{name: "cr", reset: true, concurrency: 120, hold: 2 * time.Second, offered: 150, yaml: `
    algorithm: concurrency
    limit: 120`},
		// The console's exemptions: 45/s against 10 per window, and against the 15 of an
		// exemption (exemptLimit) while one is live, in spans as short as a second (30/s gave
		// 1.93x on a short run whose spans were mostly exempt, below the 2x the verdict needs).
		{name: "fx", exempt: true, limit: exactcheck.Limit{Kind: exactcheck.FixedWindow, Limit: 10, Window: w}, offered: 45, yaml: `
    algorithm: fixed_window
    limit: 10
    window: 2s`},
	}
}

// exemptLimit is the limit of the exemptions the console workload gives a policy's key.
const exemptLimit = 15

// holdOf is how long the upstream holds a request of the policy at path (0: it answers at once).
func holdOf(ps []policy, path string) time.Duration {
	for _, p := range ps {
		if p.concurrency > 0 && strings.HasPrefix(path, "/"+p.name+"/") {
			return p.hold
		}
	}
	return 0
}

// adminTokenEnv names the variable holding the console's write token in every replica.
const adminTokenEnv = "CHECK_EXACT_ADMIN_TOKEN"

// gatewayConfig is one replica's configuration; mode memoryMode puts it on the memory store
// (table, endpoint and correct unused).
func gatewayConfig(proxy, admin, upstream, table, endpoint, mode string, storeTimeout time.Duration, ps []policy, gate, correct bool) string {
	var b strings.Builder
	store := fmt.Sprintf(`  backend: dynamodb
  on_error: deny          # an error must never count as admitted
  timeout: %s
  dynamodb: {table: %s, endpoint: %s, region: us-east-1, create_table: false, mode: %s, slot_lease: 3s, clock: {correct: %t}}`,
		storeTimeout, table, endpoint, mode, correct)
	switch mode {
	case memoryMode:
		store = "  backend: memory"
	case redisMode:
		store = fmt.Sprintf("  backend: redis\n  on_error: deny          # an error must never count as admitted\n  timeout: %s\n  redis: {url: '%s'}", storeTimeout, endpoint)
	}
	fmt.Fprintf(&b, `listen: %s
admin_listen: %s
upstream: %s
log:
  level: warn
admin:
  token_env: %s
store:
%s
policies:
`, proxy, admin, upstream, adminTokenEnv, store)
	if gate {
		fmt.Fprintf(&b, "  - name: gate\n    key: header:X-Gate\n    algorithm: token_bucket\n    rate: %v/s\n    burst: %v\n", gateRate, gateBurst)
	}
	for _, p := range ps {
		lease := p.leaseYAML
		if mode == memoryMode || mode == redisMode {
			lease = ""
		}
		fmt.Fprintf(&b, "  - name: %s\n    key: global\n    match: {path_prefix: /%s/}%s%s\n", p.name, p.name, p.yaml, lease)
	}
	return b.String()
}
