package bucket

// GCRAGiveBack gives back one token-bucket charge (see GCRAGiveBackN).
func GCRAGiveBack(tat, left int64, l Limit) (int64, bool) { return GCRAGiveBackN(tat, left, l, 1) }

// GCRAGiveBackN gives back a token-bucket charge of cost n to a bucket whose state is now tat. left is the state the charge's own write left (the tat it set: the memory
// store hands it out as Result.Token), 0 when unknown. It returns the new state and whether the
// charge was given back: exactly when tat still equals left, i.e. nothing wrote to the bucket
// since the charge (or everything that wrote since was given back the same way), and then
// tat-n*T is the state the bucket would have had without the charge.
//
// Otherwise nothing is given back. A token bucket forgets idle time (every write sets
// tat = max(tat, t)+c*T), so a later write that found the bucket without the charge idle, or
// nearly so, has already absorbed part of it: what is still owed shrinks with every such write
// (d = min(d, max(0, tat_before-t)) from d = n*T), and the state does not record the writes'
// instants. A partial give-back computed from left and now looked safe for one give-back but is
// not once give-backs of earlier charges interleave (the give-back adversary of buckettest found
// histories where it admitted one request too many), so this gives back all or nothing.
// docs/algorithms.md ("Give-backs") has the proof. Leaky-bucket charges are never given back:
// their request was held for its turn.
//
// It needs no instant: an exact give-back is exact whenever it comes (once the bucket is idle
// it changes nothing that matters).
func GCRAGiveBackN(tat, left int64, l Limit, n int64) (int64, bool) {
	if l.Algorithm != TokenBucket || left <= 0 || tat != left {
		return tat, false
	}
	t, _ := GCRAParams(l)
	return tat - spend(t, n), true
}

// FixedGiveBack undoes one fixed-window charge taken at instant at, if its window is still the
// state's window and counted it; a closed window's count no longer matters.
func FixedGiveBack(s FixedState, at int64, l Limit) (FixedState, bool) {
	return FixedGiveBackN(s, at, l, 1)
}

// FixedGiveBackN is FixedGiveBack for a charge of cost n.
func FixedGiveBackN(s FixedState, at int64, l Limit, n int64) (FixedState, bool) {
	w := WindowSpan(l.Window)
	if end := FloorDiv(at, w)*w + w; end != s.End || s.Count < n {
		return s, false
	}
	s.Count -= n
	return s, true
}

// QuotaGiveBackN undoes a quota charge of cost n taken at instant at, if the period it was
// counted in is still the state's period and counted it; a past period's count no longer
// matters.
func QuotaGiveBackN(s FixedState, at int64, l Limit, n int64) (FixedState, bool) {
	if _, end := QuotaPeriod(at, l); end != s.End || s.Count < n {
		return s, false
	}
	s.Count -= n
	return s, true
}

// giveBack undoes a sliding-window charge of cost n taken at instant at, if the slot it was
// counted in is still in the ring (of the same width) and counted it.
func (s *SlidingState) giveBack(at int64, l *Limit, n int64) bool {
	w := SlotWidth(l.Window)
	slot := FloorDiv(at, w)
	if s.Width != w || slot > s.Slot || slot <= s.Slot-SlidingRing {
		return false
	}
	i := SlidingIndex(slot)
	if int64(s.Counts[i]) < n {
		return false
	}
	s.Counts[i] -= uint32(n)
	return true
}

// SlidingGiveBack undoes one sliding-window charge taken at instant at (see Releaser).
func SlidingGiveBack(s SlidingState, at int64, l Limit) (SlidingState, bool) {
	return SlidingGiveBackN(s, at, l, 1)
}

// SlidingGiveBackN is SlidingGiveBack for a charge of cost n.
func SlidingGiveBackN(s SlidingState, at int64, l Limit, n int64) (SlidingState, bool) {
	ok := s.giveBack(at, &l, n)
	return s, ok
}
