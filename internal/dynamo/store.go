package dynamo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/lease"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Attribute names. count and ttl are DynamoDB reserved words, so expressions name every
// attribute through ExpressionAttributeNames.
const (
	// The attributes the lease pools write too are package schema's (schema.Tat, schema.Count,
	// schema.TTL, schema.LeaseWrite).
	attrPK = "pk"
	// A GCRA item also keeps the chain of its last charge writes, w1..wN and c1..cN (chainW,
	// chainC): what a give-back needs to be exact (see refund.go).
	// attrSealed marks a closed sliding-window slot whose count is final (see sealSlots).
	attrSealed = "sealed"
)

// maxRounds bounds the rounds of one decision's conditional writes (a GCRA form switch, a
// transaction conflict, a batch learning how many of its charges fit); the context deadline
// bounds their time.
const maxRounds = 4

// defaultCacheSize is the default number of entries of each local cache.
const defaultCacheSize = 100_000

// defaultLateWrites is the default of Options.LateWrites.
const defaultLateWrites = 5 * time.Second

// ErrContention is returned (wrapped) when a decision could not be made in maxRounds rounds
// because other writers kept changing the items it conditions on.
var ErrContention = errors.New("dynamo: too much contention")

// API is the part of the DynamoDB client that Store calls; *dynamodb.Client implements it.
type API interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

var _ API = (*dynamodb.Client)(nil)

// Mode selects how a group of charges is made all or nothing (see the package documentation).
type Mode uint8

// The modes. The zero Mode is Refund.
const (
	Refund Mode = iota
	Transaction
)

// String returns the mode's configuration name.
func (m Mode) String() string {
	switch m {
	case Refund:
		return "refund"
	case Transaction:
		return "transaction"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Options configures a Store.
type Options struct {
	// Table is the table name (Required).
	Table string
	// Mode is how groups are made all or nothing (Optional; default Refund).
	Mode Mode
	// DenyCache answers charges known to be rejected locally until they may conform
	// (Optional; default off).
	DenyCache bool
	// CacheSize bounds each local cache (deny cache, GCRA hints, closed sliding-window slots)
	// (Optional; default 100,000 entries each).
	CacheSize int
	// Registerer receives the store's metrics (Optional; nil = not exported). Stores sharing a
	// registry share the collectors.
	Registerer prometheus.Registerer
	// LateWrites is how long after its decision a write may still land in the table: the
	// decision's timeout plus the network's delay (Optional; default 5s). A sliding-window slot
	// that closed less than LateWrites ago is sealed before its count is used (one extra write);
	// an older one is read. Too short a value lets a late write go unseen by the replicas that
	// read the slot, so allow for the longest a DynamoDB call of a decision can take.
	LateWrites time.Duration
	// SlotLease is how long a concurrency slot stays taken without a renewal: the Store renews
	// its slots every SlotLease/3, so a replica that crashes while holding slots loses them at
	// most SlotLease after its last renewal (Optional; default 30s). See concurrency.go.
	SlotLease time.Duration
	// Logger receives the give-backs that failed after every attempt (Optional; nil = not
	// logged, only counted in ratelimit_dynamodb_giveback_failures_total).
	Logger *zap.Logger
	// Now is the Store's own clock: the lease sweeper's, which gives back the leases of pools
	// that stopped seeing demand, and the concurrency slots' renewals (Optional; default
	// time.Now). Decisions take their instant from Take; give it the same clock.
	Now func() time.Time
	// Rand is the source of the store's markers, slot ids, backoff jitter and lease shard
	// choices (Optional; nil = math/rand/v2's). The simulator (internal/testkit/sim) seeds one
	// per replica so that a seed repeats its run.
	Rand func() uint64
	// Gate, when set, runs the store's goroutines one at a time in the order it chooses
	// (Optional; nil = as the Go scheduler runs them). The simulator sets it so that a seed
	// repeats its run; see bucket.Gate.
	Gate bucket.Gate
}

// Store is a bucket.Store backed by a DynamoDB table. It is safe for concurrent use; the zero
// value is not usable (use New).
type Store struct {
	api   API // live, watched
	live  *liveAPI
	table string
	mode  Mode
	deny  *boundedCache[bucket.Key, denial] // nil when the deny cache is off
	hints *boundedCache[bucket.Key, int64]  // GCRA keys whose tat is in the future: try form (b) first
	slots *boundedCache[slotKey, int64]     // closed sliding-window slot counts
	co    coalescer                         // Refund mode: one write in flight per item
	ls    *lease.Pools                      // leased charges' pools
	m     *metrics
	// lateWrites is Options.LateWrites in ns.
	lateWrites int64
	slotLease  time.Duration
	leases     leases           // concurrency slots held, renewed until released
	now        func() time.Time // Options.Now
	rnd        schema.Rand      // Options.Rand
	turns      bucket.Turns     // Options.Gate
	log        *zap.Logger
	// epochs is the give-back epoch last seen per counter item (see countGiveBack).
	epochs *boundedCache[string, int64]
	// giveLogAt is when the last failed give-back was logged (Unix ns); giveLogged counts the
	// failures not logged since.
	giveLogAt, giveLogged atomic.Int64
	adm                   adminState // the console's resets applied here (console.go)
}

var _ bucket.Releaser = (*Store)(nil)

type denial struct {
	limit            bucket.Limit
	cost             int64 // a rejection of cost 5 says nothing about a charge of cost 1
	retryAt, resetAt int64
	// remaining is what the store said remained at the refusal: less than cost. A token
	// bucket refills and a window's count only grows, so it may be stale by the next refusal
	// it answers; it is what the last answer of the store said, as the headers of a cached
	// refusal should.
	remaining int64
}

type slotKey struct {
	key  bucket.Key
	slot int64
}

// New returns a Store that keeps its state in o.Table through api.
func New(api API, o Options) *Store {
	size := o.CacheSize
	if size <= 0 {
		size = defaultCacheSize
	}
	late := o.LateWrites
	if late <= 0 {
		late = defaultLateWrites
	}
	live := &liveAPI{API: api, grace: answerGrace, now: time.Now}
	s := &Store{
		api:   live,
		live:  live,
		table: o.Table,
		mode:  o.Mode,
		hints: newBoundedCache[bucket.Key, int64](size),
		slots: newBoundedCache[slotKey, int64](size),
		co:    coalescer{items: make(map[string]*itemQueue)},
		m:     newMetrics(o.Registerer),

		lateWrites: int64(late),
		slotLease:  cmp.Or(o.SlotLease, defaultSlotLease),
		leases:     leases{stop: make(chan struct{})},
		log:        o.Logger,
		epochs:     newBoundedCache[string, int64](size),
		now:        o.Now,
		rnd:        o.Rand,
		turns:      bucket.Turns{G: o.Gate},
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if o.DenyCache {
		s.deny = newBoundedCache[bucket.Key, denial](size)
	}
	s.ls = lease.NewPools(lease.Config{
		Table: leaseTable{s},
		Metrics: lease.Metrics{
			Renewals: s.m.leases, Local: s.m.leaseLocal, Units: s.m.leaseUnits, Held: s.m.leaseHeld,
		},
		Throttled: ErrThrottled,
		Now:       o.Now,
		Rand:      o.Rand,
		Gate:      o.Gate,
	})
	return s
}

// CloseLeases gives the unspent units of every capacity lease back to the table and stops the
// lease sweeper, within ctx. Leased charges fail after it; others are unaffected. A Store that
// never leased has nothing to give back. (Close, for concurrency slots, is another matter.)
func (s *Store) CloseLeases(ctx context.Context) error { return s.ls.Close(ctx) }

// warmKey is the item Warm reads and tries to update: no decision ever writes it.
const warmKey = "ratelimit-proxy#warm"

// warmWrite is Warm's update of warmKey: its condition can never hold, so DynamoDB evaluates
// it and writes nothing, whatever the item holds.
var warmWrite = update{
	expr:   "SET #w = :w",
	cond:   "attribute_exists(#w) AND attribute_not_exists(#w)",
	names:  map[string]string{"#w": "warm"},
	values: map[string]types.AttributeValue{":w": &types.AttributeValueMemberN{Value: "1"}},
}

// Warm makes conns concurrent consistent reads of an item that is never written, then one
// update of it whose condition never holds, and returns the first error. A gateway that has
// just started otherwise pays, in its first decisions, for opening connections (TLS), fetching
// credentials (IMDS, STS for a web identity) and resolving the endpoint, and on DynamoDB Local
// for a cold JVM's first conditional update, which together can take longer than
// store.timeout: those decisions would fail, open the circuit breaker and follow on_error for
// its backoff. It also shows a wrong table, endpoint or credentials, or a role without
// UpdateItem, at startup. It needs no permission beyond the decisions' BatchGetItem and
// UpdateItem, and writes nothing.
func (s *Store) Warm(ctx context.Context, conns int) error {
	if err := s.Probe(ctx, conns); err != nil {
		return err
	}
	_, err := s.updateItem(ctx, opUpdate, warmKey, warmWrite, types.ReturnValueNone, noRetry)
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("dynamo: warm: update: %w", err)
	}
	return nil
}

// Probe makes conns concurrent consistent reads of warmKey and returns the first error: the
// cheapest call that shows the table answering (the clock's probe, after Warm).
func (s *Store) Probe(ctx context.Context, conns int) error {
	errs := make(chan error, max(conns, 1))
	for range max(conns, 1) {
		go func() {
			_, err := s.readItems(ctx, []string{warmKey})
			errs <- err
		}()
	}
	var first error
	for range max(conns, 1) {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("dynamo: warm: %w", err)
		}
	}
	return first
}

// TakeLocal decides charges from what this Store holds, without calling DynamoDB: a leased
// charge from its pool's grants (or rejected while its pool is known to be empty), any charge
// from the deny cache. decided is false, and nothing is spent, when a charge would need a call.
// A circuit breaker uses it while the store is considered down: units already reserved are
// exact to spend whatever DynamoDB does, so a hot pool keeps serving from its lease through a
// short outage instead of following on_error.
func (s *Store) TakeLocal(now time.Time, charges []bucket.Charge, results []bucket.Result) (admitted, decided bool) {
	n := now.UnixNano()
	ops := make([]op, len(charges))
	denied := false
	for i := range ops {
		o := &ops[i]
		o.index, o.c = i, charges[i]
		switch {
		case denied:
			o.result = bucket.Result{Allowed: true, Limit: limitValue(o.c.Limit)} // not reached
			continue
		case leased(o.c) && s.takeLocalLease(o, n):
		default:
			r, ok := s.cachedDenial(o.c, n)
			if !ok {
				giveBack(ops)
				return false, false
			}
			o.result, o.done, o.cached = r, true, true
		}
		denied = !o.result.Allowed && !o.c.Shadow
	}
	if denied {
		giveBack(ops)
	} else {
		spent(ops)
	}
	for i := range ops {
		results[i] = ops[i].result
	}
	return !denied, true
}

// takeLocalLease decides leased charge o from its pool's grants alone (see lease.TakeLocal):
// false when that needs a call.
func (s *Store) takeLocalLease(o *op, n int64) bool {
	spent, r, ok := s.ls.TakeLocal(o.c, n)
	if ok {
		o.lease, o.result, o.done, o.pooled = spent, r, true, true
	}
	return ok
}

// leased reports whether c is served from leases.
func leased(c bucket.Charge) bool {
	return c.Lease.On() && bucket.LeaseSupported(c.Limit.Algorithm)
}

// op is one charge on its way through a decision.
type op struct {
	index int // position in the group
	c     bucket.Charge
	pk    string
	t     int64 // GCRA emission interval
	tau   int64 // GCRA tolerance
	// formB: the GCRA write assumes tat >= now (SET tat = tat + T) rather than an idle bucket.
	formB bool
	// Sliding window: the current slot and the counted slots' counts.
	cur    int64
	counts slotCounts

	done    bool // result is final (from the deny cache or a decided write)
	cached  bool // result came from the deny cache
	applied bool // our write is in the table (and not refunded)
	// wid is the marker of the GCRA write that applied the charge (see pushChain); 0 when
	// unknown.
	wid       uint64
	coalesced bool   // decided by its item's writer, which keeps the GCRA hint itself
	slot      uint64 // Concurrency: the slot's id
	result    bucket.Result
	err       error

	// Lease mode: pooled when its pool decided the charge, and what it spent there (given
	// back if the group is rejected).
	pooled bool
	lease  lease.Spent
}

// Take implements bucket.Store.
func (s *Store) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("dynamo: %w", err)
	}
	n := now.UnixNano()
	ops := make([]op, len(charges))
	denied := false
	for i := range ops {
		o := &ops[i]
		o.index, o.c = i, charges[i]
		if r, ok := s.cachedDenial(o.c, n); ok {
			o.result, o.done, o.cached = r, true, true
			denied = denied || !o.c.Shadow
		}
	}
	// Leased charges are decided here from this Store's leases: no write unless a lease must
	// be renewed. A rejection among them rejects the group before anything is written.
	for i := range ops {
		o := &ops[i]
		if denied || o.done || !leased(o.c) {
			continue
		}
		spent, r, err := s.ls.Take(ctx, o.c, n)
		if err != nil {
			giveBack(ops)
			return false, err
		}
		o.lease, o.result, o.done, o.pooled = spent, r, true, true
		denied = !o.result.Allowed && !o.c.Shadow
	}
	if denied {
		giveBack(ops)
		for i := range ops {
			if !ops[i].done {
				ops[i].result = bucket.Result{Allowed: true, Limit: limitValue(ops[i].c.Limit)}
			}
			results[i] = ops[i].result
		}
		return false, nil
	}
	for i := range ops {
		if !ops[i].done {
			s.prepare(&ops[i], n)
		}
	}
	if admitted, decided, err := s.takeSlots(ctx, ops, n); decided {
		// Decided here means refused (or failed): the leased units the group took go back.
		giveBack(ops)
		for i := range ops {
			results[i] = ops[i].result
		}
		return admitted, err
	}
	if err := s.loadClosedSlots(ctx, ops, n); err != nil {
		s.refund(ctx, ops) // the slots taken, if any
		giveBack(ops)
		return false, err
	}
	var admitted bool
	var err error
	if s.mode == Transaction && transactable(ops) {
		admitted, err = s.takeTransaction(ctx, ops, n)
	} else {
		admitted, err = s.takeRefund(ctx, ops, n)
	}
	if err != nil || !admitted {
		giveBack(ops)
	} else {
		spent(ops)
	}
	if err != nil {
		return false, err
	}
	for i := range ops {
		results[i] = ops[i].result
		if o := &ops[i]; admitted && isGCRA(o.c.Limit) && o.wid != 0 {
			// What a charge_on refund conditions on (see Release).
			results[i].Token = o.wid
		}
		s.remember(&ops[i], n)
	}
	if admitted {
		s.holdSlots(ops)
	}
	return admitted, nil
}

// giveBack returns the units that the group's leased charges spent: the group was rejected.
func giveBack(ops []op) {
	for i := range ops {
		if o := &ops[i]; o.lease.GiveBack() {
			o.result = bucket.Result{Allowed: true, Limit: o.result.Limit}
		}
	}
}

// spent counts the units of an admitted group's leased charges.
func spent(ops []op) {
	for i := range ops {
		ops[i].lease.Keep()
	}
}

func limitValue(l bucket.Limit) int64 {
	if isCounter(l) || l.Algorithm == bucket.SlidingWindow || l.Algorithm == bucket.Concurrency {
		return l.Count
	}
	return l.Burst
}

func (s *Store) cachedDenial(c bucket.Charge, n int64) (bucket.Result, bool) {
	if s.deny == nil {
		return bucket.Result{}, false
	}
	d, ok := s.deny.get(c.Key, n)
	if !ok || d.limit != c.Limit || d.cost != c.N() {
		return bucket.Result{}, false
	}
	s.m.denyHits.Inc()
	return bucket.Result{
		Limit:      limitValue(c.Limit),
		Remaining:  d.remaining,
		RetryAfter: time.Duration(d.retryAt - n),
		Reset:      time.Duration(max(0, d.resetAt-n)),
	}, true
}

// remember feeds the local caches with what a decision learned.
func (s *Store) remember(o *op, n int64) {
	if o.cached || !o.done || o.pooled {
		return
	}
	r := o.result
	// A concurrency slot, or a refundable charge, may come back any moment: such refusals are
	// not cached.
	if !r.Allowed && s.deny != nil && r.RetryAfter > 0 && o.c.Limit.Algorithm != bucket.Concurrency && !o.c.MayGiveBack {
		retryAt := n + int64(r.RetryAfter)
		s.deny.put(o.c.Key, denial{limit: o.c.Limit, cost: o.c.N(), retryAt: retryAt, resetAt: n + int64(r.Reset), remaining: r.Remaining}, retryAt, n)
	}
	if isGCRA(o.c.Limit) && r.Reset > 0 && !o.coalesced {
		// While tat is in the future, the next request most likely finds it there: form (b).
		tat := n + int64(r.Reset)
		s.hints.put(o.c.Key, tat, tat, n)
	}
}

func isGCRA(l bucket.Limit) bool {
	return l.Algorithm == bucket.TokenBucket || l.Algorithm == bucket.LeakyBucket
}

// prepare names the charge's item and picks the first form of its write.
func (s *Store) prepare(o *op, n int64) {
	key := o.c.Key.String()
	switch l := o.c.Limit; l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		o.pk = schema.BucketKey(key)
		o.t, o.tau = bucket.GCRAParams(l)
		_, o.formB = s.hints.get(o.c.Key, n)
		if w := o.c.N(); w > 1 {
			if _, r := bucket.GCRAN(n, n, l, w); !r.Allowed {
				// More than a full bucket holds (the policy package refuses such a cost):
				// no write could ever take it, and form (a) would not check.
				o.done, o.result = true, r
			}
		}
	case bucket.FixedWindow:
		o.pk = schema.WindowKey(key, fixedEnd(l, n)-int64(l.Window))
	case bucket.Quota:
		o.pk = quotaItem(key, l, n)
	case bucket.SlidingWindow:
		o.cur = slotOf(l, n)
		o.pk = key + "#s" + strconv.FormatInt(o.cur, 10)
	case bucket.Concurrency:
		o.pk = key + "#c"
		o.slot = s.rnd.Marker()
	default:
		o.err = fmt.Errorf("dynamo: key %s: unknown algorithm %d", key, l.Algorithm)
	}
}
