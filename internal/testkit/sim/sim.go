// Package sim is a deterministic simulator of the rate limiter's shared store.
//
// One run (Run) puts several replicas of the real engine (the real policy set, the real DynamoDB
// store code with its coalescing, leases, give-backs and console writes, and the real memory
// store) in one process under testing/synctest's fake clock, against a simulated DynamoDB
// (package simddb), and drives them from one seed: the workload (keys, costs, groups, charge_on
// outcomes, resets, exemptions), the faults (lost answers, lost requests, writes applied after
// their client gave up, duplicates landing after other writes, reordering, throttling,
// transaction conflicts, timeouts, a replica crashing and restarting, a clock stepping by
// seconds, a store outage that sweeps what TTL may delete) and every interleaving: which
// pending call lands next, when time moves. Every store call waits until the driver delivers
// it, so the driver alone decides the order of everything the store sees. The history (the
// driver's actions and every call's masked description and answer) is hashed; the same seed
// gives the same hash. Invariants are checked as the run goes (see check.go) and the exact
// bounds of every key at checkpoints and at the end (package exactcheck, the judge of make
// check-exact).
//
// A store joins the simulator as a backend (see backend in replica.go): the Redis store will
// be one more, beside "dynamodb" and "memory".
package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simddb"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simredis"
)

// Config is one run.
type Config struct {
	Seed uint64
	// Decisions is how many decisions the run makes (default 2,000).
	Decisions int
	// Mutant names a broken store to run instead of the real one (see mutants.go); empty: none.
	Mutant string
	// Trace keeps the history's lines in the Result (a failing run's report).
	Trace bool
	// HealAt is the decision from which no fault is injected (default 4/5 of Decisions): a
	// shrunk run keeps its full run's.
	HealAt int
	// StopAtViolation ends the run at its first violation (its stores drained): a mutant's run
	// needs no more to be caught.
	StopAtViolation bool
	// Backend is the shared store of the run's three shared replicas: "dynamodb" (the default)
	// or "redis"; a fourth replica runs the memory store either way.
	Backend string
}

// Result is what a run did and found.
type Result struct {
	Seed       uint64
	Decisions  int
	Steps      int
	SimSeconds float64
	// HistorySHA256 is the hash of the whole history: equal for equal seeds.
	HistorySHA256 string
	Violations    []string
	History       []string
	// Admitted and Rejected count the decisions that ended so (errors are neither).
	Admitted, Rejected, Errors int
}

// Run runs one seed inside a synctest bubble of t.
func Run(t *testing.T, cfg Config) Result {
	t.Helper()
	var res Result
	var rdb *simredis.Server
	if backend(cfg.Backend) == backendRedis {
		// Outside the bubble: the server's goroutines block on sockets (see simredis).
		var err error
		if rdb, err = simredis.Start(bubbleStart); err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
	}
	synctest.Test(t, func(t *testing.T) {
		w, err := newWorld(cfg, rdb)
		if err != nil {
			t.Fatal(err)
		}
		res = w.run()
		w.turns.close()
	})
	return res
}

var debug = os.Getenv("SIM_DEBUG") != ""

// bubbleStart is the fake clock's start in every synctest bubble.
var bubbleStart = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Table is the simulated table's name.
const table = "sim"

const (
	storeTimeout = 500 * time.Millisecond
	lateWrites   = 5 * time.Second
	// maxOrphanAge is how long a call whose client gave up may still land: within the
	// store's LateWrites, as the store requires of the network.
	maxOrphanAge = 4 * time.Second
	slotLease    = 3 * time.Second
	// maxOffset bounds a replica clock's offset from the true clock.
	maxOffset = 750 * time.Millisecond
	// readEvery is the console's read of resets and exemptions on every replica.
	readEvery = time.Second
)

type world struct {
	cfg Config
	rng *rand.Rand
	db  *simddb.DB
	rdb *simredis.Server // the Redis backend's server (nil on DynamoDB's)
	// shared is the backend of the three shared replicas.
	shared backend
	set    *policy.Set
	mode   dynamo.Mode
	deny   bool
	start  time.Time

	mu      sync.Mutex // pending and the orphans' flags; the decisions' completions
	pending []*call
	ended   []*decision

	reps   []*replica
	outage bool
	// faultRate is the share of deliveries that go wrong while faults are on; healAt is the
	// decision count from which none do (the liveness phase).
	faultRate float64
	healAt    int
	pace      time.Duration // the typical time step

	hist  hash.Hash
	line  []byte // record's buffer
	lines []string
	steps int

	agenda  agenda
	seq     int
	started int // decisions started
	// closers counts the goroutines the drain waits for besides decisions (releases, console
	// calls, stores closing); exemptionID numbers the exemptions.
	closers     int
	closing     bool
	exemptionID int
	quiet       int // quiet resets so far
	inflight    int
	judge       *judge
	res         Result
	// turns runs the goroutines one at a time (see turns.go).
	turns *turns
}

func newWorld(cfg Config, rdb *simredis.Server) (*world, error) {
	if cfg.Decisions <= 0 {
		cfg.Decisions = 2000
	}
	set, err := compilePolicies()
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5117))
	w := &world{cfg: cfg, rng: rng, db: simddb.New(), rdb: rdb, set: set, start: time.Now(), hist: sha256.New(), turns: newTurns()}
	w.shared = backendDynamo
	if rdb != nil {
		w.shared = backendRedis
	}
	w.mode = dynamo.Mode(rng.IntN(2))
	w.deny = rng.IntN(2) == 0
	w.faultRate = []float64{0, 0.02, 0.08, 0.2}[rng.IntN(4)]
	w.healAt = cfg.Decisions * 4 / 5
	if cfg.HealAt > 0 {
		w.healAt = cfg.HealAt
	}
	w.pace = []time.Duration{2 * time.Millisecond, 8 * time.Millisecond, 25 * time.Millisecond}[rng.IntN(3)]
	w.judge = newJudge(w)
	w.db.OnWrite = w.onWrite
	w.record("seed %d backend %s mode %s deny %v faults %.2f pace %s mutant %q", cfg.Seed, w.shared, w.mode, w.deny, w.faultRate, w.pace, cfg.Mutant)
	for i := range 3 {
		w.reps = append(w.reps, w.newReplica(i, w.shared))
	}
	w.reps = append(w.reps, w.newReplica(3, backendMemory))
	for _, r := range w.reps {
		r.start(w)
		w.at(w.start.Add(readEvery+time.Duration(r.id)*time.Millisecond*7), func() { w.readConsole(r) })
	}
	return w, nil
}

// record adds a line to the history.
func (w *world) record(format string, args ...any) {
	b := strconv.AppendInt(w.line[:0], int64(w.steps), 10)
	b = append(b, ' ')
	b = append(b, time.Since(w.start).String()...)
	b = append(b, ' ')
	b = fmt.Appendf(b, format, args...)
	if w.cfg.Trace {
		w.lines = append(w.lines, string(b))
	}
	b = append(b, '\n')
	w.hist.Write(b)
	w.line = b
}

// stopped reports whether the run ends early: a violation with StopAtViolation.
func (w *world) stopped() bool { return w.cfg.StopAtViolation && len(w.judge.violations) > 0 }

func (w *world) faulty() bool { return w.faultRate > 0 && w.started < w.healAt }

// run drives the world until its decisions are made, heals, checks liveness, drains and
// judges.
func (w *world) run() Result {
	for (w.started < w.cfg.Decisions || w.inflight > 0) && !w.stopped() {
		w.step()
	}
	w.record("heal")
	w.healAll()
	if !w.stopped() {
		w.liveness()
	}
	w.drain()
	if !w.stopped() {
		w.judge.final()
	}
	w.res.Seed = w.cfg.Seed
	w.res.Decisions = w.started
	w.res.Steps = w.steps
	w.res.SimSeconds = time.Since(w.start).Seconds()
	w.res.HistorySHA256 = hex.EncodeToString(w.hist.Sum(nil))
	w.res.History = w.lines
	w.res.Violations = w.judge.violations
	return w.res
}

// settle waits until every goroutine is blocked, then records what ended.
func (w *world) settle() {
	w.turns.quiesce()
	w.collect()
}

// step is one action of the driver.
func (w *world) step() {
	w.settle()
	w.steps++
	if debug && w.steps%20000 == 0 {
		fmt.Fprintf(os.Stderr, "step %d started %d inflight %d pending %d sim %s agenda %d\n", w.steps, w.started, w.inflight, len(w.pending), time.Since(w.start), len(w.agenda))
	}
	w.dropOldOrphans()
	if ev, ok := w.agenda.due(time.Now()); ok {
		ev.f()
		return
	}
	pending := w.sortedPending()
	r := w.rng.Float64()
	switch {
	case len(pending) > 0 && r < 0.7:
		c := pending[w.rng.IntN(len(pending))]
		w.deliver(c, w.pickFault(c))
	case w.started < w.cfg.Decisions && w.inflight < 16 && r < 0.88:
		w.decide()
	case r < 0.882 && w.faulty():
		w.chaos()
	case r < 0.886:
		w.console()
	default:
		w.advance()
	}
}

// advance moves simulated time: mostly by a fraction of the pace, now and then by up to a
// second and a half (timeouts, windows rolling over, leases expiring), never past the next
// agenda event.
func (w *world) advance() {
	var d time.Duration
	switch r := w.rng.Float64(); {
	case r < 0.9:
		d = time.Duration(w.rng.Int64N(int64(w.pace))) + 1
	case r < 0.995:
		d = time.Duration(w.rng.Int64N(int64(10 * w.pace)))
	default:
		d = time.Duration(w.rng.Int64N(int64(1500 * time.Millisecond)))
	}
	if next, ok := w.agenda.next(); ok && time.Now().Add(d).After(next) {
		d = max(time.Until(next), 0)
	}
	if d > 0 {
		time.Sleep(d)
	}
}

func (w *world) pickFault(c *call) fault {
	if c.orphan {
		if w.rng.IntN(3) == 0 {
			return dropped
		}
		return deliverOK
	}
	if !w.faulty() || w.rng.Float64() >= w.faultRate {
		return deliverOK
	}
	if _, ok := c.in.(redisCmds); ok {
		return []fault{lostAnswer, lostRequest, applyLater}[w.rng.IntN(3)]
	}
	return []fault{lostAnswer, lostRequest, applyLater, throttled, conflicted}[w.rng.IntN(5)]
}

func (w *world) dropOldOrphans() {
	cut := time.Now().Add(-maxOrphanAge)
	w.mu.Lock()
	kept := w.pending[:0]
	for _, c := range w.pending {
		if !c.orphan || c.sent.After(cut) {
			kept = append(kept, c)
		}
	}
	w.pending = kept
	w.mu.Unlock()
}

// chaos is one fault of the whole system: a replica crashes (and restarts later), a clock
// steps, or the store has an outage (and sweeps what TTL may delete).
func (w *world) chaos() {
	switch w.rng.IntN(4) {
	case 0:
		r := w.reps[w.rng.IntN(len(w.reps))]
		if !r.alive {
			return
		}
		w.crash(r)
		w.at(time.Now().Add(time.Duration(w.rng.Int64N(int64(2*time.Second)))+time.Millisecond), func() { w.restart(r) })
	case 1:
		r := w.reps[w.rng.IntN(len(w.reps))]
		// A step of up to a second and a half either way, the offset kept within maxOffset
		// (beyond it, the concurrency slots' leases are not promised to hold).
		step := time.Duration(w.rng.Int64N(int64(3*time.Second))) - 1500*time.Millisecond
		r.offset = min(max(r.offset+step, -maxOffset), maxOffset)
		r.off.Store(int64(r.offset))
		w.judge.offset(r)
		w.record("clock r%d steps %s to %s", r.id, step, r.offset)
	case 2:
		if w.outage {
			return
		}
		w.outage = true
		if w.rdb != nil {
			w.redisRestart()
		} else {
			n := w.db.Sweep(time.Now())
			w.record("store outage (TTL swept %d items)", n)
		}
		w.at(time.Now().Add(time.Duration(w.rng.Int64N(int64(800*time.Millisecond)))+time.Millisecond), func() {
			w.outage = false
			w.record("store back")
		})
	default:
		if w.rdb != nil {
			r := w.reps[w.rng.IntN(3)]
			w.resetConnection(r)
			return
		}
		w.record("sweep %d", w.db.Sweep(time.Now()))
	}
}

// healAll ends every fault: outages, dead replicas. Clock offsets stay (they are no fault).
func (w *world) healAll() {
	w.outage = false
	for _, r := range w.reps {
		if !r.alive {
			w.restart(r)
		}
	}
	w.agenda.dropRestarts()
}

// drain delivers every call and lets every goroutine end: the leases are given back, the
// stores closed.
func (w *world) drain() {
	w.closing = true
	for _, r := range w.reps {
		w.closeReplica(r, true)
	}
	for i := 0; ; i++ {
		w.settle()
		pending := w.sortedPending()
		w.mu.Lock()
		closers := w.closers
		w.mu.Unlock()
		if len(pending) == 0 && w.inflight == 0 && closers == 0 {
			break
		}
		if len(pending) > 0 {
			w.deliver(pending[0], deliverOK)
			continue
		}
		time.Sleep(10 * time.Millisecond)
		if i > 1_000_000 {
			panic("sim: drain does not end")
		}
	}
	w.settle()
	w.judge.leases()
}
