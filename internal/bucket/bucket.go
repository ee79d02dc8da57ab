// Package bucket holds the rate-limit algorithms and the Store contract of the stores that apply them.
//
// The algorithms (token bucket and leaky bucket as GCRA, fixed window, sliding window, and the
// concurrency limit) are pure functions of (state, limit, now): they never read a clock, do I/O
// or lock. A Store applies them to keyed state; internal/memstore is the embedded store, and
// internal/dynamo provides the shared one. Store.Release gives admitted charges back: a concurrency slot when its
// request ends, and a charge_on reservation when the answer turns out not to be charged.
package bucket

import (
	"context"
	"encoding/hex"
	"time"
)

// Algorithm selects how a Limit is enforced.
type Algorithm uint8

// The algorithms. The zero Algorithm is invalid.
const (
	TokenBucket Algorithm = iota + 1
	LeakyBucket
	FixedWindow
	SlidingWindow
	// Concurrency limits the requests in flight per key to Count: a slot is taken when the
	// group is admitted and given back by Store.Release when the request ends.
	Concurrency
	// Quota admits Count requests per calendar Period (a day, week or month in Zone).
	Quota
)

// Period is a quota's calendar period.
type Period uint8

// The periods. The zero Period is invalid.
const (
	Day   Period = iota + 1 // from midnight to midnight: 23, 24 or 25 hours in a zone with DST
	Week                    // seven days from midnight of the Limit's Offset weekday
	Month                   // a calendar month (28 to 31 days) from day 1+Offset
)

// Nominal is the period's usual length, for headers that describe a quota by a window in
// seconds (RateLimit-Policy's w): a day of 24 hours, a week of 7 days, a month of 30 days. The
// calendar decides the real bounds (QuotaPeriod).
func (p Period) Nominal() time.Duration {
	switch p {
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// Limit is one policy's limit for one key. Buckets use Rate and Burst; windows use Count and
// Window; quotas use Count, Period, Offset and Zone. Values are assumed valid (the policy
// package validates them).
type Limit struct {
	Algorithm Algorithm
	// Period is a quota's calendar period. (Period and Offset sit in the padding after
	// Algorithm: they cost the other algorithms' copies of a Limit nothing.)
	Period Period
	// Offset moves a quota's period start by whole days, as API Gateway's usage-plan offset
	// does: for Week the weekday the week starts on (0 Sunday ... 6 Saturday, time.Weekday's
	// numbering), for Month the days after the 1st (0 to 27, so that every month has the day);
	// 0 for Day.
	Offset uint8
	// Rate is the refill (token bucket) or drain (leaky bucket) rate in requests per second.
	Rate float64
	// Burst is the capacity of a token bucket, or the number of requests that may wait behind
	// the one being served in a leaky bucket.
	Burst int64
	// Count is the number of requests admitted per Window (fixed and sliding window), or the
	// number of requests in flight at once (concurrency).
	Count  int64
	Window time.Duration
	// Zone is the time zone of a quota's calendar; nil means UTC.
	Zone *time.Location
}

// Key identifies one bucket: a digest of the policy and the (hashed) client key value, so
// raw client identifiers never reach a store.
type Key [16]byte

// String returns the key in lowercase hex, the form used in external stores.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Charge asks a Store to spend Cost requests of Limit from the bucket Key.
type Charge struct {
	Key   Key
	Limit Limit
	// Shadow charges never reject the group; they are committed only when they conform themselves.
	Shadow bool
	// Cost is how many requests' worth this charge spends, all or nothing: a charge of cost 5
	// conforms only when 5 fit. 0 means 1, so that a Charge literal without it spends one.
	Cost int64
	// MayGiveBack marks a charge that Releaser.Release may give back (charge_on), so a store must
	// not assume that its counts only grow: the DynamoDB store's deny cache skips such charges.
	MayGiveBack bool
	// Lease asks a shared store to serve the charge from capacity leased in batches; stores
	// that keep state in this process ignore it.
	Lease Lease
	// Pool names whose share of the memory store's keys a new key takes: the policy's name,
	// or the RLS domain's ("rls:" and the domain). A flood of new keys in one pool fills only
	// its own share, so it never refuses a new key of another (see Memory). Other stores
	// ignore it.
	Pool string
}

// N returns the number of requests the charge spends: Cost, or 1 when Cost is 0 (or negative).
func (c *Charge) N() int64 {
	if c.Cost > 1 {
		return c.Cost
	}
	return 1
}

// Lease is a policy's lease mode. The zero Lease is off.
type Lease struct {
	// Shards is how many items the bucket is split over (0: leases are off).
	Shards int
	// TTL is how long a leased unit may be held before it is spent (0: the store's default).
	TTL time.Duration
}

// On reports whether leases are on.
func (l Lease) On() bool { return l.Shards > 0 }

// Result is one charge's verdict.
type Result struct {
	// Allowed reports whether this charge conforms on its own.
	Allowed bool
	// Limit is the value for X-RateLimit-Limit: Burst for buckets, Count for windows.
	Limit int64
	// Remaining is what is left after this request: how many requests of cost 1 would still
	// conform at this instant (0 for the last admitted one). For a rejection it is what is left
	// without it, which is less than the charge's cost (0 for a rejected charge of cost 1).
	Remaining int64
	// Reset is the time from now until the quota is fully restored.
	Reset time.Duration
	// RetryAfter is, for a charge that does not conform, the time from now until it would.
	RetryAfter time.Duration
	// Wait is how long a leaky-bucket request must be held before it is forwarded.
	Wait time.Duration
	// Token is what a store needs back in Taken.Token to release this charge (for example the
	// lease generation of a DynamoDB concurrency slot); opaque to callers, 0 when unused.
	Token uint64
}

// Taken is one admitted charge handed back to Store.Release.
type Taken struct {
	Charge Charge
	// At is the instant the charge was taken: Take's now.
	At time.Time
	// Token is the charge's Result.Token.
	Token uint64
}

// Store applies charges to keyed state. Implementations must be safe for concurrent use.
//
// Take evaluates charges as one group at instant now and writes charge i's verdict to
// results[i] (len(results) >= len(charges)). The group is admitted when every non-shadow charge
// conforms; then every conforming charge is committed. When the group is not admitted nothing is
// committed, so a request rejected by one policy consumes nothing of another's quota. An error
// means the store could not decide (timeout, outage); the caller applies its on_error rule.
type Store interface {
	Take(ctx context.Context, now time.Time, charges []Charge, results []Result) (admitted bool, err error)
}

// Releaser is a Store that can give admitted charges back; every Store of this module is one.
// Concurrency limits and charge_on policies need it: the gateway refuses to start them on a store
// that is not.
//
// Release gives back charges of admitted groups at instant now, each at most once (the caller
// keeps that promise: a store cannot tell a slot released twice from two slots). A Concurrency
// charge frees its slot. Any other charge is given back (charge_on: the answer was not one that
// costs) only as far as it leaves the state no roomier, at any later instant, than if the charge
// had never been made: exact or stricter, never looser, whatever the order of takes and
// give-backs (docs/algorithms.md, "Give-backs"; buckettest.RunGiveBack is the adversary that
// checks it). A fixed window or a quota gives the Cost back while its window or period is still
// open, a sliding window while the charge's slot is still counted. A token bucket forgets idle
// time, so a write after the charge may have absorbed part of it: the memory store gives the
// Cost back only while the bucket's state is still what the charge's write left (Taken.Token),
// and nothing otherwise. Leaky-bucket charges are never given back (their requests were held for
// their turn already). An error means some charges may not have been given back (stricter,
// until a concurrency lease expires or a window ends). Implementations must give slots back even
// when ctx has no deadline left to offer: callers pass a context of their own, not the finished
// request's.
type Releaser interface {
	Store
	Release(ctx context.Context, now time.Time, taken []Taken) error
}
