package memstore

import (
	"math"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// compactSliding is the memory store's form of a SlidingState: the same ring with 16-bit
// counters and the slot width as a 16-bit tag, 32 bytes against 64, so that with its 16-byte Key
// (and the eviction room, padded to 8 bytes) it takes a 56-byte slot of a table rather than an
// 88-byte map entry.
//
// It holds a state exactly when every counter fits 16 bits and the width has a tag (widthTag);
// the memory store keeps the others, and the keys of Limits with Count > maxCompactCount, as
// SlidingStates. Both forms decide alike: the memory store's takeSliding moves and decides a
// compact ring with the functions SlidingState.take uses (rotate, decide), on narrower counters
// (TestMemorySlidingMatchesSliding holds the store to Sliding's states and verdicts).
type compactSliding struct {
	slot   int64  // SlidingState.Slot
	gen    uint32 // the entry's meta (see gcraEntry), in what the struct's 8-byte alignment left
	counts [bucket.SlidingRing]uint16
	tag    uint16 // widthTag of SlidingState.Width; 0 for a fresh key
	room   uint16 // Count-cost of the key's last charge, for eviction (see evict.go)
	pool   uint16
}

// meta is the entry's meta, its generation and pool (see newMeta).
func (s *compactSliding) meta() uint64 { return newMeta(uint64(s.gen), s.pool) }

// setMeta stores meta in the entry.
func (s *compactSliding) setMeta(meta uint64) { s.gen, s.pool = uint32(metaGen(meta)), metaPool(meta) }

// maxCompactCount is the largest Count whose keys the memory store keeps compact: a counter is
// incremented only while the sum of all of them is below Count, so none can exceed Count.
const maxCompactCount = math.MaxUint16

// pow10 holds 10^e for the exponent of a width tag.
var pow10 = [16]int64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// widthTag encodes a slot width w >= 1 exactly as m*10^e in 16 bits (e in the top 4, m < 4096 in
// the low 12), or reports that it cannot. Widths of Windows people write (100ms, 1m, 1h30m,
// 333ms) all have a tag; a width such as 123457ns has none and stays in a SlidingState. The tag
// of a width is never 0, the tag of a fresh key.
func widthTag(w int64) (uint16, bool) {
	e := 0
	for e < len(pow10)-1 && w%10 == 0 {
		w /= 10
		e++
	}
	if w <= 0 || w >= 1<<12 {
		return 0, false
	}
	return uint16(e<<12 | int(w)), true
}

// width decodes the state's width tag: a table load and a multiplication, cheap enough to check
// on every decision (encoding takes a loop of divisions). A fresh state's width is 0.
func (s *compactSliding) width() int64 {
	return int64(s.tag&(1<<12-1)) * pow10[s.tag>>12]
}

// compactOf returns s in compact form, or false if a counter or the width does not fit.
func compactOf(s *bucket.SlidingState) (compactSliding, bool) {
	tag, ok := widthTag(s.Width)
	if !ok {
		return compactSliding{}, false
	}
	c := compactSliding{slot: s.Slot, tag: tag}
	for i, n := range s.Counts {
		if n > math.MaxUint16 {
			return compactSliding{}, false
		}
		c.counts[i] = uint16(n)
	}
	return c, true
}

// wide returns s as a SlidingState.
func (s *compactSliding) wide() bucket.SlidingState {
	w := bucket.SlidingState{Width: s.width(), Slot: s.slot}
	for i, n := range s.counts {
		w.Counts[i] = uint32(n)
	}
	return w
}
