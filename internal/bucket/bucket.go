// Package bucket holds the rate-limit algorithms and the state stores that apply them.
//
// The algorithms (token bucket and leaky bucket as GCRA, fixed window, sliding window, and the
// concurrency limit) are pure functions of (state, limit, now): they never read a clock, do I/O
// or lock. A Store applies them to keyed state; Memory is the embedded store, and internal/dynamo
// provides the shared one. Store.Release gives admitted charges back: a concurrency slot when its
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
)

// Limit is one policy's limit for one key. Buckets use Rate and Burst; windows use Count and
// Window. Values are assumed valid (the policy package validates them).
type Limit struct {
	Algorithm Algorithm
	// Rate is the refill (token bucket) or drain (leaky bucket) rate in requests per second.
	Rate float64
	// Burst is the capacity of a token bucket, or the number of requests that may wait behind
	// the one being served in a leaky bucket.
	Burst int64
	// Count is the number of requests admitted per Window (fixed and sliding window), or the
	// number of requests in flight at once (concurrency).
	Count  int64
	Window time.Duration
}

// Key identifies one bucket: a digest of the policy and the (hashed) client key value, so
// raw client identifiers never reach a store.
type Key [16]byte

// String returns the key in lowercase hex, the form used in external stores.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Charge asks a Store to spend one request of Limit from the bucket Key.
type Charge struct {
	Key   Key
	Limit Limit
	// Shadow charges never reject the group; they are committed only when they conform themselves.
	Shadow bool
}

// Result is one charge's verdict.
type Result struct {
	// Allowed reports whether this charge conforms on its own.
	Allowed bool
	// Limit is the value for X-RateLimit-Limit: Burst for buckets, Count for windows.
	Limit int64
	// Remaining is what is left after this request (0 for the last admitted one and for rejections).
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
// charge frees its slot. Any other charge is refunded (charge_on: the answer was not one that
// costs) where the store can do so without ever admitting more than the limit: a fixed window
// while its window is still open, a sliding window while its slot is still counted, a token
// bucket while its refill cannot yet have returned the request (memory: before At plus one
// emission interval; DynamoDB: while no write found the bucket idle since). Otherwise the charge
// stays spent, which is stricter, never looser. Leaky-bucket charges are never refunded (their
// requests were held for their turn already). An error means some charges may not have been
// given back (stricter, until a concurrency lease expires or a window ends). Implementations
// must give slots back even when ctx has no deadline left to offer: callers pass a context of
// their own, not the finished request's.
type Releaser interface {
	Store
	Release(ctx context.Context, now time.Time, taken []Taken) error
}
