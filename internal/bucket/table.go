package bucket

import (
	"encoding/binary"
	"math/bits"
)

// slidingTable maps keys to compact sliding-window states: an open-addressing hash table with
// linear probing, each 48-byte slot holding the key and its state side by side.
//
// A Go map was the first home of the compact states, and a profile of 100k rotating keys showed
// it spending most of a decision on two cache misses per lookup (the group's control word, then
// the slot, 8+8*48 bytes apart) and a second probe to store the new state. Here a lookup
// usually reads one slot, and the state is updated where it lies.
//
// The probe sequence starts at a multiply-shift hash of the key's second half with a random odd
// multiplier per table: keys are digests, but a client who can choose key values could otherwise
// pile them onto one slot run (the shard is picked from the first half, so its low bits are
// alike within a shard anyway).
//
// The zero slidingTable is empty but needs a multiplier: create one with newSlidingTable. Not
// safe for concurrent use; the shard's mutex guards it.
type slidingTable struct {
	slots []slidingSlot // a power-of-two length, at most 3/4 full; nil when never used
	n     int           // occupied slots
	mul   uint64        // odd hash multiplier
	shift uint          // 64 - log2(len(slots))
}

// slidingSlot is one table slot. A state with tag 0 marks it empty: a stored state always has
// its width's tag (a fresh state has none, and is never stored).
type slidingSlot struct {
	key Key
	st  compactSliding
}

// minTableSlots is the smallest table allocated.
const minTableSlots = 16

func newSlidingTable(mul uint64) slidingTable { return slidingTable{mul: mul | 1} }

// home is the slot a key's probe sequence starts at.
func (t *slidingTable) home(k *Key) int {
	return int((binary.LittleEndian.Uint64(k[8:]) * t.mul) >> t.shift)
}

// find returns the slot holding k and true, or the empty slot where a probe for k ended and
// false. With no slots it returns -1, false.
func (t *slidingTable) find(k *Key) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.st.tag == 0 {
			return i, false
		}
		if s.key == *k {
			return i, true
		}
	}
}

// insertNew adds k, which the table does not hold, with state st (st.tag != 0), growing the
// table first if it would become more than 3/4 full. (Half full made 100k rotating keys 30%
// slower: the longer probes cost less than the larger footprint's cache and TLB misses.)
func (t *slidingTable) insertNew(k *Key, st *compactSliding) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.resize(max(2*len(t.slots), minTableSlots))
	}
	i, _ := t.find(k)
	t.slots[i] = slidingSlot{key: *k, st: *st}
	t.n++
}

// put stores st (st.tag != 0) for k, adding k if needed.
func (t *slidingTable) put(k *Key, st *compactSliding) {
	if i, ok := t.find(k); ok {
		t.slots[i].st = *st
		return
	}
	t.insertNew(k, st)
}

// remove deletes k if the table holds it.
func (t *slidingTable) remove(k *Key) {
	if i, ok := t.find(k); ok {
		t.deleteAt(i)
	}
}

// deleteAt empties slot i by backward shifting: each later slot of the run that may sit in the
// hole (its home is not after the hole, cyclically) moves into it, so no probe for a key that
// the table holds ever meets an empty slot before it. The slots that receive a key are i and
// positions after it in the run.
func (t *slidingTable) deleteAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].st.tag != 0; j = (j + 1) & mask {
		if h := t.home(&t.slots[j].key); (j-h)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slidingSlot{}
	t.n--
}

// deleteWhile visits the slots in order, deleting those for which del returns true, until stop
// returns true. A slot that receives a key from a deletion is visited (again): deleteAt only
// fills the hole and later positions of its run, so every key present throughout is visited at
// least once.
func (t *slidingTable) deleteWhile(del func(*compactSliding) bool, stop func() bool) {
	for i := 0; i < len(t.slots) && !stop(); {
		if s := &t.slots[i]; s.st.tag != 0 && del(&s.st) {
			t.deleteAt(i)
			continue
		}
		i++
	}
}

// resize moves every state into a new table of size slots (a power of two, size > 4/3*t.n).
func (t *slidingTable) resize(size int) {
	old := t.slots
	t.slots = make([]slidingSlot, size)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	mask := size - 1
	for s := range old {
		if old[s].st.tag == 0 {
			continue
		}
		i := t.home(&old[s].key)
		for t.slots[i].st.tag != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = old[s]
	}
}

// shrink rebuilds the table at the smallest size that holds its states at most half full, to
// return memory and leave room to grow.
func (t *slidingTable) shrink() {
	size := minTableSlots
	for 2*t.n > size {
		size *= 2
	}
	if size < len(t.slots) {
		t.resize(size)
	}
}
