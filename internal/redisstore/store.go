package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Defaults of Options.
const (
	DefaultKeyPrefix = "rl:"
	defaultSlotLease = 30 * time.Second
	// defaultSlack is how long a key outlives the instant its state becomes a fresh key's: a
	// replica whose clock is behind the writer's by up to this much still finds the state.
	defaultSlack = 5 * time.Second
	// releaseTimeout bounds a give-back whose caller's context has no time left: a slot must
	// come back even after the request's deadline.
	releaseTimeout = time.Second
)

// Options configures a Store.
type Options struct {
	// KeyPrefix starts every key (Optional; default "rl:").
	KeyPrefix string
	// Cluster splits a group whose keys live in different hash slots into one script per slot,
	// with give-backs when a part is refused (Optional; set it for a Redis Cluster).
	Cluster bool
	// SlotLease is how long a concurrency slot stays taken without a renewal: the Store renews
	// the slots it holds every SlotLease/3 (Optional; default 30s).
	SlotLease time.Duration
	// Slack is how long a key outlives its state (Optional; default 5s).
	Slack time.Duration
	// WaitReplicas, when above 0, makes every write wait (WAIT) until that many replicas have
	// it, within the decision's deadline; a decision whose write no replica confirmed in time
	// fails (store.on_error decides it). It shrinks what a failover can lose.
	WaitReplicas int
	// Now is the Store's own clock, for renewing concurrency slots (Optional; default
	// time.Now). Decisions take their instant from Take; give it the same clock.
	Now func() time.Time
	// Logger receives give-backs that failed (Optional; nil: not logged).
	Logger *zap.Logger
	// Rand is the source of the markers, generations and slot ids (Optional; nil:
	// math/rand/v2's). The simulator (internal/testkit/sim) seeds one per replica so that a seed
	// repeats its run.
	Rand func() uint64
	// Gate runs the Store's own goroutines (the slots' renewal loop, the parts of a cross-slot
	// group, Close's wait) one at a time in the simulator's order (Optional; nil in the
	// gateway, where each place costs a nil check and allocates nothing).
	Gate bucket.Gate
}

// Store is a bucket.Releaser on Redis or Valkey, exact across replicas: each group is decided
// by one script, which Redis runs atomically. It is safe for concurrent use; use New.
type Store struct {
	cl        atomic.Pointer[rueidis.Client] // nil until connected
	dial      func() (rueidis.Client, error)
	dialing   atomic.Bool
	dialAt    atomic.Int64 // when the last connection attempt started (Unix ns)
	dialErr   atomic.Pointer[error]
	firstDial chan struct{} // closed when the first connection attempt has ended
	firstOnce sync.Once
	prefix    string
	cluster   bool
	slotLease time.Duration
	slackMs   int64
	wait      int
	now       func() time.Time
	log       *zap.Logger
	rnd       func() uint64 // Options.Rand, nil: math/rand/v2's
	turns     bucket.Turns  // Options.Gate, nil: none

	mu   sync.Mutex
	held map[uint64]string // concurrency slots held here: id -> key
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var _ bucket.Releaser = (*Store)(nil)

// ErrDisagree is returned (wrapped) when a script's verdict differs from the algorithm's on the
// state it read: a bug, never a decision.
var ErrDisagree = errors.New("redisstore: script and algorithm disagree")

// New returns a Store on client, which it owns from then on (Close closes it).
func New(client rueidis.Client, o Options) *Store {
	s := newStore(o)
	s.cl.Store(&client)
	s.firstOnce.Do(func() { close(s.firstDial) })
	return s
}

// NewDialed returns a Store that connects with dial (see Dial) on first use, and again after
// each failed attempt, at most once a second: until it is connected every decision fails
// (ErrNotConnected), and store.on_error decides.
func NewDialed(dial func() (rueidis.Client, error), o Options) *Store {
	s := newStore(o)
	s.dial = dial
	s.connect()
	return s
}

// Connected waits until the first connection attempt has ended, within ctx, and reports its
// failure: what a start logs.
func (s *Store) Connected(ctx context.Context) error {
	select {
	case <-s.firstDial:
	case <-ctx.Done():
		return fmt.Errorf("redisstore: connect: %w", ctx.Err())
	}
	if s.cl.Load() != nil {
		return nil
	}
	if e := s.dialErr.Load(); e != nil {
		return fmt.Errorf("%w: %w", ErrNotConnected, *e)
	}
	return ErrNotConnected
}

// ErrNotConnected is returned (wrapped) while a Store from NewDialed has no connection.
var ErrNotConnected = errors.New("redisstore: not connected")

func newStore(o Options) *Store {
	s := &Store{
		prefix: o.KeyPrefix, cluster: o.Cluster, slotLease: o.SlotLease,
		slackMs: o.Slack.Milliseconds(), wait: o.WaitReplicas, now: o.Now, log: o.Logger, rnd: o.Rand, turns: bucket.Turns{G: o.Gate},
		held: make(map[uint64]string), stop: make(chan struct{}), done: make(chan struct{}),
		firstDial: make(chan struct{}),
	}
	if s.prefix == "" {
		s.prefix = DefaultKeyPrefix
	}
	if s.slotLease <= 0 {
		s.slotLease = defaultSlotLease
	}
	if o.Slack <= 0 {
		s.slackMs = defaultSlack.Milliseconds()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.turns.Go(s.renew)
	return s
}

// Close stops renewing concurrency slots and closes the client.
func (s *Store) Close() error {
	s.once.Do(func() {
		close(s.stop)
		k := s.turns.Park()
		<-s.done
		s.turns.Resume(k)
		if c := s.cl.Load(); c != nil {
			(*c).Close()
		}
	})
	return nil
}

// client returns the connected client, or starts a connection attempt (at most one at a time,
// one a second) and fails.
func (s *Store) client() (rueidis.Client, error) {
	if c := s.cl.Load(); c != nil {
		return *c, nil
	}
	s.connect()
	if e := s.dialErr.Load(); e != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotConnected, *e)
	}
	return nil, ErrNotConnected
}

// connect starts a connection attempt in the background unless one is under way or the last
// began less than a second ago.
func (s *Store) connect() {
	if s.dial == nil || time.Now().UnixNano()-s.dialAt.Load() < int64(time.Second) || !s.dialing.CompareAndSwap(false, true) {
		return
	}
	s.dialAt.Store(time.Now().UnixNano())
	go func() {
		defer s.firstOnce.Do(func() { close(s.firstDial) })
		defer s.dialing.Store(false)
		c, err := s.dial()
		if err != nil {
			s.dialErr.Store(&err)
			return
		}
		select {
		case <-s.stop:
			c.Close()
			return
		default:
		}
		if !s.cl.CompareAndSwap(nil, &c) {
			c.Close()
		}
	}()
}

// Ping asks the server for an answer within ctx: the readiness probe's and the start's check.
func (s *Store) Ping(ctx context.Context) error {
	c, err := s.client()
	if err != nil {
		return err
	}
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// key is the Redis key of a charge's state: the prefix, the bucket key's hex (a digest: no raw
// client value) as the hash tag, and the kind of state, so that a policy whose algorithm
// changes on a reload starts fresh instead of misreading another kind's state.
func (s *Store) key(c *bucket.Charge) string {
	kind := ":b"
	switch c.Limit.Algorithm {
	case bucket.FixedWindow, bucket.Quota:
		kind = ":f"
	case bucket.SlidingWindow:
		kind = ":s"
	case bucket.Concurrency:
		kind = ":c"
	}
	return s.prefix + "{" + c.Key.String() + "}" + kind
}

// markerBits bounds every marker, and so every Result.Token, below 2^62: the stores that wrap
// or sit beside this one tag tokens with the top bits (package fallback's decisions of its local
// store carry 1<<63, the memory store's sketch 1<<62), and a Redis token with such a bit set
// was given back to the wrong store (a charge_on or hits_addend 0 give-back that never reached
// Redis).
const markerBits = 62

// marker returns a random non-zero id below 2^markerBits: a write's marker, a state's
// generation, a slot's id.
func (s *Store) marker() uint64 {
	draw := rand.Uint64
	if s.rnd != nil {
		draw = s.rnd
	}
	for {
		if m := draw() >> (64 - markerBits); m != 0 {
			return m
		}
	}
}

// Take implements bucket.Store: the group is one script on one node. In cluster mode a group
// whose keys live in different hash slots runs one script per slot; when any part is refused,
// the charges the other parts committed are given back (exact for windows, slots and quotas; a
// bucket's only while nothing wrote to it since, else it stays charged: stricter).
func (s *Store) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	if len(charges) == 0 {
		return true, nil
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("redisstore: take: %w", err)
	}
	ns := now.UnixNano()
	groups := s.groups(charges)
	if len(groups) == 1 {
		admitted, _, err := s.takeGroup(ctx, ns, charges, groups[0], results)
		return admitted, err
	}
	type part struct {
		admitted  bool
		committed []int
		err       error
	}
	parts := make([]part, len(groups))
	var wg sync.WaitGroup
	for g, idx := range groups {
		s.turns.GoWG(&wg, func() {
			p := &parts[g]
			p.admitted, p.committed, p.err = s.takeGroup(ctx, ns, charges, idx, results)
		})
	}
	s.turns.Wait(&wg)
	admitted := true
	var errs []error
	for _, p := range parts {
		admitted = admitted && p.admitted && p.err == nil
		if p.err != nil {
			errs = append(errs, p.err)
		}
	}
	if admitted {
		return true, nil
	}
	var back []bucket.Taken
	for _, p := range parts {
		for _, i := range p.committed {
			back = append(back, bucket.Taken{Charge: charges[i], At: now, Token: results[i].Token})
		}
	}
	if len(back) > 0 {
		if err := s.give(ctx, back, true); err != nil {
			s.log.Warn("redis: give-back of a refused group's parts failed; those keys stay charged (stricter)", zap.Error(err))
		}
	}
	// Nothing of a refused group is the caller's to release.
	for _, p := range parts {
		for _, i := range p.committed {
			results[i].Token = 0
		}
	}
	if len(errs) > 0 {
		return false, errors.Join(errs...)
	}
	return false, nil
}

// groups splits the charges' indices by hash slot (cluster mode), or returns them as one group.
func (s *Store) groups(charges []bucket.Charge) [][]int {
	all := make([]int, len(charges))
	for i := range all {
		all[i] = i
	}
	if !s.cluster || len(charges) == 1 {
		return [][]int{all}
	}
	bySlot := map[uint16][]int{}
	var order []uint16
	for i := range charges {
		sl := Slot(charges[i].Key.String())
		if _, ok := bySlot[sl]; !ok {
			order = append(order, sl)
		}
		bySlot[sl] = append(bySlot[sl], i)
	}
	if len(order) == 1 {
		return [][]int{all}
	}
	out := make([][]int, 0, len(order))
	for _, sl := range order {
		out = append(out, bySlot[sl])
	}
	return out
}

// charge is one charge's arguments and what its verdict needs.
type charge struct {
	c      *bucket.Charge
	n      int64
	marker uint64
}

// takeGroup runs the take script on the charges idx and writes their verdicts. It returns the
// part's admission and the indices of the charges it committed.
func (s *Store) takeGroup(ctx context.Context, now int64, charges []bucket.Charge, idx []int, results []bucket.Result) (bool, []int, error) {
	keys := make([]string, 0, len(idx))
	args := make([]string, 0, 2+8*len(idx))
	args = append(args, strconv.FormatInt(now, 10), strconv.Itoa(len(idx)))
	cs := make([]charge, len(idx))
	for j, i := range idx {
		c := &charges[i]
		cs[j] = charge{c: c, n: c.N(), marker: s.marker()}
		keys = append(keys, s.key(c))
		var err error
		args, err = s.appendArgs(args, now, &cs[j])
		if err != nil {
			return false, nil, err
		}
	}
	var reply []rueidis.RedisMessage
	var err error
	if s.wait > 0 {
		reply, err = s.execWait(ctx, keys, args)
	} else {
		reply, err = s.exec(ctx, takeScript, keys, args)
	}
	if err != nil {
		return false, nil, fmt.Errorf("redisstore: take: %w", err)
	}
	if len(reply) != len(idx)+1 {
		return false, nil, fmt.Errorf("redisstore: take: %d values in the answer, want %d", len(reply), len(idx)+1)
	}
	admitted, err := reply[0].AsInt64()
	if err != nil {
		return false, nil, fmt.Errorf("redisstore: take: %w", err)
	}
	var committed []int
	for j, i := range idx {
		fields, err := reply[j+1].ToArray()
		if err != nil {
			return false, nil, fmt.Errorf("redisstore: take: %w", err)
		}
		done, err := verdict(now, &cs[j], fields, &results[i])
		if err != nil {
			return false, nil, err
		}
		if done {
			committed = append(committed, i)
			if cs[j].c.Limit.Algorithm == bucket.Concurrency {
				s.mu.Lock()
				s.held[results[i].Token] = keys[j]
				s.mu.Unlock()
			}
		}
	}
	return admitted == 1, committed, nil
}

// exec runs a script and returns its array answer.
func (s *Store) exec(ctx context.Context, l *rueidis.Lua, keys, args []string) ([]rueidis.RedisMessage, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	return l.Exec(ctx, c, keys, args).ToArray()
}

// execWait runs the take script followed by WAIT on the same connection (one pipeline: WAIT
// counts the replicas that have this connection's writes, the script's included), within ctx.
// A script whose writes no s.wait replicas confirmed in time fails the decision: its writes
// stand on the primary (stricter), but its admission is not given, since a failover could lose it.
func (s *Store) execWait(ctx context.Context, keys, args []string) ([]rueidis.RedisMessage, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	ms := int64(50)
	if dl, ok := ctx.Deadline(); ok {
		ms = max(time.Until(dl).Milliseconds()-1, 1)
	}
	wait := c.B().Wait().Numreplicas(int64(s.wait)).Timeout(ms).Build()
	run := c.B().Evalsha().Sha1(takeSHA).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	res := c.DoMulti(ctx, run, wait)
	if e, ok := rueidis.IsRedisErr(res[0].Error()); ok && e.IsNoScript() {
		run = c.B().Eval().Script(takeSource).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		wait = c.B().Wait().Numreplicas(int64(s.wait)).Timeout(ms).Build()
		res = c.DoMulti(ctx, run, wait)
	}
	reply, err := res[0].ToArray()
	if err != nil {
		return nil, err
	}
	n, err := res[1].AsInt64()
	if err != nil {
		return nil, fmt.Errorf("wait: %w", err)
	}
	if n < int64(s.wait) {
		return nil, fmt.Errorf("wait: %d of %d replicas confirmed the write in time: %w", n, s.wait, ErrNotReplicated)
	}
	return reply, nil
}

// ErrNotReplicated is returned (wrapped) when store.redis.wait_replicas replicas did not confirm
// a decision's write in time. The write stands on the primary.
var ErrNotReplicated = errors.New("redisstore: write not replicated in time")

// spend is n*t saturating at 2^60 ns, as package bucket computes a charge's span.
func spend(t, n int64) int64 {
	hi, lo := bits.Mul64(uint64(n), uint64(t))
	if hi != 0 || lo > 1<<60 {
		return 1 << 60
	}
	return int64(lo)
}

// span is a Limit's window in ns, clamped as package bucket clamps it.
func span(w time.Duration) int64 { return min(max(int64(w), 1), 1<<60) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// msUp is a span in ns as whole milliseconds, rounded up.
func msUp(d int64) int64 { return (max(d, 0) + 999_999) / 1_000_000 }

// appendArgs appends a charge's eight arguments of the take script.
func (s *Store) appendArgs(args []string, now int64, ch *charge) ([]string, error) {
	c, l := ch.c, &ch.c.Limit
	shadow := "0"
	if c.Shadow {
		shadow = "1"
	}
	mk := strconv.FormatUint(ch.marker, 10)
	slack := strconv.FormatInt(s.slackMs, 10)
	n := strconv.FormatInt(ch.n, 10)
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		t, tau := bucket.GCRAParams(*l)
		alg := algToken
		if l.Algorithm == bucket.LeakyBucket {
			alg = algLeaky
		}
		return append(args, alg, shadow, n, strconv.FormatInt(spend(t, ch.n), 10), strconv.FormatInt(tau, 10), mk, slack, ""), nil
	case bucket.FixedWindow, bucket.Quota:
		var end int64
		alg := algFixed
		if l.Algorithm == bucket.Quota {
			_, end = bucket.QuotaPeriod(now, *l)
			alg = algQuota
		} else {
			w := span(l.Window)
			end = floorDiv(now, w)*w + w
		}
		ttl := msUp(end-now) + s.slackMs
		return append(args, alg, shadow, n, strconv.FormatInt(end, 10), strconv.FormatInt(l.Count, 10), strconv.FormatInt(ttl, 10), mk, ""), nil
	case bucket.SlidingWindow:
		w := bucket.SlidingWidth(*l)
		cur := floorDiv(now, w)
		ttl := msUp((cur+bucket.SlidingSlots+1)*w-now) + s.slackMs
		return append(args, algSliding, shadow, n, strconv.FormatInt(w, 10), strconv.FormatInt(cur, 10), strconv.FormatInt(l.Count, 10), strconv.FormatInt(ttl, 10), mk), nil
	case bucket.Concurrency:
		nowMs := floorDiv(now, 1e6)
		exp := nowMs + s.slotLease.Milliseconds()
		ttl := s.slotLease.Milliseconds() + s.slackMs
		return append(args, algConcurrency, shadow, n, strconv.FormatInt(l.Count, 10), mk, strconv.FormatInt(exp, 10), strconv.FormatInt(ttl, 10), strconv.FormatInt(nowMs, 10)), nil
	}
	return nil, fmt.Errorf("redisstore: unknown algorithm %d", l.Algorithm)
}

// verdict turns one charge's answer (conforms, the state before, committed) into its Result
// with the algorithm's own arithmetic (package bucket) on the state the script read, and checks
// that the script decided as the algorithm does. It reports whether the charge was committed.
func verdict(now int64, ch *charge, f []rueidis.RedisMessage, r *bucket.Result) (bool, error) {
	bad := func(err error) (bool, error) { return false, fmt.Errorf("redisstore: take: answer: %w", err) }
	if len(f) < 3 {
		return bad(fmt.Errorf("%d fields", len(f)))
	}
	ok, err := f[0].AsInt64()
	if err != nil {
		return bad(err)
	}
	done, err := f[len(f)-1].AsInt64()
	if err != nil {
		return bad(err)
	}
	l := ch.c.Limit
	var token uint64
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		if len(f) != 4 {
			return bad(fmt.Errorf("%d fields for a bucket", len(f)))
		}
		tat, err := f[1].AsInt64()
		if err != nil {
			return bad(err)
		}
		_, *r = bucket.GCRAN(tat, now, l, ch.n)
		token = ch.marker
	case bucket.FixedWindow, bucket.Quota:
		if len(f) != 5 {
			return bad(fmt.Errorf("%d fields for a window", len(f)))
		}
		end, err1 := f[1].AsInt64()
		count, err2 := f[2].AsInt64()
		gen, err3 := f[3].AsUint64()
		if err := errors.Join(err1, err2, err3); err != nil {
			return bad(err)
		}
		st := bucket.FixedState{End: end, Count: count}
		if l.Algorithm == bucket.Quota {
			_, *r = bucket.QuotaN(st, now, l, ch.n)
		} else {
			_, *r = bucket.FixedN(st, now, l, ch.n)
		}
		token = gen
	case bucket.SlidingWindow:
		if len(f) != 4+bucket.SlidingSlots+1 {
			return bad(fmt.Errorf("%d fields for a sliding window", len(f)))
		}
		slot, err1 := f[1].AsInt64()
		gen, err2 := f[2].AsUint64()
		if err := errors.Join(err1, err2); err != nil {
			return bad(err)
		}
		st := bucket.SlidingState{Width: bucket.SlidingWidth(l), Slot: slot}
		for i := range st.Counts {
			v, err := f[3+i].AsInt64()
			if err != nil {
				return bad(err)
			}
			if v < 0 || v > 1<<32-1 {
				return bad(fmt.Errorf("slot counter %d: %d", i, v))
			}
			st.Counts[i] = uint32(v)
		}
		_, *r = bucket.SlidingN(st, now, l, ch.n)
		token = gen
	case bucket.Concurrency:
		if len(f) != 4 {
			return bad(fmt.Errorf("%d fields for slots", len(f)))
		}
		inflight, err := f[1].AsInt64()
		if err != nil {
			return bad(err)
		}
		_, *r = bucket.Concurrent(inflight, l)
		token = ch.marker
	default:
		return bad(fmt.Errorf("unknown algorithm %d", l.Algorithm))
	}
	if r.Allowed != (ok == 1) {
		return false, fmt.Errorf("%w: %v for algorithm %d, script said %d", ErrDisagree, r.Allowed, l.Algorithm, ok)
	}
	if done == 1 {
		r.Token = token
	}
	return done == 1, nil
}
