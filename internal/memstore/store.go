package memstore

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Options configures New. The zero value selects every default.
type Options struct {
	// Shards is the number of independently locked shards, rounded up to a power of two.
	// (Optional) default 8*GOMAXPROCS rounded up, at least 256.
	Shards int
	// MaxKeys caps the tracked keys, all algorithms together: never more are kept. The cap is
	// split across shards (fewer shards when MaxKeys is small, so each holds at least 16), so
	// with unevenly spread keys evictions can begin a few percent below MaxKeys. Each shard's
	// cap is split evenly between the pools (Charge.Pool). A shard or pool at its cap evicts
	// idle keys, then the least used, never a key at its limit: when only such keys are left,
	// new keys are judged in a count-min sketch of 8*MaxKeys cells per kind of limit (see
	// Store and sketch.go). (Optional) default 1_000_000.
	MaxKeys int
}

// Store is the in-process bucket.Store: keyed algorithm state in sharded hash tables, each shard under
// its own mutex. Decisions are exact under concurrency: a group's shards are locked (in ascending
// order, so concurrent groups cannot deadlock) for the whole evaluate-and-commit.
//
// State is small: a token- or leaky-bucket key is its tat, a fixed-window key a FixedState, each
// beside the room its Limit leaves (what eviction needs to tell a key at its limit), in an
// open-addressing table of its own (see table: one cache miss per lookup where a map takes two).
// A sliding-window key is kept in a compact form (16-bit counters, 56 bytes with the key in a
// table of its own) when its counters and slot width fit, and as a
// SlidingState in a map otherwise (Count above 65535, a counter above 65535 left from
// such a Count, or a width without a 16-bit tag); a key moves between the two with its counts
// intact.
//
// A Store stays bounded without a background goroutine. A key is idle when its state equals a
// fresh key's (the bucket is full, every counted request has left its window, nothing in
// flight); a shard forgets its idle keys when it has grown to twice its size after the previous
// sweep, which costs O(1) amortised per new key. Each shard also has a hard cap (MaxKeys split
// across shards): when a sweep leaves a shard within 1/16 of its cap, it evicts live keys down
// to 15/16 of it, the least used first (the smallest share of their limit in use), and never a
// key at its limit (one whose next request of the cost it was last charged would be rejected).
// Each shard's cap is split between the pools the store knows (a policy, an RLS domain: see
// pool.go), and a pool holds at most its share: when every key a new key could displace
// is at its limit, the new key is judged in the store's count-min sketch (sketch.go),
// which may refuse it early but never admits it past its own limit. So a flood of distinct
// keys, however many and however chosen, never resets a key at its limit, never refuses a new
// key of another pool, leaves most new keys of its own pool their own limits, and the store
// never holds more than MaxKeys entries (plus the sketch's fixed size). See docs/operations.md
// ("Memory store") for the trade-off.
//
// A key's shard is chosen by a hash keyed with a secret drawn per store (crypto/rand), so that
// no client can choose key values that land in one shard.
//
// The zero Store is not usable; create one with New. A Store is safe for concurrent use.
type Store struct {
	shards []paddedShard
	mask   uint64
	seed   [4]uint64 // keys the shard choice (see shardOf) and the GCRA tokens (gcraToken)
	pools  pools     // pool names to indexes (see pool.go)
	sk     sketch    // where new keys the shards cannot store are judged (sketch.go)
}

var _ bucket.Releaser = (*Store)(nil)

// minSweep is the smallest size at which a shard sweeps, so that small shards are not swept on
// every insert.
const minSweep = 64

// rebuildPeak is the smallest peak size from which a shard's tables and map are rebuilt to return
// memory.
const rebuildPeak = 8 * minSweep

type shard struct {
	mu      sync.Mutex
	gcra    table[gcraEntry]         // token- and leaky-bucket states
	fixed   table[fixedEntry]        // fixed-window and quota states
	sliding table[compactSliding]    // sliding-window keys whose state fits the compact form
	wide    map[bucket.Key]wideEntry // the other sliding-window keys; a key is in one of the two at most
	conc    table[concEntry]         // concurrency keys
	maxKeys int                      // hard cap on this shard's keys
	sweepAt int                      // sweep before inserting a new key when the shard holds this many
	peak    int                      // most keys seen by a sweep since the tables were last rebuilt
	// fullUntil is, after a sweep that left the shard full of keys at their limit, the first
	// instant one of them may be evicted (math.MaxInt64: only a slot's release frees one): new
	// keys are judged in the sketch until then without sweeping again. 0 when the shard is not
	// full.
	fullUntil int64
	stats     evictions // counted under mu, summed by Store.Evictions
	gen       uint64    // the last generation handed to a new entry (see admit)
	pools     []int32   // keys held per pool index
	// poolFull is, for a pool at its share of the shard after a sweep found nothing of it to
	// evict, the first instant one of its keys may go: its new keys go to the sketch until then.
	poolFull map[uint16]int64
}

// gcraEntry is a token- or leaky-bucket key's state: its tat, and the room the Limit leaves a
// request of the cost it was last charged (tau-cost*T: the key is at its limit while tat-now
// exceeds it). Every entry also carries its meta: its generation (unique in its shard, so that
// a give-back never lands in an entry created again after the one it was counted in was
// evicted) and its pool (see pool.go).
type gcraEntry struct {
	tat, room int64
	meta      uint64
}

// fixedEntry is a fixed-window or quota key's state, and the room its Limit leaves (Count-cost:
// the key is at its limit while its count exceeds it).
type fixedEntry struct {
	bucket.FixedState
	room int64
	meta uint64
}

// wideEntry is a sliding-window key's state kept as a SlidingState, and the room (Count-cost).
type wideEntry struct {
	bucket.SlidingState
	room int64
	meta uint64
}

// concEntry is a concurrency key's state: requests in flight + concStored, and its Count.
type concEntry struct {
	n, count int64
	meta     uint64
}

// paddedShard keeps neighbouring shards' mutexes off each other's cache lines (128 bytes: the
// adjacent-line prefetcher pairs 64-byte lines).
type paddedShard struct {
	shard
	_ [(128 - unsafe.Sizeof(shard{})%128) % 128]byte
}

// New returns an empty memory store configured by o.
func New(o Options) *Store {
	n := o.Shards
	if n <= 0 {
		n = max(256, 8*runtime.GOMAXPROCS(0))
	}
	n = 1 << bits.Len(uint(n-1))
	maxKeys := o.MaxKeys
	if maxKeys <= 0 {
		maxKeys = 1_000_000
	}
	for n > 1 && maxKeys/n < 16 {
		n /= 2
	}
	// Floor division with the remainder handed out one by one: the caps sum to exactly maxKeys.
	perShard, extra := maxKeys/n, maxKeys%n
	m := &Store{shards: make([]paddedShard, n), mask: uint64(n - 1)}
	m.pools.idx = make(map[string]uint16)
	m.sk.init(maxKeys)
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand: it crashes the program instead)
	for i := range m.seed {
		m.seed[i] = binary.LittleEndian.Uint64(seed[8*i:])
	}
	m.seed[3] |= 1
	for i := range m.shards {
		limit := perShard
		if i < extra {
			limit++
		}
		m.shards[i].shard = shard{
			gcra:    newTable[gcraEntry](rand.Uint64()),
			fixed:   newTable[fixedEntry](rand.Uint64()),
			sliding: newTable[compactSliding](rand.Uint64()),
			wide:    make(map[bucket.Key]wideEntry),
			conc:    newTable[concEntry](rand.Uint64()),
			maxKeys: limit,
			sweepAt: min(minSweep, limit),
		}
	}
	return m
}

// shardOf picks a key's shard with a hash keyed by the store's secret seed, drawn from
// crypto/rand by New. Keys are digests of the policy and the client's value, but the
// policy's name is public (429 bodies, RateLimit-Policy) and so is the digest: picking the shard
// from the key's own bits let a client craft values that all land in a victim's shard (256
// tries per key) and fill it. The hash is two rounds of a 64x64->128-bit multiply folded by xor
// (the mixing of wyhash and of Go's own map hash when it lacks AES), each with secret words, so
// where a value lands cannot be predicted without the seed; it costs two multiplications, where
// hash/maphash cost several times more per decision.
func (m *Store) shardOf(k bucket.Key) uint32 {
	hi, lo := bits.Mul64(binary.LittleEndian.Uint64(k[:8])^m.seed[0], binary.LittleEndian.Uint64(k[8:])^m.seed[1])
	hi, lo = bits.Mul64(hi^lo^m.seed[2], m.seed[3])
	return uint32((hi ^ lo) & m.mask)
}

// slidingState returns the key's sliding-window state and meta from whichever map holds it.
func (sh *shard) slidingState(k bucket.Key) (bucket.SlidingState, uint64, bool) {
	if i, ok := sh.sliding.find(&k); ok {
		return sh.sliding.slots[i].st.wide(), sh.sliding.slots[i].st.meta(), true
	}
	e, ok := sh.wide[k]
	return e.SlidingState, e.meta, ok
}

// storeSliding stores a key's sliding-window state and meta, taken under a Limit of this Count
// with this room (Count-cost), compact when it fits and the Count lets it stay so, wide
// otherwise, and removes it from the other map (a move keeps the key's meta: it is the same
// entry).
func (sh *shard) storeSliding(k bucket.Key, st *bucket.SlidingState, count, room int64, meta uint64) {
	if count <= maxCompactCount {
		if cs, ok := compactOf(st); ok {
			cs.room = uint16(max(room, 0))
			cs.setMeta(meta)
			sh.sliding.put(&k, &cs)
			delete(sh.wide, k)
			return
		}
	}
	sh.wide[k] = wideEntry{SlidingState: *st, room: room, meta: meta}
	sh.sliding.remove(&k)
}

// sameState reports whether two algorithms keep their state in the same map.
func sameState(a, b bucket.Algorithm) bool {
	gcra := func(x bucket.Algorithm) bool { return x == bucket.TokenBucket || x == bucket.LeakyBucket }
	fixed := func(x bucket.Algorithm) bool { return x == bucket.FixedWindow || x == bucket.Quota }
	return a == b || gcra(a) && gcra(b) || fixed(a) && fixed(b)
}

// has reports whether c's key is stored in the state kind of c's algorithm.
func (sh *shard) has(c *bucket.Charge) bool {
	var ok bool
	switch c.Limit.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		_, ok = sh.gcra.find(&c.Key)
	case bucket.FixedWindow, bucket.Quota:
		_, ok = sh.fixed.find(&c.Key)
	case bucket.SlidingWindow:
		if _, ok = sh.sliding.find(&c.Key); !ok {
			_, ok = sh.wide[c.Key]
		}
	case bucket.Concurrency:
		_, ok = sh.conc.find(&c.Key)
	}
	return ok
}

func (sh *shard) len() int { return sh.gcra.n + sh.fixed.n + sh.sliding.n + len(sh.wide) + sh.conc.n }

// Len returns the number of keys tracked, for metrics.
func (m *Store) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += sh.len()
		sh.mu.Unlock()
	}
	return n
}

// concStored is added to a concurrency key's in-flight count in its table: the table marks an
// empty slot with the zero state, and a key with nothing in flight stays stored (until a
// sweep finds it idle) so that a busy key is not deleted and inserted again per request.
const concStored = 1

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
