// Package dynamo is the shared rate-limit store: every replica of the gateway updates the same
// counters in one DynamoDB table, so a limit holds across all of them.
//
// # Algorithms as conditional writes
//
// Each charge is part of one conditional UpdateItem (one per charge, or per batch of charges of
// one item: see Coalescing); no decision reads before it writes, and DynamoDB serialises writes to
// one item, so counts are exact under any concurrency:
//
//   - token and leaky bucket (GCRA, one number tat in Unix ns): SET tat = now+T when the
//     bucket is full or idle (tat absent or < now), else SET tat = tat+T while
//     now <= tat <= now+tau-T. A failed condition returns the current tat
//     (ReturnValuesOnConditionCheckFailure ALL_OLD), which says exactly whether the other form
//     applies or the request is over the limit and until when. Each write also pushes itself
//     onto the item's chain of its last 8 writes (a random marker, and tat-now before it), which
//     is what a give-back needs to be exact (see Give-backs);
//   - fixed window: ADD count 1 while count <= Count-1, on the window's own item;
//   - calendar quota: the same, on the item of the period (day, week, month of its zone) that
//     the replica's clock is in (see quota.go);
//   - sliding window (K=10 slots per window, the bucket package's exact upper bound): one counter
//     item per slot; the current slot gets ADD count 1 while count <= Count - 1 - (sum of the K
//     closed slots still counted) and the slot is not sealed. A closed slot's count is learnt
//     once per Store and cached: a slot that closed less than Options.LateWrites ago is sealed
//     first (UpdateItem SET sealed = true, ALL_NEW), because a write decided in it may still be
//     on its way and must not land unseen; that write then fails its condition and its request
//     is rejected (RetryAfter at least the rest of its slot). Older slots are final and read
//     (BatchGetItem, ConsistentRead). Seals and the read go out concurrently.
//
// A charge of cost c (bucket.Charge.Cost) writes c where these say 1 (tat + c*T, ADD count c
// while count <= Count-c), and its refund takes back c.
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
// Replicas take now from their own clocks, and the store is exact for one clock only. A replica
// whose clock runs ahead by d refills a GCRA bucket d early (rate × d more than burst + rate ×
// elapsed across the fleet) and starts the next fixed window or quota period d early (around a
// boundary, up to a window's count more within less than a window). The gateway measures each
// replica's offset against the Date header of DynamoDB's answers (WithDates, package clockref)
// and by default decides on the corrected clock; docs/dynamodb.md states the bound per algorithm
// in terms of the measured error. The sliding
// window caches closed slots, which is exact only if no write lands in a slot after a replica
// took its count. Sealing guarantees that for slots taken within Options.LateWrites (H) of their
// end: a write decided in such a slot that lands after the seal, late on the network or from a
// replica whose clock lags, is rejected rather than missed (stricter, never looser). A slot
// taken later is read, which assumes that every write decided in it has landed by then: that
// holds while a replica's clock error plus its write's latency stays within H. A replica whose
// clock lags by more than that, or one whose clock steps back by more, can still add to a slot
// that others have read and cached, and exceed the bound by what it admits in that time. A
// replica whose clock runs ahead by d seals slots d early, so in-sync replicas reject the
// requests of the last d of each slot for the keys it touched, and it stops counting the oldest
// d of the window d early: the limit then holds over any window − d.
//
// # Group semantics
//
// A request rejected by one policy consumes nothing of the others. Mode selects how:
//
//   - Refund (default): all charges' conditional writes go out concurrently (one round trip, or
//     two when an item's write was in flight; see Coalescing);
//     when the group is rejected, the writes that were applied are given back (see Give-backs;
//     windows count -= c). Each give-back is idempotent and retried until it lands, at most
//     giveBackAttempts times within the decision's own deadline, so nothing of a decision
//     outlives it (a decision that ran out of time keeps what it could not give back spent). A
//     give-back that still fails leaves the limit stricter, never looser, and is counted in
//     ratelimit_dynamodb_giveback_failures_total{op="refund"} and logged. Between the write and its refund
//     another replica may see the extra request, so a concurrent request may be rejected that a
//     single-node store would have admitted (again stricter, never looser).
//   - Transaction: the non-shadow charges go in one TransactWriteItems (all or nothing, two write
//     units per item; never coalesced, since a transaction cannot take other requests'
//     charges). DynamoDB returns no values from a transaction, so Remaining and Reset of an
//     admitted group come from a consistent read right after it (one more call; it may include
//     other replicas' later requests, so it never overstates what is left). A committed charge
//     stays admitted even when the value read leaves no room for it (others wrote after it); a
//     leaky bucket's Wait is then the latest its turn can be (tau-T). When the read fails, the
//     committed charges are given back (see Give-backs). Groups of one charge, or with
//     two charges on one item, use the Refund path.
//
// Shadow charges are never part of a transaction: they are written beside it (concurrently) and
// refunded when the group is rejected, as in Refund mode.
//
// # Give-backs
//
// Every give-back (the refund of a rejected group, a transaction's after a failed read, a
// charge_on refund through Release, a concurrency slot's release) leaves the item no roomier
// than if the charge had never been made. Counts are sums: count -= c is exact at any time
// (while the window, period or slot still counts). A slot release removes its own slot. A token
// or leaky bucket forgets idle time (tat = max(tat, now) + T), so taking T back after other
// writes landed can return refill the bucket had already lost to its cap: with A applied every
// later write i does tat = max(tat, t_i) + T, and without A the difference shrinks to
// max(0, tat_{i-1} - t_i) whenever write i found the A-less bucket idle, which the real item
// does not show. So a GCRA item keeps the chain of its last 8 charge writes (w1..w8: a random
// marker per write; c1..c8: tat - now before each, -1 for a write that found the bucket idle),
// and a give-back of A gives back min(T, the c of every write after A), conditioned on A's write
// still being where it was found in the chain: all of T while nothing wrote since, less (or
// nothing) otherwise, never more (see giveback.go). A charge whose write left the chain (8
// writes since) stays spent: stricter.
//
// # Re-sent writes
//
// The SDK re-sends a call whose answer was lost (a reset connection, a timeout, a 500), and the
// first attempt may have been applied. So every write is idempotent or sent once. Charges are
// sent once (noRetry): a lost answer fails the decision and the charge counts as spent; a GCRA
// charge's marker also lets a duplicate that arrives after it see that it landed. A write's
// outcome is settled only by its own unique marker, never by re-deriving it from state others
// change or by a condition on values that can recur, and every SDK retry is disabled for the
// call or identical to the store's own. So a GCRA give-back writes its id into the chain in
// place of the charge's marker (found wherever later writes move it; the charge's marker never
// comes back); a counter's adds its id to the item's bounded set g, conditioned on the set's
// epoch e (see countRefund); a leased token bucket's is conditioned on the marker its lease
// write left in lv and leaves its id there; a slot release removes its own slot. Counter and
// lease give-backs are sent once per attempt and retried by the store with the same id. A slot
// take applies only while its slot is absent, and a take that got no answer is released at
// once. Seals and renewals set values; a transaction carries the SDK's ClientRequestToken across
// its retries. A write refused with TransactionConflictException was not applied and is retried
// within the deadline. docs/dynamodb.md has the table.
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
// # Leases
//
// A charge whose Lease is on is served from units this Store reserved from the shared item in
// one conditional write (lease*.go): a token bucket's units are places of its schedule taken
// within now + tau - ttl (from a floor a round trip past now: leaseGCRA), each spent within ttl
// of its place (so the units spent in any interval are no more than one exact bucket admits;
// a lease is kept as chunks that expire with their own first units, so its later units outlive
// its first); a fixed window's are part of its count, spent in its window. The bucket may be
// split over shards (rate/k and the burst's parts each, adding up to the whole). Sizes,
// placement and renewals follow each pool's measured round trip (mean + 4 mean deviations, per
// call). On a store whose round trip is a large part of the time a place stays leasable (slow),
// a pool keeps several renewals in flight; those nobody waits for are made as of a round trip
// ahead, their units spent from that instant on, never before; and a shard not seen lately is
// drained to its edge in one write whatever it holds. A request waits for one renewal at most,
// and only one that asked for its units.
//
// Unspent units go back exactly or not at all: a window's count at any time; a token bucket's
// only while no write came after them (lv still the marker of our lease write), since moving
// tat back after another write could return refill the bucket lost to its cap. A lease write is
// sent once (not idempotent); give-backs carry their own id (in lv, or a window's set g) and are
// retried within a bound. A rejected group gives its
// units back to their grants. Every unit leased is counted spent, refunded or expired. See
// docs/shared-pools.md.
//
// # Throttling
//
// A call DynamoDB throttles was not applied; it is retried with full-jitter backoff while the
// decision's deadline allows (retryThrottled), counted, and then fails wrapping ErrThrottled.
//
// # Table
//
// One table, partition key pk (string), no sort key, on-demand billing, TTL on the numeric
// attribute ttl (Unix seconds). Items (K = the charge's bucket.Key in hex, a digest: no raw client
// value is ever stored):
//
//	pk = K#g           tat (N, Unix ns)   w1..w8, c1..c8 (N) ttl  token and leaky bucket state, chain of last writes
//	pk = K#w<start>    count (N)          g (NS), e (N) ttl   fixed window starting at <start> Unix ns
//	pk = K#s<slot>     count (N)          sealed (BOOL) ttl   sliding-window slot number <slot> (Unix ns / (Window/10)); g, e too
//	pk = K#q<start>    count (N)          g (NS), e (N) ttl   calendar quota period starting at <start> Unix ns
//	pk = K#c           count (N)          l<id> (N)     ttl   concurrency slots taken, one l<id> lease expiry per slot (see concurrency.go)
//	pk = K#g#l<i>      tat (N)            lv (N)        ttl   shard i of a leased token bucket; lv: the last write's marker (see lease_giveback.go)
//	pk = K#w<start>#l<i> count (N)        g (NS), e (N) ttl   shard i of a leased fixed window
//
// w1..w8 and c1..c8 are the chain of a bucket's last charge writes (see Give-backs); g holds
// the ids of the give-backs applied to a counter in its epoch e (at most giveBackIDs); lv the
// marker of the last write to a leased bucket's shard; sealed marks a closed slot whose count
// is final (its item exists, without count, when the slot had no request).
//
// ttl is one hour after the item can last affect a decision (tat's latest value, the window's
// or the quota period's end, the instant the slot stops being counted), so DynamoDB's lazy TTL deletion never removes
// live state.
//
// Minimal IAM policy for the table's ARN: dynamodb:UpdateItem and dynamodb:BatchGetItem; with
// Mode Transaction also dynamodb:TransactWriteItems (whose conditional updates need
// dynamodb:UpdateItem, already listed); for create_table: true also dynamodb:CreateTable,
// dynamodb:DescribeTable, dynamodb:DescribeTimeToLive and dynamodb:UpdateTimeToLive.
//
// # Files
//
// store.go routes a decision (deny cache, then the group's mode); writes.go holds each
// algorithm's conditional write and what its outcome means; quota.go the quota's items; slots.go the sliding window's closed
// slots; coalesce.go the per-item writers; refund.go and transaction.go the two group modes;
// giveback.go every give-back's exact and idempotent write;
// lease.go lease mode (lease_take.go spending units, lease_size.go sizing, lease_renew.go
// renewals, lease_grant.go the lease write, lease_giveback.go giving units back, lease_sweep.go
// expiry and close); items.go the calls and attribute values they share, and throttling;
// liveness.go the watch on every call (a slow store from a silent one, the round trip);
// concurrency.go and release.go concurrency slots; cache.go the bounded local caches; table.go
// the table's creation.
package dynamo
