// Package buckettest holds the random generators that the stores' tests share: a group of
// charges for a random history of Take (the Redis store against the memory store, and the
// simulated Redis against redis-server). The conformance suite is internal/bucket/buckettest.
package buckettest

import (
	"math/rand/v2"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Group draws a group of one to three distinct charges of charges (a draw of a key already in
// the group is skipped, so it may hold fewer): a third of those whose algorithm takes a cost
// (neither a concurrency limit nor a leaky bucket) cost 2, and one in shadowOneIn is a shadow
// charge. It draws from rng in a fixed order, so a seed gives its test the same groups.
func Group(rng *rand.Rand, charges []bucket.Charge, shadowOneIn int) []bucket.Charge {
	var group []bucket.Charge
	seen := map[bucket.Key]bool{}
	for range 1 + rng.IntN(3) {
		c := charges[rng.IntN(len(charges))]
		if seen[c.Key] {
			continue
		}
		seen[c.Key] = true
		if c.Limit.Algorithm != bucket.Concurrency && c.Limit.Algorithm != bucket.LeakyBucket && rng.IntN(3) == 0 {
			c.Cost = 2
		}
		c.Shadow = rng.IntN(shadowOneIn) == 0
		group = append(group, c)
	}
	return group
}
