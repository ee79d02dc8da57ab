package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

// backend names a store the replicas run. The DynamoDB store's replicas share the simulated
// table; a memory store is its replica's own. A new store (Redis) joins as one more backend:
// newStore builds it on the simulated network (its own simulated server beside simddb), console
// maps the operators' calls to it, and the judge keys its buckets by backend.
type backend string

const (
	backendDynamo backend = "dynamodb"
	backendMemory backend = "memory"
)

// console is what the operators' console calls on a store (the DynamoDB and Redis stores have
// it all; the memory store resets only).
type console interface {
	Reset(ctx context.Context, now time.Time, c bucket.Charge) error
}

// exemptions is the console's shared exemptions on a store (DynamoDB's, Redis's).
type exemptions interface {
	PutExemption(ctx context.Context, id string, data []byte, expires time.Time, most int) (bool, error)
	DeleteExemption(ctx context.Context, id string) (bool, error)
	Exemptions(ctx context.Context) ([][]byte, error)
}

// replica is one gateway process: its store, its clock's offset, the exemptions its console read.
type replica struct {
	id      int
	backend backend
	inc     int // incarnation: a restart makes a new one
	alive   bool
	offset  time.Duration // the driver's; clock reads its copy, off
	off     atomic.Int64
	rnd     schema.Rand
	store   bucket.Releaser
	dyn     *dynamo.Store
	red     *redisstore.Store
	// shared is the store's console of shared exemptions (nil on the memory store).
	shared exemptions
	// regs are the metrics of each incarnation (the lease check reads them at the end).
	regs []*prometheus.Registry
	// base is the store before a mutant wrapped it (the memory store's console).
	base bucket.Releaser
	// pendingExempt is a console read's result, taken in by the driver (collect).
	pendingExempt map[string]time.Time
	// exempt is the bucket keys its console's last read found exempt, with their expiries as
	// their JSON says.
	exempt map[string]time.Time
}

// lockedRand is a seeded source safe for the store's goroutines.
func lockedRand(seed uint64) schema.Rand {
	var mu sync.Mutex
	r := newPCG(seed)
	return func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Uint64()
	}
}

func (w *world) newReplica(id int, b backend) *replica {
	r := &replica{id: id, backend: b, offset: time.Duration(w.rng.Int64N(int64(40*time.Millisecond))) - 20*time.Millisecond}
	if w.cfg.Mutant == clockAhead && id == 0 {
		r.offset += clockAheadBy
	}
	return r
}

// start builds the replica's store (a new incarnation).
func (r *replica) start(w *world) {
	r.inc++
	r.dyn, r.red, r.shared = nil, nil, nil
	r.alive = true
	r.exempt = map[string]time.Time{}
	r.rnd = lockedRand(w.rng.Uint64())
	reg := prometheus.NewRegistry()
	r.regs = append(r.regs, reg)
	r.off.Store(int64(r.offset))
	clock := func() time.Time { return time.Now().Add(time.Duration(r.off.Load())) }
	switch r.backend {
	case backendDynamo:
		a := dynamo.API(&api{w: w, rep: r, inc: r.inc})
		a = exactmutant.Client(a, w.cfg.Mutant)
		a = mutantClient(a, w.cfg.Mutant)
		o := dynamo.Options{
			Table: table, Mode: w.mode, DenyCache: w.deny, Registerer: reg, LateWrites: lateWrites,
			SlotLease: slotLease, Now: clock, Rand: r.rnd, Gate: w.turns,
		}
		switch w.cfg.Mutant {
		case unseededRand:
			o.Rand = nil
		case noTurns:
			o.Gate = nil
		}
		r.dyn = dynamo.New(a, o)
		r.store, r.shared = r.dyn, r.dyn
	case backendRedis:
		o := redisstore.Options{SlotLease: slotLease, Now: clock, Rand: r.rnd, Gate: w.turns}
		switch w.cfg.Mutant {
		case unseededRand:
			o.Rand = nil
		case noTurns:
			o.Gate = nil
		}
		r.red = redisstore.New(&redisClient{w: w, rep: r, inc: r.inc}, o)
		r.store, r.shared = r.red, r.red
	case backendMemory:
		r.store = memstore.New(memstore.Options{Shards: 1, MaxKeys: 10_000})
	}
	r.base = r.store
	// A mutant breaks the shared store under test, never the memory replica beside it: what
	// catches it is the shared backend's.
	if s, ok := exactmutant.Store(r.store, w.cfg.Mutant).(bucket.Releaser); ok && r.backend == w.shared {
		r.store = s
	}
	w.judge.offset(r)
	w.record("start r%d %s inc %d offset %s", r.id, r.backend, r.inc, r.offset)
}

// crash kills the replica: its calls in flight may still land, its decisions' answers are lost,
// its leases and slots stay where they are in the table.
func (w *world) crash(r *replica) {
	w.mu.Lock()
	r.alive = false
	w.mu.Unlock()
	// Its connections break: the client goroutines end (their answers go nowhere), the
	// requests may still land.
	w.breakCalls(r, func(*call) bool { return true })
	w.judge.crashed(r, time.Now())
	w.record("crash r%d inc %d", r.id, r.inc)
	w.closeReplica(r, false)
}

// breakCalls fails at once every call of replica r in flight that match selects, as a broken
// connection does: each becomes an orphan (it may have run, may still land, or never will) and
// its client gets the transport error. It returns how many it broke.
func (w *world) breakCalls(r *replica, match func(*call) bool) int {
	w.mu.Lock()
	var mine []*call
	for _, c := range w.pending {
		if c.rep == r && !c.orphan && match(c) {
			mine = append(mine, c)
		}
	}
	w.mu.Unlock()
	for _, c := range mine {
		w.mu.Lock()
		c.orphan = true
		w.mu.Unlock()
		c.reply <- answer{err: c.broken()}
	}
	return len(mine)
}

// closeReplica stops the incarnation's background goroutines: gracefully (its leases given
// back) at the end of the run, or as a crash, where every call fails at once.
func (w *world) closeReplica(r *replica, graceful bool) {
	if r.red != nil {
		red := r.red
		w.goTrack(func() { _ = red.Close() })
		return
	}
	if r.dyn == nil {
		return
	}
	d := r.dyn
	w.mu.Lock()
	w.closers++
	w.mu.Unlock()
	w.turns.Go(func() {
		defer func() { w.mu.Lock(); w.closers--; w.mu.Unlock() }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if graceful {
			_ = d.CloseLeases(ctx)
		}
		_ = d.Close()
		if !graceful {
			_ = d.CloseLeases(ctx)
		}
	})
}

func (w *world) restart(r *replica) {
	if r.alive {
		return
	}
	r.start(w)
	if r.backend == backendMemory {
		w.judge.memoryRestarted(time.Now())
	}
}

// readConsole is the console's read of the shared resets and exemptions, once a second.
func (w *world) readConsole(r *replica) {
	w.at(time.Now().Add(readEvery), func() { w.readConsole(r) })
	if !r.alive || r.shared == nil {
		return
	}
	inc, d := r.inc, r.shared
	w.mu.Lock()
	w.closers++
	w.mu.Unlock()
	w.turns.Go(func() {
		defer func() { w.mu.Lock(); w.closers--; w.mu.Unlock() }()
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		defer cancel()
		list, err := d.Exemptions(ctx)
		if err != nil {
			return // the last list stays (each entry's expiry still applies)
		}
		ex := map[string]time.Time{}
		for _, data := range list {
			var e exemptionJSON
			// Two exemptions of one key: the later expiry applies (and the list comes in a
			// map's order, so taking the last would not repeat).
			if json.Unmarshal(data, &e) == nil && e.ExpiresAt.After(ex[e.BucketKey]) {
				ex[e.BucketKey] = e.ExpiresAt
			}
		}
		w.mu.Lock()
		if r.inc == inc {
			r.pendingExempt = ex
		}
		w.mu.Unlock()
	})
}

// exemptionJSON is the sim's exemption, in the fields the console's mutants recognise.
type exemptionJSON struct {
	ID        string    `json:"id"`
	BucketKey string    `json:"bucket_key"`
	ExpiresAt time.Time `json:"expires_at"`
}

// console is one operator action: a reset of a key, an exemption created or deleted.
func (w *world) console() {
	r := w.reps[w.rng.IntN(len(w.reps))]
	if !r.alive {
		return
	}
	// A third of the console's actions are on the concurrency keys: their resets read before
	// they write, the console's hardest race.
	p := policyByName("conc")
	if w.rng.IntN(3) != 0 {
		p = &policies[w.rng.IntN(len(policies))]
	}
	if p.lease && r.backend == backendMemory {
		return
	}
	value := keyValues[w.rng.IntN(len(keyValues))]
	c, _, _, err := w.set.KeyCharge(p.name, value)
	if err != nil {
		panic(err)
	}
	inc := r.inc
	switch k := w.rng.IntN(4); {
	case k < 2 || r.shared == nil:
		cs, ok := r.store.(console)
		if !ok {
			cs, ok = unwrapConsole(r)
		}
		if !ok {
			return
		}
		if pk, ok := cs.(peeker); ok && w.rng.IntN(4) == 0 {
			w.quietReset(r, cs, pk, p, c, value)
			return
		}
		id := w.judge.resetStarted(r, c, time.Now())
		w.record("reset %d r%d %s %s", id, r.id, p.name, value)
		now := time.Now().Add(r.offset)
		w.goTrack(func() {
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			defer cancel()
			err := cs.Reset(ctx, now, c)
			w.mu.Lock()
			w.judge.resetEnded(id, err, inc == r.inc)
			w.mu.Unlock()
		})
	case k == 2:
		w.exemptionID++
		id := "x" + strconv.Itoa(w.exemptionID)
		life := time.Duration(w.rng.Int64N(int64(3*time.Second))) + 200*time.Millisecond
		expires := time.Now().Add(r.offset).Add(life)
		data, _ := json.Marshal(exemptionJSON{ID: id, BucketKey: c.Key.String(), ExpiresAt: expires})
		w.judge.exemptionCreated(id, c.Key.String(), time.Now(), expires)
		w.record("exempt %s r%d %s %s for %s", id, r.id, p.name, value, life)
		d := r.shared
		w.goTrack(func() {
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			defer cancel()
			_, _ = d.PutExemption(ctx, id, data, expires, 50)
		})
	default:
		if w.exemptionID == 0 {
			return
		}
		id := "x" + strconv.Itoa(1+w.rng.IntN(w.exemptionID))
		w.record("delete exemption %s r%d", id, r.id)
		d := r.shared
		w.goTrack(func() {
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			defer cancel()
			_, _ = d.DeleteExemption(ctx, id)
		})
	}
}

// peeker reads a key's state without charging it (the console's Peek).
type peeker interface {
	Peek(ctx context.Context, now time.Time, c bucket.Charge) (bucket.Result, error)
}

// quietKey tags the calls of a quiet reset (its context's value) so that the driver delivers
// them alone.
type quietKey struct{}

// quietReset resets c's key while nothing else lands, then peeks it and a key never used: a
// reset makes a key exactly full, so the two must read alike.
func (w *world) quietReset(r *replica, cs console, pk peeker, p *simPolicy, c bucket.Charge, value string) {
	id := w.judge.resetStarted(r, c, time.Now())
	w.quiet++
	tag := w.quiet
	fresh, _, _, err := w.set.KeyCharge(p.name, "never-used-"+strconv.Itoa(tag))
	if err != nil {
		panic(err)
	}
	w.record("quiet reset %d r%d %s %s", id, r.id, p.name, value)
	now := time.Now().Add(r.offset)
	var done bool
	var rerr, perr error
	var got, want bucket.Result
	w.goTrack(func() {
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), quietKey{}, tag), storeTimeout)
		defer cancel()
		rerr = cs.Reset(ctx, now, c)
		if rerr == nil {
			got, perr = pk.Peek(ctx, now, c)
		}
		if perr == nil && rerr == nil {
			want, perr = pk.Peek(ctx, now, fresh)
		}
		w.mu.Lock()
		done = true
		w.mu.Unlock()
	})
	for {
		w.settle()
		w.mu.Lock()
		d := done
		w.mu.Unlock()
		if d {
			break
		}
		var mine *call
		for _, pc := range w.sortedPending() {
			if pc.quiet == tag {
				mine = pc
				break
			}
		}
		if mine == nil {
			time.Sleep(time.Millisecond) // a timer of its own (a backoff): others wait undelivered
			continue
		}
		w.deliver(mine, deliverOK)
	}
	w.judge.resetEnded(id, rerr, true)
	w.record("quiet reset %d: err %v peek %v fresh %v", id, rerr != nil || perr != nil, results1(got), results1(want))
	if rerr == nil && perr == nil && (got.Remaining != want.Remaining || got.Allowed != want.Allowed) {
		w.judge.violate("reset %d of %s on r%d left the key at %d remaining (allowed %v), a key never used has %d (allowed %v)",
			id, p.name, r.id, got.Remaining, got.Allowed, want.Remaining, want.Allowed)
	}
}

func results1(r bucket.Result) string { return fmt.Sprintf("[%v %d]", r.Allowed, r.Remaining) }

// unwrapConsole finds the console of a replica whose store a mutant wraps.
func unwrapConsole(r *replica) (console, bool) {
	if r.dyn != nil {
		return r.dyn, true
	}
	if r.red != nil {
		return r.red, true
	}
	if m, ok := r.base.(console); ok {
		return m, true
	}
	return nil, false
}

// goTrack runs f in a goroutine the drain waits for.
func (w *world) goTrack(f func()) {
	w.mu.Lock()
	w.closers++
	w.mu.Unlock()
	w.turns.Go(func() {
		defer func() { w.mu.Lock(); w.closers--; w.mu.Unlock() }()
		f()
	})
}

func (r *replica) String() string { return fmt.Sprintf("r%d", r.id) }
