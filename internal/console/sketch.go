package console

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"slices"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// topSketch finds the heaviest keys of a stream in fixed memory: Space-Saving (Metwally,
// Agrawal and El Abbadi, 2005) over at most k entries kept in a min-heap by count.
//
// A key already tracked has its counts raised. A new key, while there is room, gets an entry of
// its own; once the sketch is full it takes over the entry with the smallest count c and starts
// from c+1, with error c. So a key's count overstates its true count by at most its error, and
// every error is at most N/k (N: the requests seen): any key seen more than N/k times is
// tracked. Counts of 429s are the key's own since it entered (they never overstate).
//
// Written here rather than taken from a library: the maintained Go sketches (count-min, top-k
// over strings) keep string keys and no per-key side counts, where this one keeps the 16-byte
// bucket key, the key's display label and its limit. Its index of keys is its own too: a bucket
// key is already a digest (SHA-256 of the key's value), so the index places a key by its own
// bytes (mixed with a per-sketch seed, so that callers choosing values cannot choose where
// their keys land) instead of hashing it again as a Go map would, which was a third of the
// console's cost per request. Not safe for concurrent use: the policy's mutex guards it.
type topSketch struct {
	k       int
	entries []topEntry // a min-heap by count
	total   uint64     // requests seen: N of the error bound
	// slots is an open-addressing index (linear probing, at most half full) of the entries:
	// entry index + 1, 0 for an empty slot. entries[i].slot is where entry i sits in it.
	slots []int32
	shift uint   // a key's home slot is its mixed bits >> shift
	seed  uint64 // mixed into a key's bits
}

// topEntry is one tracked key.
type topEntry struct {
	key      bucket.Key
	label    string       // as the access log shows the key: its pseudonym
	limit    bucket.Limit // the limit its last request was charged under
	requests uint64       // requests counted (overstated by at most err)
	limited  uint64       // of which refused, since the key entered the sketch
	err      uint64       // the count it inherited when it took over an entry
	slot     int32        // its position in the sketch's index
}

func newTopSketch(k int) *topSketch {
	bits := uint(1)
	for 1<<bits < 2*k {
		bits++
	}
	return &topSketch{k: k, entries: make([]topEntry, 0, k), slots: make([]int32, 1<<bits), shift: 64 - bits,
		seed: rand.Uint64() | 1}
}

// home is key's first slot: both halves of the key folded, mixed with the seed, and
// multiplied (Fibonacci hashing), so that keys differing in any byte spread over the slots.
func (s *topSketch) home(key *bucket.Key) int {
	lo := binary.LittleEndian.Uint64(key[:8])
	hi := binary.LittleEndian.Uint64(key[8:])
	return int(((lo ^ s.seed) ^ bits.RotateLeft64(hi, 31)) * 0x9e3779b97f4a7c15 >> s.shift)
}

// find returns the index of key's entry, -1 when it is not tracked. The first probe is
// inlined into callers: with the index at most half full, it is usually the only one.
func (s *topSketch) find(key *bucket.Key) int {
	pos := s.home(key)
	if v := s.slots[pos]; v == 0 || s.entries[v-1].key == *key {
		return int(v - 1)
	}
	return s.probe(key, pos)
}

// probe goes on from pos, where find's first probe met another key.
func (s *topSketch) probe(key *bucket.Key, pos int) int {
	mask := len(s.slots) - 1
	for {
		pos = (pos + 1) & mask
		v := s.slots[pos]
		if v == 0 || s.entries[v-1].key == *key {
			return int(v - 1)
		}
	}
}

// place puts entry i (whose key is not in the index) in the first free slot from its home.
func (s *topSketch) place(i int) {
	mask := len(s.slots) - 1
	pos := s.home(&s.entries[i].key)
	for s.slots[pos] != 0 {
		pos = (pos + 1) & mask
	}
	s.slots[pos] = int32(i + 1)
	s.entries[i].slot = int32(pos)
}

// unplace removes the entry at slot pos from the index, moving back the entries after it that
// a probe from their home would otherwise no longer reach (deletion without tombstones).
func (s *topSketch) unplace(pos int) {
	mask := len(s.slots) - 1
	for {
		s.slots[pos] = 0
		next := pos
		for {
			next = (next + 1) & mask
			v := s.slots[next]
			if v == 0 {
				return
			}
			// The entry at next may move to pos unless its home lies cyclically in (pos, next].
			if h := s.home(&s.entries[v-1].key); (next-h)&mask >= (next-pos)&mask {
				s.slots[pos] = v
				s.entries[v-1].slot = int32(pos)
				pos = next
				break
			}
		}
	}
}

// add counts one request of key (refused when limited) and returns its entry, fresh when the
// key has just entered the sketch: the caller then sets its label, so that a pseudonym is
// computed once per entry, not per request. The entry is valid until the next add.
func (s *topSketch) add(key bucket.Key, limited bool, lim *bucket.Limit) (e *topEntry, fresh bool) {
	var lw uint64
	if limited {
		lw = 1
	}
	s.total++
	if i := s.find(&key); i >= 0 {
		return &s.entries[s.bump(i, 1, lw, lim)], false
	}
	return s.insert(&key, 1, lw, lim), true
}

// bump counts w requests (lw of them refused) of the tracked entry i and returns where it
// went. A count only grows, so the entry can only move down the heap, and only when a child
// now counts less: checked here so that the common case calls nothing.
func (s *topSketch) bump(i int, w, lw uint64, lim *bucket.Limit) int {
	e := &s.entries[i]
	e.requests += w
	e.limited += lw
	e.limit = *lim
	if l := 2*i + 1; l < len(s.entries) && s.entries[l].requests < e.requests ||
		l+1 < len(s.entries) && s.entries[l+1].requests < e.requests {
		return s.down(i)
	}
	return i
}

// insert tracks key, not tracked yet, with w requests (lw of them refused): in an entry of its
// own while there is room, else in place of the minimum (the heap's root), from count min+w
// with error min (Space-Saving with weights). It returns the key's entry. The caller has added
// w to s.total.
func (s *topSketch) insert(key *bucket.Key, w, lw uint64, lim *bucket.Limit) *topEntry {
	if len(s.entries) < s.k {
		s.entries = append(s.entries, topEntry{key: *key, limit: *lim, requests: w, limited: lw})
		i := len(s.entries) - 1
		s.place(i)
		return &s.entries[s.up(i)]
	}
	e := &s.entries[0]
	s.unplace(int(e.slot))
	min := e.requests
	*e = topEntry{key: *key, limit: *lim, requests: min + w, limited: lw, err: min}
	s.place(0)
	return &s.entries[s.down(0)]
}

func (s *topSketch) less(i, j int) bool { return s.entries[i].requests < s.entries[j].requests }

func (s *topSketch) swap(i, j int) {
	s.entries[i], s.entries[j] = s.entries[j], s.entries[i]
	s.slots[s.entries[i].slot] = int32(i + 1)
	s.slots[s.entries[j].slot] = int32(j + 1)
}

// up restores the heap above i and returns where the entry at i went.
func (s *topSketch) up(i int) int {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return i
		}
		s.swap(i, p)
		i = p
	}
	return i
}

// down restores the heap below i and returns where the entry at i went.
func (s *topSketch) down(i int) int {
	n := len(s.entries)
	for {
		l := 2*i + 1
		if l >= n {
			return i
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return i
		}
		s.swap(i, m)
		i = m
	}
}

// findLabel returns the entry labelled label, for lookups by pseudonym.
func (s *topSketch) findLabel(label string) (topEntry, bool) {
	for _, e := range s.entries {
		if e.label == label {
			return e, true
		}
	}
	return topEntry{}, false
}

// TopKey is one heavy hitter as the API shows it.
type TopKey struct {
	Key      string `json:"key"`
	Requests uint64 `json:"requests"`
	Limited  uint64 `json:"limited"`
	// Error is how much Requests may overstate the key's true count (Space-Saving's bound).
	Error uint64 `json:"error"`
}

// mergeTop adds the entries of sketches into one list by label (the same key in two
// generations, or on two replicas, is one key: their counts and errors add up), heaviest first,
// cut to n (n <= 0: all).
func mergeTop(n int, lists ...[]TopKey) []TopKey {
	byKey := make(map[string]int)
	var out []TopKey
	for _, l := range lists {
		for _, t := range l {
			if i, ok := byKey[t.Key]; ok {
				out[i].Requests += t.Requests
				out[i].Limited += t.Limited
				out[i].Error += t.Error
				continue
			}
			byKey[t.Key] = len(out)
			out = append(out, t)
		}
	}
	slices.SortStableFunc(out, func(a, b TopKey) int {
		switch {
		case a.Requests != b.Requests:
			if a.Requests > b.Requests {
				return -1
			}
			return 1
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

// MergeTop merges the top lists of several replicas into one, heaviest first, cut to n: what
// `ratelimit-proxy admin top --replica URL --replica URL` shows.
func MergeTop(n int, lists ...[]TopKey) []TopKey { return mergeTop(n, lists...) }

// list returns the sketch's entries as TopKeys.
func (s *topSketch) list() []TopKey {
	out := make([]TopKey, len(s.entries))
	for i, e := range s.entries {
		out[i] = TopKey{Key: e.label, Requests: e.requests, Limited: e.limited, Error: e.err}
	}
	return out
}
