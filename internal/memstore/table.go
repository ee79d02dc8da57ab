package memstore

import (
	"encoding/binary"
	"math/bits"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// table maps keys to states of type S: an open-addressing hash table with linear probing, each
// slot holding the key and its state side by side (32 bytes for a GCRA tat and its room, 40 for a
// FixedState and its room, 56 for a compact sliding state).
//
// Go maps were the first home of every state kind, and a profile of 100k rotating keys showed
// a map spending most of a decision on two cache misses per lookup (the group's control word,
// then the slot, 8+8*slot bytes apart) and a second probe to store the new state. Here a lookup
// usually reads one slot, and the state is updated where it lies.
//
// The zero S marks an empty slot, so a stored state must never be the zero S. No state the
// memory store keeps is, whatever the clock: it stores only a state a request was taken from,
// and a GCRA tat is then max(tat, now)+T >= T >= 1 (by induction from a fresh key's 0), a
// FixedState has Count >= 1, a compact sliding state its width's tag. The empty test compares
// with the zero S rather than calling a method of S: a method of a type parameter is called
// through the generic dictionary, indirectly, on every probe. (For a compact sliding state the
// comparison stops at its first word, its slot, on the occupied slots a probe mostly meets.)
//
// The probe sequence starts at a multiply-shift hash of the key's second half with a random odd
// multiplier per table: keys are digests, but a client who can choose key values could otherwise
// pile them onto one slot run (the shard is picked by a hash keyed with another secret, see
// Store.shardOf).
//
// The zero table is empty but needs a multiplier: create one with newTable. Not safe for
// concurrent use; the shard's mutex guards it.
//
// The header is 40 bytes, so that a shard's mutex and its three tables fit in 128 bytes (one
// pair of cache lines): with a 48-byte header the sliding window's landed in a third line, and
// two goroutines deciding on one hot key measured 10% slower.
type table[S comparable] struct {
	slots []tableSlot[S] // a power-of-two length, at most 3/4 full; nil when never used
	n     int            // occupied slots
	mul   uint64         // odd hash multiplier
}

// tableSlot is one table slot; a zero st marks it empty.
type tableSlot[S comparable] struct {
	key bucket.Key
	st  S
}

// minTableSlots is the smallest table allocated.
const minTableSlots = 16

func newTable[S comparable](mul uint64) table[S] { return table[S]{mul: mul | 1} }

// home is the slot a key's probe sequence starts at: the top log2(len(t.slots)) bits of the
// product. The shift, 64-log2(len), is derived from the length rather than kept (see table).
func (t *table[S]) home(k *bucket.Key) int {
	shift := bits.LeadingZeros64(uint64(len(t.slots))) + 1
	return int((binary.LittleEndian.Uint64(k[8:]) * t.mul) >> shift)
}

// find returns the slot holding k and true, or the empty slot where a probe for k ended and
// false. With no slots it returns -1, false.
func (t *table[S]) find(k *bucket.Key) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	var zero S
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.st == zero {
			return i, false
		}
		if s.key == *k {
			return i, true
		}
	}
}

// insertNew adds k, which the table does not hold, with state st (not the zero S), growing the
// table first if it would become more than 3/4 full. (Half full made 100k rotating keys 30%
// slower: the longer probes cost less than the larger footprint's cache and TLB misses.)
func (t *table[S]) insertNew(k *bucket.Key, st *S) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(2*len(t.slots), minTableSlots))
	}
	i, _ := t.find(k)
	t.slots[i] = tableSlot[S]{key: *k, st: *st}
	t.n++
}

// put stores st (not the zero S) for k, adding k if needed.
func (t *table[S]) put(k *bucket.Key, st *S) {
	if i, ok := t.find(k); ok {
		t.slots[i].st = *st
		return
	}
	t.insertNew(k, st)
}

// get returns k's state and true, or the zero S and false.
func (t *table[S]) get(k *bucket.Key) (S, bool) {
	if i, ok := t.find(k); ok {
		return t.slots[i].st, true
	}
	var zero S
	return zero, false
}

// remove deletes k if the table holds it.
func (t *table[S]) remove(k *bucket.Key) {
	if i, ok := t.find(k); ok {
		t.deleteAt(i)
	}
}

// deleteAt empties slot i by backward shifting: each later slot of the run that may sit in the
// hole (its home is not after the hole, cyclically) moves into it, so no probe for a key that
// the table holds ever meets an empty slot before it. The slots that receive a key are i and
// positions after it in the run.
func (t *table[S]) deleteAt(i int) {
	var zero S
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].st != zero; j = (j + 1) & mask {
		if h := t.home(&t.slots[j].key); (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tableSlot[S]{}
	t.n--
}

// deleteWhile visits the slots in order, deleting those for which del returns true, until stop
// returns true. A slot that receives a key from a deletion is visited (again): deleteAt only
// fills the hole and later positions of its run, so every key present throughout is visited at
// least once.
func (t *table[S]) deleteWhile(del func(*S) bool, stop func() bool) {
	var zero S
	for i := 0; i < len(t.slots) && !stop(); {
		if s := &t.slots[i]; s.st != zero && del(&s.st) {
			t.deleteAt(i)
			continue
		}
		i++
	}
}

// resize moves every state into a new table of size slots (a power of two, size > 4/3*t.n).
func (t *table[S]) resize(size int) {
	var zero S
	old := t.slots
	t.slots = make([]tableSlot[S], size)
	mask := size - 1
	for s := range old {
		if old[s].st == zero {
			continue
		}
		i := t.home(&old[s].key)
		for t.slots[i].st != zero {
			i = (i + 1) & mask
		}
		t.slots[i] = old[s]
	}
}

// shrink rebuilds the table at the smallest size that holds its states at most half full, to
// return memory and leave room to grow.
func (t *table[S]) shrink() {
	size := minTableSlots
	for 2*t.n > size {
		size *= 2
	}
	if size < len(t.slots) {
		t.resize(size)
	}
}
