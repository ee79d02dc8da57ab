// Package dynamo is the shared rate-limit store: every replica of the gateway updates the same
// counters in one DynamoDB table, so a limit holds across all of them.
//
// # Algorithms as conditional writes
//
// Each charge is part of one conditional UpdateItem (one per charge, or per batch of charges of
// one item: see Coalescing); no decision reads before it writes, and DynamoDB serialises writes to
// one item, so counts are exact under any concurrency:
//
//   - token and leaky bucket (GCRA, one number tat in Unix ns): SET tat = now+T, since = now
//     when the bucket is full or idle (tat absent or < now), else SET tat = tat+T while
//     now <= tat <= now+tau-T. A failed condition returns the current tat
//     (ReturnValuesOnConditionCheckFailure ALL_OLD), which says exactly whether the other form
//     applies or the request is over the limit and until when;
//   - fixed window: ADD count 1 while count <= Count-1, on the window's own item;
//   - sliding window (K=10 slots per window, the bucket package's exact upper bound): one counter
//     item per slot; the current slot gets ADD count 1 while count <= Count - 1 - (sum of the K
//     closed slots still counted) and the slot is not sealed. A closed slot's count is learnt
//     once per Store and cached: a slot that closed less than Options.LateWrites ago is sealed
//     first (UpdateItem SET sealed = true, ALL_NEW), because a write decided in it may still be
//     on its way and must not land unseen; that write then fails its condition and its request
//     is rejected (RetryAfter at least the rest of its slot). Older slots are final and read
//     (BatchGetItem, ConsistentRead). Seals and the read go out concurrently.
//
// Writes return ALL_NEW. Results (Remaining, Reset, RetryAfter, Wait) follow from the values the
// writes return with the bucket package's arithmetic.
//
// # Coalescing (Refund mode)
//
// A Store keeps at most one conditional write in flight per item. Charges that arrive for an item
// while its write is in flight queue, and when it returns they go out together (up to 128) as one
// weighted write (group commit): GCRA SET tat = n+m*T (idle) or tat = tat+m*T while
// tat <= n+tau-m*T; windows ADD count m while count <= Count-m. n is the latest now of the batch:
// a queued request is decided when its write happens, no earlier than it arrived, so this is GCRA
// (or the window) applied to the batch's requests one after another at that instant. When the
// condition fails, the returned value says exactly how many fit; the first ones (arrival order)
// are written and the rest rejected, each with the Result of its place in the sequence (its
// durations counted from n, which a request's own now precedes by at most its wait in the queue).
// The Store remembers the tat its last write left, so the first write of a batch is usually right.
//
// Why: writes of one process to an item are serial, so they never reach DynamoDB out of the order
// in which they were decided (which cost GCRA a second write in the other form), and a process
// writes a hot item about once per round trip whatever its request rate. That is the answer to
// DynamoDB's limit of about 1,000 writes per second to one partition key: a hot key (a global
// limit, a busy client) costs each replica about 1/RTT writes per second instead of one per
// request, so the item's write rate is bounded by replicas/RTT (at 5 ms per write, 5 replicas stay
// within 1,000 writes/s at any request rate; one write per request reaches it at 1,000 req/s).
//
// Each request still has its own deadline and returns when it ends. A batch's writes run under a
// context carrying the latest deadline of its requests (not the cancellation of the one that
// came first), cancelled when all of its requests have left. A request that leaves while its
// batch is being written may still have its charge applied and not refunded: that only makes the
// limit stricter. A request that leaves while queued drops out of the queue, so a dead or slow
// DynamoDB holds at most the requests still within their deadlines, and one writer goroutine per
// item with queued requests. A failed write fails every request of its batch with its error.
// Refunds are not coalesced. Transaction mode does not coalesce.
//
// # Clock skew and late writes
//
// Replicas take now from their own clocks. GCRA and fixed windows stay exact with skewed clocks
// (skew only shifts when one replica thinks a window rolls or a token refills). The sliding
// window caches closed slots, which is exact only if no write lands in a slot after a replica
// took its count. Sealing guarantees that for slots taken within Options.LateWrites (H) of their
// end: a write decided in such a slot that lands after the seal, late on the network or from a
// replica whose clock lags, is rejected rather than missed (stricter, never looser). A slot
// taken later is read, which assumes that every write decided in it has landed by then: that
// holds while a replica's clock error plus its write's latency stays within H. A replica whose
// clock lags by more than that, or one whose clock steps back by more, can still add to a slot
// that others have read and cached, and exceed the bound by what it admits in that time. A
// replica whose clock runs ahead by d seals slots d early, so in-sync replicas reject the
// requests of the last d of each slot for the keys it touched. Keep clocks in sync (NTP:
// milliseconds against H of seconds).
//
// # Group semantics
//
// A request rejected by one policy consumes nothing of the others. Mode selects how:
//
//   - Refund (default): all charges' conditional writes go out concurrently (one round trip, or
//     two when an item's write was in flight; see Coalescing);
//     when the group is rejected, the writes that were applied are undone (GCRA tat -= T while
//     since is still the one the write returned, i.e. the bucket was not reset by a write that
//     found it idle, which already discarded our charge; windows count -= 1). Best effort, one
//     attempt each (a refund is not idempotent, so the SDK must not retry it), within the
//     decision's own deadline, so nothing of a decision outlives it (a decision that ran out of
//     time keeps its applied charges spent). A failed refund leaves the limit stricter by one
//     request, never looser, and is
//     counted in ratelimit_dynamodb_errors_total{op="refund"}. Between the write and its refund
//     another replica may see the extra request, so a concurrent request may be rejected that a
//     single-node store would have admitted (again stricter, never looser).
//   - Transaction: the non-shadow charges go in one TransactWriteItems (all or nothing, two write
//     units per item; never coalesced, since a transaction cannot take other requests'
//     charges). DynamoDB returns no values from a transaction, so Remaining and Reset of an
//     admitted group come from a consistent read right after it (one more call; it may include
//     other replicas' later requests, so it never overstates what is left). A committed charge
//     stays admitted even when the value read leaves no room for it (others wrote after it); a
//     leaky bucket's Wait is then the latest its turn can be (tau-T). When the read fails, the
//     committed charges are refunded, except GCRA charges written as tat+T: the transaction
//     returns no since to condition their refund on (stricter). Groups of one charge, or with
//     two charges on one item, use the Refund path.
//
// Shadow charges are never part of a transaction: they are written beside it (concurrently) and
// refunded when the group is rejected, as in Refund mode.
//
// # Deny cache
//
// With Options.DenyCache, a charge that is rejected until instant U (now+RetryAfter) is answered
// locally until U without calling DynamoDB. That is safe because shared state only moves towards
// "more used" until U (refunds aside, which only make the cache stricter than the table). When a
// non-shadow charge is rejected from the cache the group is rejected without any call; the other
// charges of that group are then not evaluated and report Allowed with only Limit set. A
// sliding-window rejection because the slot was sealed is cached like any other: until the
// slot ends (by this replica's clock) every request of this Store writes to the sealed slot, and
// after that its RetryAfter comes from counts that are final.
//
// # Table
//
// One table, partition key pk (string), no sort key, on-demand billing, TTL on the numeric
// attribute ttl (Unix seconds). Items (K = the charge's bucket.Key in hex, a digest: no raw client
// value is ever stored):
//
//	pk = K#g           tat (N, Unix ns)   since (N)     ttl   token and leaky bucket state
//	pk = K#w<start>    count (N)                        ttl   fixed window starting at <start> Unix ns
//	pk = K#s<slot>     count (N)          sealed (BOOL) ttl   sliding-window slot number <slot> (Unix ns / (Window/10))
//
// since is the instant of the last write that found the bucket idle; sealed marks a closed
// slot whose count is final (its item exists, without count, when the slot had no request).
//
// ttl is one hour after the item can last affect a decision (tat's latest value, the window's
// end, the instant the slot stops being counted), so DynamoDB's lazy TTL deletion never removes
// live state.
//
// Minimal IAM policy for the table's ARN: dynamodb:UpdateItem and dynamodb:BatchGetItem; with
// Mode Transaction also dynamodb:TransactWriteItems (whose conditional updates need
// dynamodb:UpdateItem, already listed); for create_table: true also dynamodb:CreateTable,
// dynamodb:DescribeTable, dynamodb:DescribeTimeToLive and dynamodb:UpdateTimeToLive.
package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Attribute names. count and ttl are DynamoDB reserved words, so expressions name every
// attribute through ExpressionAttributeNames.
const (
	attrPK    = "pk"
	attrTat   = "tat"
	attrCount = "count"
	attrTTL   = "ttl"
	// attrSince is the instant of the GCRA write that last found the bucket idle (form (a)),
	// which discards the charges before it: a refund applies only within the same since.
	attrSince = "since"
	// attrSealed marks a closed sliding-window slot whose count is final (see sealSlots).
	attrSealed = "sealed"
)

// ttlMargin is how long an item is kept after it can no longer affect a decision.
const ttlMargin = time.Hour

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
}

// Store is a bucket.Store backed by a DynamoDB table. It is safe for concurrent use; the zero
// value is not usable (use New).
type Store struct {
	api   API
	table string
	mode  Mode
	deny  *boundedCache[bucket.Key, denial] // nil when the deny cache is off
	hints *boundedCache[bucket.Key, int64]  // GCRA keys whose tat is in the future: try form (b) first
	slots *boundedCache[slotKey, int64]     // closed sliding-window slot counts
	co    coalescer                         // Refund mode: one write in flight per item
	m     *metrics
	// lateWrites is Options.LateWrites in ns.
	lateWrites int64
}

var _ bucket.Store = (*Store)(nil)

type denial struct {
	limit            bucket.Limit
	retryAt, resetAt int64
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
	s := &Store{
		api:   api,
		table: o.Table,
		mode:  o.Mode,
		hints: newBoundedCache[bucket.Key, int64](size),
		slots: newBoundedCache[slotKey, int64](size),
		co:    coalescer{items: make(map[string]*itemQueue)},
		m:     newMetrics(o.Registerer),

		lateWrites: int64(late),
	}
	if o.DenyCache {
		s.deny = newBoundedCache[bucket.Key, denial](size)
	}
	return s
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

	done      bool // result is final (from the deny cache or a decided write)
	cached    bool // result came from the deny cache
	applied   bool // our write is in the table (and not refunded)
	epoch     epoch
	coalesced bool // decided by its item's writer, which keeps the GCRA hint itself
	result    bucket.Result
	err       error
}

// epoch is the since attribute an applied GCRA write left: known says whether it is known,
// present whether the item had one.
type epoch struct {
	v              int64
	present, known bool
}

func epochOf(item map[string]types.AttributeValue) (epoch, error) {
	v, ok, err := number(item, attrSince)
	return epoch{v: v, present: ok, known: err == nil}, err
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
	if denied {
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
	if err := s.loadClosedSlots(ctx, ops, n); err != nil {
		return false, err
	}
	var admitted bool
	var err error
	if s.mode == Transaction && transactable(ops) {
		admitted, err = s.takeTransaction(ctx, ops, n)
	} else {
		admitted, err = s.takeRefund(ctx, ops, n)
	}
	if err != nil {
		return false, err
	}
	for i := range ops {
		results[i] = ops[i].result
		s.remember(&ops[i], n)
	}
	return admitted, nil
}

func limitValue(l bucket.Limit) int64 {
	if l.Algorithm == bucket.FixedWindow || l.Algorithm == bucket.SlidingWindow {
		return l.Count
	}
	return l.Burst
}

func (s *Store) cachedDenial(c bucket.Charge, n int64) (bucket.Result, bool) {
	if s.deny == nil {
		return bucket.Result{}, false
	}
	d, ok := s.deny.get(c.Key, n)
	if !ok || d.limit != c.Limit {
		return bucket.Result{}, false
	}
	s.m.denyHits.Inc()
	return bucket.Result{
		Limit:      limitValue(c.Limit),
		RetryAfter: time.Duration(d.retryAt - n),
		Reset:      time.Duration(max(0, d.resetAt-n)),
	}, true
}

// remember feeds the local caches with what a decision learned.
func (s *Store) remember(o *op, n int64) {
	if o.cached || !o.done {
		return
	}
	r := o.result
	if !r.Allowed && s.deny != nil && r.RetryAfter > 0 {
		retryAt := n + int64(r.RetryAfter)
		s.deny.put(o.c.Key, denial{limit: o.c.Limit, retryAt: retryAt, resetAt: n + int64(r.Reset)}, retryAt, n)
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
		o.pk = key + "#g"
		o.t, o.tau = bucket.GCRAParams(l)
		_, o.formB = s.hints.get(o.c.Key, n)
	case bucket.FixedWindow:
		o.pk = key + "#w" + strconv.FormatInt(fixedEnd(l, n)-int64(l.Window), 10)
	case bucket.SlidingWindow:
		o.cur = slotOf(l, n)
		o.pk = key + "#s" + strconv.FormatInt(o.cur, 10)
	default:
		o.err = fmt.Errorf("dynamo: key %s: unknown algorithm %d", key, l.Algorithm)
	}
}

// loadClosedSlots fills the closed-slot counts of every sliding-window charge, from the cache or
// from DynamoDB for all that are missing: a slot that closed less than lateWrites ago may still
// receive writes decided in it, so it is sealed (see sealSlots) and its count is the one the seal
// returns; an older one is final and read with one consistent BatchGetItem. The seals and the
// read go out concurrently, and every count learnt is cached until the slot stops counting.
func (s *Store) loadClosedSlots(ctx context.Context, ops []op, n int64) error {
	type miss struct {
		o    *op
		i    int
		slot int64
		pk   string
	}
	var misses []miss
	var seals []seal
	var pks []string
	seen := map[string]bool{}
	for j := range ops {
		o := &ops[j]
		if o.done || o.err != nil || o.c.Limit.Algorithm != bucket.SlidingWindow {
			continue
		}
		w := bucket.SlidingWidth(o.c.Limit)
		for i := 0; i < k; i++ {
			slot := o.cur - k + int64(i)
			if v, ok := s.slots.get(slotKey{o.c.Key, slot}, n); ok {
				o.counts[i] = v
				continue
			}
			pk := o.c.Key.String() + "#s" + strconv.FormatInt(slot, 10)
			misses = append(misses, miss{o, i, slot, pk})
			if seen[pk] {
				continue
			}
			seen[pk] = true
			if (slot+1)*w > n-s.lateWrites { // closed less than lateWrites ago
				seals = append(seals, seal{pk: pk, ttl: ttlAt(leaves(o.c.Limit, slot))})
			} else {
				pks = append(pks, pk)
			}
		}
	}
	if len(misses) == 0 {
		return nil
	}
	var items map[string]map[string]types.AttributeValue
	var readErr error
	var wg sync.WaitGroup
	if len(pks) > 0 {
		wg.Go(func() { items, readErr = s.readItems(ctx, pks) })
	}
	s.sealSlots(ctx, seals)
	wg.Wait()
	if readErr != nil {
		return readErr
	}
	for i := range seals {
		if seals[i].err != nil {
			return seals[i].err
		}
	}
	if len(seals) > 0 {
		if items == nil {
			items = make(map[string]map[string]types.AttributeValue, len(seals))
		}
		for _, sl := range seals {
			items[sl.pk] = sl.item
		}
	}
	for _, m := range misses {
		v, _, err := number(items[m.pk], attrCount)
		if err != nil {
			return fmt.Errorf("dynamo: read %s: %w", m.pk, err)
		}
		m.o.counts[m.i] = v
		s.slots.put(slotKey{m.o.c.Key, m.slot}, v, leaves(m.o.c.Limit, m.slot), n)
	}
	return nil
}

// seal is one closed slot to seal, and what its UpdateItem returned.
type seal struct {
	pk   string
	ttl  types.AttributeValue
	item map[string]types.AttributeValue
	err  error
}

// sealSlots seals the slots concurrently: SET sealed = true (creating the item when the slot is
// empty) returning ALL_NEW. Every write to a slot is conditioned on attribute_not_exists(sealed),
// so after the seal the slot's count is final: a write decided in the slot that lands later is
// rejected instead of being missed by the replicas that cached the count. A seal is idempotent,
// so the SDK may retry it.
func (s *Store) sealSlots(ctx context.Context, seals []seal) {
	if len(seals) == 0 {
		return
	}
	one := func(sl *seal) {
		s.m.requests.WithLabelValues(opSeal).Inc()
		out, err := s.updateItem(ctx, sl.pk, update{
			expr:   "SET #sealed = :true, #ttl = if_not_exists(#ttl, :ttl)",
			names:  map[string]string{"#sealed": attrSealed, "#ttl": attrTTL},
			values: map[string]types.AttributeValue{":true": &types.AttributeValueMemberBOOL{Value: true}, ":ttl": sl.ttl},
		}, types.ReturnValueAllNew)
		if err != nil {
			s.m.errors.WithLabelValues(opSeal).Inc()
			sl.err = fmt.Errorf("dynamo: seal %s: %w", sl.pk, err)
			return
		}
		sl.item = out.Attributes
	}
	if len(seals) == 1 {
		one(&seals[0])
		return
	}
	var wg sync.WaitGroup
	for i := range seals {
		wg.Go(func() { one(&seals[i]) })
	}
	wg.Wait()
}

// maxBatchGet is BatchGetItem's limit of keys per call.
const maxBatchGet = 100

// readItems reads the items pks with strongly consistent reads; missing items are absent from
// the map.
func (s *Store) readItems(ctx context.Context, pks []string) (map[string]map[string]types.AttributeValue, error) {
	out := make(map[string]map[string]types.AttributeValue, len(pks))
	for start := 0; start < len(pks); start += maxBatchGet {
		keys := make([]map[string]types.AttributeValue, 0, min(maxBatchGet, len(pks)-start))
		for _, pk := range pks[start:min(start+maxBatchGet, len(pks))] {
			keys = append(keys, map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: pk}})
		}
		req := map[string]types.KeysAndAttributes{s.table: {Keys: keys, ConsistentRead: aws.Bool(true)}}
		for round := 0; len(req) > 0; round++ {
			if round == maxRounds {
				return nil, fmt.Errorf("dynamo: batch_get: unprocessed keys after %d rounds: %w", round, ErrContention)
			}
			s.m.requests.WithLabelValues(opBatchGet).Inc()
			res, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				s.m.errors.WithLabelValues(opBatchGet).Inc()
				return nil, fmt.Errorf("dynamo: batch_get %s: %w", pks[start], err)
			}
			for _, item := range res.Responses[s.table] {
				if pk, ok := item[attrPK].(*types.AttributeValueMemberS); ok {
					out[pk.Value] = item
				}
			}
			req = res.UnprocessedKeys
		}
	}
	return out, nil
}

// number returns the numeric attribute name of item, and whether it is there.
func number(item map[string]types.AttributeValue, name string) (int64, bool, error) {
	av, ok := item[name]
	if !ok {
		return 0, false, nil
	}
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false, fmt.Errorf("attribute %s is %T, want a number", name, av)
	}
	v, err := strconv.ParseInt(nv.Value, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("attribute %s: %w", name, err)
	}
	return v, true, nil
}

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// ttlAt is the ttl attribute for an item that can affect decisions until instant ns.
func ttlAt(ns int64) types.AttributeValue {
	sec := (ns + int64(time.Second) - 1) / int64(time.Second)
	return num(sec + int64(ttlMargin/time.Second))
}

// update is one conditional write, in the parts UpdateItem and TransactWriteItems share.
type update struct {
	expr, cond string
	names      map[string]string
	values     map[string]types.AttributeValue
}

// write returns the charge's conditional write in its current form.
func (o *op) write(n int64) update {
	l := o.c.Limit
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return gcraWrite(n, o.t, o.tau, 1, o.formB)
	case bucket.FixedWindow:
		return countWrite(l.Count, 1, ttlAt(fixedEnd(l, n)), false)
	default: // SlidingWindow
		return countWrite(l.Count-o.counts.closed(), 1, ttlAt(leaves(l, o.cur)), true)
	}
}

// gcraWrite spends m requests (m*T of slack) from a GCRA bucket at instant n. Form (a), for an
// idle bucket (tat absent or < n), sets tat = n + m*T and needs m*T <= tau; form (b) (formB)
// adds m*T to tat while tat >= n and the result stays within n + tau.
func gcraWrite(n, t, tau, m int64, formB bool) update {
	names := map[string]string{"#tat": attrTat, "#ttl": attrTTL}
	ttl := ttlAt(n + tau) // tat never passes now + tau
	if !formB {
		return update{
			expr:   "SET #tat = :next, #ttl = :ttl, #since = :now",
			cond:   "attribute_not_exists(#tat) OR #tat < :now",
			names:  map[string]string{"#tat": attrTat, "#ttl": attrTTL, "#since": attrSince},
			values: map[string]types.AttributeValue{":next": num(n + m*t), ":now": num(n), ":ttl": ttl},
		}
	}
	return update{
		expr:   "SET #tat = #tat + :t, #ttl = :ttl",
		cond:   "#tat >= :now AND #tat <= :last",
		names:  names,
		values: map[string]types.AttributeValue{":t": num(m * t), ":now": num(n), ":last": num(n + tau - m*t), ":ttl": ttl},
	}
}

// countWrite adds m to a counter while it stays at most limit. With limit < m the condition
// always fails, so the write still reports the current count without changing it. A sliding
// window's slot (sealable) takes the write only while it is not sealed.
func countWrite(limit, m int64, ttl types.AttributeValue, sealable bool) update {
	u := update{
		expr:   "ADD #count :m SET #ttl = :ttl",
		cond:   "attribute_not_exists(#count) OR #count <= :last",
		names:  map[string]string{"#count": attrCount, "#ttl": attrTTL},
		values: map[string]types.AttributeValue{":m": num(m), ":last": num(limit - m), ":ttl": ttl},
	}
	if limit < m {
		u.cond = "#count <= :last"
	}
	if sealable {
		u.cond = "(" + u.cond + ") AND attribute_not_exists(#sealed)"
		u.names["#sealed"] = attrSealed
	}
	return u
}

// refundWrite undoes an applied write of o; false when it cannot be undone safely (a GCRA write
// whose epoch is unknown), which leaves the limit stricter.
func (o *op) refundWrite() (update, bool) {
	if isGCRA(o.c.Limit) {
		// A form (a) write since ours discarded our charge with the old tat: then the refund
		// must not take T off the charges after it.
		u := update{
			expr:   "SET #tat = #tat - :t",
			cond:   "attribute_exists(#tat) AND attribute_not_exists(#since)",
			names:  map[string]string{"#tat": attrTat, "#since": attrSince},
			values: map[string]types.AttributeValue{":t": num(o.t)},
		}
		if o.epoch.present {
			u.cond = "attribute_exists(#tat) AND #since = :since"
			u.values[":since"] = num(o.epoch.v)
		}
		return u, o.epoch.known
	}
	return update{
		expr:   "ADD #count :minus",
		cond:   "attribute_exists(#count)",
		names:  map[string]string{"#count": attrCount},
		values: map[string]types.AttributeValue{":minus": num(-1)},
	}, true
}

// noRetry makes one call a single attempt.
func noRetry(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

// updateItem sends u to item pk; u.cond may be empty (an unconditional write).
func (s *Store) updateItem(ctx context.Context, pk string, u update, rv types.ReturnValue, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	in := &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: pk}},
		UpdateExpression:          aws.String(u.expr),
		ExpressionAttributeNames:  u.names,
		ExpressionAttributeValues: u.values,
		ReturnValues:              rv,
	}
	if u.cond != "" {
		in.ConditionExpression = aws.String(u.cond)
		in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	}
	return s.api.UpdateItem(ctx, in, optFns...)
}

// apply makes o's conditional write until it is applied or the charge is known not to conform.
func (s *Store) apply(ctx context.Context, o *op, n int64) {
	for round := 0; round < maxRounds; round++ {
		s.m.requests.WithLabelValues(opUpdate).Inc()
		out, err := s.updateItem(ctx, o.pk, o.write(n), types.ReturnValueAllNew)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			o.applied = true
			o.epoch, _ = epochOf(out.Attributes)
			if err := o.admit(out.Attributes, n); err != nil {
				o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
			}
			return
		case errors.As(err, &ccf):
			again, cerr := o.conditionFailed(ccf.Item, n)
			if cerr != nil {
				o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, cerr)
				return
			}
			if !again {
				return
			}
		default:
			s.m.errors.WithLabelValues(opUpdate).Inc()
			o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
			return
		}
	}
	o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, ErrContention)
}

// admit sets o's result from the item's values after its write was applied.
func (o *op) admit(item map[string]types.AttributeValue, n int64) error {
	l := o.c.Limit
	o.done = true
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		tat, ok, err := number(item, attrTat)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("no tat after the write")
		}
		o.result = gcraResult(l, tat-o.t, n)
	case bucket.FixedWindow:
		c, _, err := number(item, attrCount)
		if err != nil {
			return err
		}
		o.result = fixedResult(l, c-1, n)
	default:
		c, _, err := number(item, attrCount)
		if err != nil {
			return err
		}
		o.counts[k] = c - 1
		o.result = slidingResult(l, o.cur, &o.counts, n)
	}
	return nil
}

// conditionFailed handles a failed condition given the item as it was (nil when absent). It
// either records that the charge does not conform, or switches the GCRA form and reports that
// the write should be tried again.
func (o *op) conditionFailed(old map[string]types.AttributeValue, n int64) (again bool, err error) {
	l := o.c.Limit
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		tat, ok, err := number(old, attrTat)
		if err != nil {
			return false, err
		}
		switch {
		case !ok || tat < n: // idle (or refunded, or our clock is ahead): form (a)
			o.formB = false
			return true, nil
		case tat <= n+o.tau-o.t: // within the burst: form (b)
			o.formB = true
			return true, nil
		}
		o.done = true
		o.result = gcraResult(l, tat, n)
	case bucket.FixedWindow:
		o.done = true
		o.result = fixedResult(l, l.Count, n)
	default:
		c, _, err := number(old, attrCount)
		if err != nil {
			return false, err
		}
		o.counts[k] = c
		o.done = true
		if _, sealed := old[attrSealed]; sealed {
			o.result = sealedResult(l, o.cur, &o.counts, n)
		} else {
			o.result = slidingResult(l, o.cur, &o.counts, n)
		}
	}
	return false, nil
}

// each runs f on every op that still needs its write, concurrently when there are several.
func each(ops []op, want func(*op) bool, f func(*op)) {
	var pending []*op
	for i := range ops {
		if want(&ops[i]) {
			pending = append(pending, &ops[i])
		}
	}
	if len(pending) == 1 {
		f(pending[0])
		return
	}
	var wg sync.WaitGroup
	for _, o := range pending {
		wg.Go(func() { f(o) })
	}
	wg.Wait()
}

func undecided(o *op) bool { return !o.done && o.err == nil }

// takeRefund writes every charge concurrently and refunds the applied ones when the group is
// rejected or a write failed. In Refund mode the writes are coalesced per item; Transaction
// mode sends the groups it does not transact one write per charge.
func (s *Store) takeRefund(ctx context.Context, ops []op, n int64) (bool, error) {
	if s.mode == Refund {
		s.applyCoalesced(ctx, ops, n)
	} else {
		each(ops, undecided, func(o *op) { s.apply(ctx, o, n) })
	}
	return s.settle(ctx, ops)
}

// settle decides the group from its ops' outcomes and refunds applied writes of a group that is
// not admitted.
func (s *Store) settle(ctx context.Context, ops []op) (bool, error) {
	admitted := true
	var firstErr error
	for i := range ops {
		o := &ops[i]
		if o.err != nil && firstErr == nil {
			firstErr = o.err
		}
		if !o.c.Shadow && !o.result.Allowed {
			admitted = false
		}
	}
	if firstErr != nil || !admitted {
		s.refund(ctx, ops)
	}
	return admitted && firstErr == nil, firstErr
}

// refund undoes the applied writes, best effort, each with one attempt (no SDK retry: a refund
// is not idempotent, and a 500 or a reset connection may follow an applied write; a refund lost
// instead only leaves the limit stricter). The refunds run under the decision's context, so a
// decision never outlives its deadline and leaves nothing running behind it; a decision that
// ran out of time therefore leaves its applied charges spent, which is stricter, never looser.
func (s *Store) refund(ctx context.Context, ops []op) {
	each(ops, func(o *op) bool { return o.applied }, func(o *op) {
		o.applied = false // tried once, never twice
		u, ok := o.refundWrite()
		if !ok {
			return
		}
		s.m.requests.WithLabelValues(opRefund).Inc()
		if _, err := s.updateItem(ctx, o.pk, u, types.ReturnValueNone, noRetry); err != nil {
			s.m.errors.WithLabelValues(opRefund).Inc()
		}
	})
}

// transactable reports whether the group has at least two non-shadow writes, each on its own
// item (a transaction may touch an item only once), and no more than a transaction takes.
func transactable(ops []op) bool {
	seen := map[string]bool{}
	for i := range ops {
		o := &ops[i]
		if !undecided(o) || o.c.Shadow {
			continue
		}
		if seen[o.pk] {
			return false
		}
		seen[o.pk] = true
	}
	return len(seen) >= 2 && len(seen) <= 100
}

// takeTransaction writes the non-shadow charges in one TransactWriteItems and the shadow charges
// beside it.
func (s *Store) takeTransaction(ctx context.Context, ops []op, n int64) (bool, error) {
	// Pick the shadow charges before the transaction starts changing the other ops.
	shadow := make([]bool, len(ops))
	for i := range ops {
		shadow[i] = undecided(&ops[i]) && ops[i].c.Shadow
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		each(ops, func(o *op) bool { return shadow[o.index] }, func(o *op) { s.apply(ctx, o, n) })
	})
	err := s.transact(ctx, ops, n)
	wg.Wait()
	if err != nil {
		s.refund(ctx, ops)
		return false, err
	}
	return s.settle(ctx, ops)
}

func (s *Store) transact(ctx context.Context, ops []op, n int64) error {
	var group []*op
	for i := range ops {
		// Shadow first: the shadow ops are being written concurrently, so their state must
		// not be read here.
		if o := &ops[i]; !o.c.Shadow && undecided(o) {
			group = append(group, o)
		}
	}
	for round := 0; round < maxRounds; round++ {
		items := make([]types.TransactWriteItem, len(group))
		for i, o := range group {
			u := o.write(n)
			items[i].Update = &types.Update{
				TableName:                           aws.String(s.table),
				Key:                                 map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: o.pk}},
				UpdateExpression:                    aws.String(u.expr),
				ConditionExpression:                 aws.String(u.cond),
				ExpressionAttributeNames:            u.names,
				ExpressionAttributeValues:           u.values,
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
		}
		s.m.requests.WithLabelValues(opTransact).Inc()
		_, err := s.api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if err == nil {
			for _, o := range group {
				o.applied = true
				if isGCRA(o.c.Limit) && !o.formB {
					o.epoch = epoch{v: n, present: true, known: true}
				}
			}
			return s.readBack(ctx, group, n)
		}
		var tce *types.TransactionCanceledException
		if !errors.As(err, &tce) || len(tce.CancellationReasons) != len(group) {
			s.m.errors.WithLabelValues(opTransact).Inc()
			return fmt.Errorf("dynamo: transact %s: %w", group[0].pk, err)
		}
		again, rejected := false, false
		for i, reason := range tce.CancellationReasons {
			switch code := aws.ToString(reason.Code); code {
			case "", "None":
			case "ConditionalCheckFailed":
				retry, cerr := group[i].conditionFailed(reason.Item, n)
				if cerr != nil {
					return fmt.Errorf("dynamo: transact %s: %w", group[i].pk, cerr)
				}
				again = again || retry
				rejected = rejected || !retry
			case "TransactionConflict":
				again = true
			default:
				s.m.errors.WithLabelValues(opTransact).Inc()
				return fmt.Errorf("dynamo: transact %s: %s: %w", group[i].pk, code, err)
			}
		}
		if rejected {
			// The charges whose conditions held were not written and their state not returned.
			for _, o := range group {
				if !o.done {
					o.done = true
					o.result = bucket.Result{Allowed: true, Limit: limitValue(o.c.Limit)}
				}
			}
			return nil
		}
		if !again {
			return fmt.Errorf("dynamo: transact %s: cancelled without a reason: %w", group[0].pk, err)
		}
	}
	return fmt.Errorf("dynamo: transact %s: %w", group[0].pk, ErrContention)
}

// readBack sets the results of a committed transaction from a consistent read of its items.
func (s *Store) readBack(ctx context.Context, group []*op, n int64) error {
	pks := make([]string, 0, len(group))
	for _, o := range group {
		if isGCRA(o.c.Limit) && !o.formB {
			continue // SET tat = now + T: the result is known
		}
		pks = append(pks, o.pk)
	}
	var items map[string]map[string]types.AttributeValue
	if len(pks) > 0 {
		var err error
		if items, err = s.readItems(ctx, pks); err != nil {
			return err
		}
	}
	for _, o := range group {
		item := items[o.pk]
		if isGCRA(o.c.Limit) && !o.formB {
			item = map[string]types.AttributeValue{attrTat: num(n + o.t)}
		}
		if err := o.admit(item, n); err != nil {
			return fmt.Errorf("dynamo: read %s: %w", o.pk, err)
		}
		if !o.result.Allowed {
			r, err := o.committed(item, n)
			if err != nil {
				return fmt.Errorf("dynamo: read %s: %w", o.pk, err)
			}
			o.result = r
		}
	}
	return nil
}

// committed is the result of a charge that a transaction committed but whose value read back
// (item) includes other replicas' later writes, so that the arithmetic on it says "rejected":
// the charge stays admitted, with nothing left. For GCRA form (b) the condition held tat <=
// n+tau-T before the write, which bounds the leaky bucket's Wait (our turn came no later), and
// the bucket is full again when the tat read has passed.
func (o *op) committed(item map[string]types.AttributeValue, n int64) (bucket.Result, error) {
	l := o.c.Limit
	if !isGCRA(l) {
		return bucket.Result{Allowed: true, Limit: limitValue(l), Reset: o.result.Reset}, nil
	}
	tat, _, err := number(item, attrTat)
	if err != nil {
		return bucket.Result{}, err
	}
	r := gcraResult(l, min(tat-o.t, n+o.tau-o.t), n)
	r.Reset = max(r.Reset, time.Duration(tat-n))
	return r, nil
}
