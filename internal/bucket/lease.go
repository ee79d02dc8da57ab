package bucket

import "time"

// Leases split a shared bucket over shards and hand its capacity out in batches; the arithmetic
// that decides how lives here so that the policy package validates with the same numbers the
// store uses.

// MaxLeaseShards bounds Lease.Shards.
const MaxLeaseShards = 64

// DefaultLeaseTTL is the longest default lease TTL.
const DefaultLeaseTTL = 150 * time.Millisecond

// LeaseSupported reports whether leases can serve the algorithm: a token bucket (a lease is
// units of its slack) and a fixed window (units of its count). A sliding window's exact bound
// counts each request in the slot it was admitted in, which a unit leased in one slot and spent
// in a later one would break; a leaky bucket gives each request its own turn to wait for, which
// is not a unit that can be spent anywhere.
func LeaseSupported(a Algorithm) bool { return a == TokenBucket || a == FixedWindow }

// ShardCapacity is shard i's part of a capacity c (a burst or a window's count) split over n
// shards: the parts differ by at most one and add up to c.
func ShardCapacity(c int64, n, i int) int64 {
	q, r := c/int64(n), c%int64(n)
	if int64(i) < r {
		q++
	}
	return q
}

// ShardGCRA returns the emission interval and tolerance of shard i of a token bucket split over n
// shards: each shard refills at rate/n (an interval of exactly n*T) and holds its part of the
// burst, so the shards together never exceed the whole bucket in any interval.
func ShardGCRA(l Limit, n, i int) (t, tau int64) {
	t, _ = GCRAParams(l)
	t *= int64(n)
	return t, ShardCapacity(l.Burst, n, i) * t
}

// LeaseTTL is how long a leased unit of l may be held: lease.TTL when set, else
// DefaultLeaseTTL, or for a token bucket half the smallest shard's burst time if that is
// shorter (a lease's units come out of the burst less rate*TTL). It is 0 when no TTL fits: a
// token bucket whose smallest shard holds fewer than two requests.
func LeaseTTL(l Limit, lease Lease) time.Duration {
	n := max(lease.Shards, 1)
	if l.Algorithm != TokenBucket {
		if lease.TTL > 0 {
			return lease.TTL
		}
		return min(DefaultLeaseTTL, l.Window/2)
	}
	t, tau := ShardGCRA(l, n, n-1) // the last shard holds the smallest part
	room := time.Duration(tau - t) // at most this long, or not even one unit fits
	switch {
	case room <= 0:
		return 0
	case lease.TTL > 0:
		if lease.TTL > room {
			return 0
		}
		return lease.TTL
	}
	return min(DefaultLeaseTTL, time.Duration(tau/2))
}

// LeaseCapacity is the most one lease of l split over n shards with the given TTL can hold: the
// smallest shard's burst less rate*ttl (token bucket), or its part of the limit (fixed window).
func LeaseCapacity(l Limit, n int, ttl time.Duration) int64 {
	if l.Algorithm != TokenBucket {
		return ShardCapacity(l.Count, n, n-1)
	}
	t, tau := ShardGCRA(l, n, n-1)
	return max(0, (tau-int64(ttl))/t)
}
