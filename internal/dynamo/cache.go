package dynamo

import "sync"

// boundedCache is a map with per-entry expiry instants (Unix ns on the callers' clock, the now
// passed to Take) and a size cap. It is safe for concurrent use.
//
// When full it first drops expired entries and then, if still full, arbitrary ones (Go's map
// order) down to 7/8 of the cap, so inserts stay amortised O(1). Every cache in this package only
// saves calls: losing an entry costs one DynamoDB round trip, never correctness.
type boundedCache[K comparable, V any] struct {
	mu  sync.Mutex
	max int
	m   map[K]cacheEntry[V]
}

type cacheEntry[V any] struct {
	v       V
	expires int64
}

func newBoundedCache[K comparable, V any](maxEntries int) *boundedCache[K, V] {
	return &boundedCache[K, V]{max: max(1, maxEntries), m: make(map[K]cacheEntry[V])}
}

// get returns the value for k when it has not expired at now.
func (c *boundedCache[K, V]) get(k K, now int64) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || now >= e.expires {
		var zero V
		return zero, false
	}
	return e.v, true
}

// put stores v for k until expires (exclusive).
func (c *boundedCache[K, V]) put(k K, v V, expires, now int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		c.shrink(now)
	}
	c.m[k] = cacheEntry[V]{v: v, expires: expires}
}

func (c *boundedCache[K, V]) shrink(now int64) {
	for k, e := range c.m {
		if now >= e.expires {
			delete(c.m, k)
		}
	}
	target := c.max - c.max/8
	for k := range c.m {
		if len(c.m) < target {
			break
		}
		delete(c.m, k)
	}
}
