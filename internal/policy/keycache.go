package policy

// The bucket keys of the key values a rule saw last, so that a client that keeps coming back
// (one address, one API key hammering a limit) costs a keyed fingerprint instead of SHA-256
// digests on every request.

import (
	"encoding/binary"
	"hash/maphash"
	"sync/atomic"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// keyCacheSlots is the number of slots of a rule's cache, a power of two. 256 slots of 48
// bytes are 12 KiB per policy; a slot holds one value's results and is overwritten by the next
// value that maps to it.
const keyCacheSlots = 256

// keyCache maps a key value to its bucket key and sha256 override (what charge needs of it),
// direct-mapped by the value's fingerprint. It holds no key value, nor anything a value could
// be recovered from but the bucket key the store keeps anyway: a slot is found and confirmed by
// a 128-bit fingerprint, maphash under two seeds drawn per cache (per compiled set), so that
// nobody outside the process can choose two values that collide. Slots are seqlocked with
// atomics: a reader that meets a slot being written, or rewritten while it read, misses and
// digests the value as without a cache; writers that meet each other skip the write. Safe for
// concurrent use; it never allocates after newKeyCache.
type keyCache struct {
	seeds [2]maphash.Seed
	slots [keyCacheSlots]keySlot
}

// keySlot is one cached value. seq is odd while a writer fills the slot and grows by two with
// every write, so a reader sees whether the fields it read belong together.
type keySlot struct {
	seq      atomic.Uint64
	fp       [2]atomic.Uint64 // the value's fingerprint; {0, 0} in a slot never written
	key      [2]atomic.Uint64 // the bucket key, big-endian halves
	override atomic.Pointer[override]
}

func newKeyCache() *keyCache {
	return &keyCache{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
}

// fingerprint is v's 128-bit keyed hash. A fingerprint of {0, 0} would match a slot never
// written; it is moved to {0, 1} (the cache then only misses more for that one value).
func fingerprint[V string | []byte](c *keyCache, v V) [2]uint64 {
	var fp [2]uint64
	switch s := any(v).(type) {
	case string:
		fp = [2]uint64{maphash.String(c.seeds[0], s), maphash.String(c.seeds[1], s)}
	case []byte:
		fp = [2]uint64{maphash.Bytes(c.seeds[0], s), maphash.Bytes(c.seeds[1], s)}
	}
	if fp == [2]uint64{} {
		fp[1] = 1
	}
	return fp
}

// get returns the slot's results for the value of fingerprint fp, when the slot holds them.
func (c *keyCache) get(fp [2]uint64) (key bucket.Key, o *override, ok bool) {
	s := &c.slots[fp[0]%keyCacheSlots]
	seq := s.seq.Load()
	if seq&1 != 0 || s.fp[0].Load() != fp[0] || s.fp[1].Load() != fp[1] {
		return key, nil, false
	}
	binary.BigEndian.PutUint64(key[:8], s.key[0].Load())
	binary.BigEndian.PutUint64(key[8:], s.key[1].Load())
	o = s.override.Load()
	if s.seq.Load() != seq {
		return bucket.Key{}, nil, false
	}
	return key, o, true
}

// put stores the results for fp in its slot, unless another writer holds the slot.
func (c *keyCache) put(fp [2]uint64, key bucket.Key, o *override) {
	s := &c.slots[fp[0]%keyCacheSlots]
	seq := s.seq.Load()
	if seq&1 != 0 || !s.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	s.fp[0].Store(fp[0])
	s.fp[1].Store(fp[1])
	s.key[0].Store(binary.BigEndian.Uint64(key[:8]))
	s.key[1].Store(binary.BigEndian.Uint64(key[8:]))
	s.override.Store(o)
	s.seq.Store(seq + 2)
}

// cachedKey returns the bucket key of value v for rule ru (not a global rule), and its sha256
// override (nil without one): from the rule's cache, or digested and then cached.
func cachedKey[V string | []byte](ru *rule, v V) (bucket.Key, *override) {
	if ru.keys == nil {
		return digestKey(ru, v)
	}
	fp := fingerprint(ru.keys, v)
	if key, o, ok := ru.keys.get(fp); ok {
		return key, o
	}
	key, o := digestKey(ru, v)
	ru.keys.put(fp, key, o)
	return key, o
}

// digestKey is cachedKey without a cache: the bucket key is SHA-256(keyPrefix || v) cut to the key's
// length, the override the one whose sha256 key is SHA-256(v).
func digestKey[V string | []byte](ru *rule, v V) (key bucket.Key, o *override) {
	sum := digest(ru.keyPrefix, v)
	copy(key[:], sum[:])
	if ru.hashed != nil {
		o = ru.hashed[digest(nil, v)]
	}
	return key, o
}
