// Package bucket holds the rate-limit algorithms and the state stores that apply them.
//
// The algorithms (token bucket and leaky bucket as GCRA, fixed window, sliding window) are pure
// functions of (state, limit, now): they never read a clock, do I/O or lock. A Store applies them
// to keyed state; Memory is the embedded store, and internal/dynamo provides the shared one.
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
	// Count is the number of requests admitted per Window (fixed and sliding window).
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
