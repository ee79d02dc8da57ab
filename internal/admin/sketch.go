package admin

import (
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
// bucket key, the key's display label and its limit. Not safe for concurrent use: the
// policy's mutex guards it.
type topSketch struct {
	k       int
	entries []topEntry // a min-heap by count
	index   map[bucket.Key]int
	total   uint64 // requests seen: N of the error bound
}

// topEntry is one tracked key.
type topEntry struct {
	key      bucket.Key
	label    string       // as the access log shows the key: an IP in clear, else its pseudonym
	limit    bucket.Limit // the limit its last request was charged under
	requests uint64       // requests counted (overstated by at most err)
	limited  uint64       // of which refused, since the key entered the sketch
	err      uint64       // the count it inherited when it took over an entry
}

func newTopSketch(k int) *topSketch {
	return &topSketch{k: k, entries: make([]topEntry, 0, k), index: make(map[bucket.Key]int, k)}
}

// add counts one request of key (refused when limited) and returns its entry, fresh when the
// key has just entered the sketch: the caller then sets its label, so that a pseudonym is
// computed once per entry, not per request. The entry is valid until the next add.
func (s *topSketch) add(key bucket.Key, limited bool, lim *bucket.Limit) (e *topEntry, fresh bool) {
	s.total++
	lim1 := uint64(0)
	if limited {
		lim1 = 1
	}
	if i, ok := s.index[key]; ok {
		e = &s.entries[i]
		e.requests++
		e.limited += lim1
		e.limit = *lim
		return &s.entries[s.down(i)], false
	}
	if len(s.entries) < s.k {
		s.entries = append(s.entries, topEntry{key: key, limit: *lim, requests: 1, limited: lim1})
		s.index[key] = len(s.entries) - 1
		return &s.entries[s.up(len(s.entries)-1)], true
	}
	// Take over the minimum (the heap's root): count min+1, error min.
	e = &s.entries[0]
	delete(s.index, e.key)
	min := e.requests
	*e = topEntry{key: key, limit: *lim, requests: min + 1, limited: lim1, err: min}
	s.index[key] = 0
	return &s.entries[s.down(0)], true
}

func (s *topSketch) less(i, j int) bool { return s.entries[i].requests < s.entries[j].requests }

func (s *topSketch) swap(i, j int) {
	s.entries[i], s.entries[j] = s.entries[j], s.entries[i]
	s.index[s.entries[i].key] = i
	s.index[s.entries[j].key] = j
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

// find returns the entry labelled label, for lookups by pseudonym.
func (s *topSketch) find(label string) (topEntry, bool) {
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
