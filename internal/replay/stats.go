package replay

import (
	"cmp"
	"slices"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// policyStats are the counts of one policy.
type policyStats struct {
	pol *policy.Policy
	// matched = admitted + limited + shadowLimited + limitedElsewhere.
	matched, admitted, limited, shadowLimited int64
	// limitedElsewhere: the policy matched a request that another policy limited; as in the
	// gateway, nothing was charged to it.
	limitedElsewhere int64
	peak             peak
	distinct         map[bucket.Key]struct{} // limited keys, up to the shared key budget
	distinctCapped   bool                    // the budget ran out: distinct is a lower bound
	top              topKeys
}

func (ps *policyStats) init(pol *policy.Policy, topCap int) {
	ps.pol = pol
	ps.distinct = make(map[bucket.Key]struct{})
	ps.top = topKeys{capacity: topCap, idx: make(map[bucket.Key]int)}
	ps.peak.sec = -1
}

// peak tracks the most requests in one second of the simulated clock (seconds aligned to the
// epoch).
type peak struct {
	sec, n  int64
	max, at int64 // at: the second of max, unix seconds
}

func (p *peak) add(now int64) {
	sec := now / int64(time.Second)
	if sec != p.sec {
		p.sec, p.n = sec, 0
	}
	p.n++
	if p.n > p.max {
		p.max, p.at = p.n, sec
	}
}

// topCapacity is the size of the top-keys summary for a top-n report: ten times n, at least
// 1,000. Space-Saving guarantees that a key limited more than total/capacity times is in it.
func topCapacity(n int) int { return max(1000, 10*n) }

// topKeys finds the keys limited most with the Space-Saving algorithm (Metwally, Agrawal, El
// Abbadi 2005) in fixed memory: a min-heap of capacity counters; a key not counted yet takes
// over the smallest counter, inheriting its count as its possible overestimate.
type topKeys struct {
	capacity int
	idx      map[bucket.Key]int // heap position
	heap     []topEntry
}

type topEntry struct {
	key   bucket.Key
	count int64
	over  int64 // count may exceed the truth by at most this much
	label string
}

// add counts one limited request of k; label names a key that enters the summary.
func (t *topKeys) add(k bucket.Key, label func() string) {
	if i, ok := t.idx[k]; ok {
		t.heap[i].count++
		t.down(i)
		return
	}
	if len(t.heap) < t.capacity {
		t.heap = append(t.heap, topEntry{key: k, count: 1, label: label()})
		i := len(t.heap) - 1
		t.idx[k] = i
		t.up(i)
		return
	}
	least := t.heap[0]
	delete(t.idx, least.key)
	t.heap[0] = topEntry{key: k, count: least.count + 1, over: least.count, label: label()}
	t.idx[k] = 0
	t.down(0)
}

func (t *topKeys) less(i, j int) bool { return t.heap[i].count < t.heap[j].count }

func (t *topKeys) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.idx[t.heap[i].key] = i
	t.idx[t.heap[j].key] = j
}

func (t *topKeys) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !t.less(i, parent) {
			return
		}
		t.swap(i, parent)
		i = parent
	}
}

func (t *topKeys) down(i int) {
	n := len(t.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		least := l
		if r := l + 1; r < n && t.less(r, l) {
			least = r
		}
		if !t.less(least, i) {
			return
		}
		t.swap(i, least)
		i = least
	}
}

// most returns the n entries with the highest counts, highest first (ties by label).
func (t *topKeys) most(n int) []topEntry {
	out := slices.Clone(t.heap)
	slices.SortFunc(out, func(a, b topEntry) int {
		if c := cmp.Compare(b.count, a.count); c != 0 {
			return c
		}
		return cmp.Compare(a.label, b.label)
	})
	return out[:min(n, len(out))]
}

// maxBuckets bounds the time series: past it, neighbouring buckets merge and the width doubles.
const maxBuckets = 2048

// series counts admitted and limited requests per policy in buckets of equal width, starting at
// one second.
type series struct {
	start    int64 // unix ns of bucket 0
	width    int64 // ns
	n        int   // buckets in use
	admitted [][maxBuckets]int64
	limited  [][maxBuckets]int64
}

func newSeries(policies int) series {
	return series{
		width:    int64(time.Second),
		admitted: make([][maxBuckets]int64, policies),
		limited:  make([][maxBuckets]int64, policies),
	}
}

func (s *series) add(t int64, pol int, limited bool) {
	i := (t - s.start) / s.width
	for i >= maxBuckets {
		s.merge()
		i = (t - s.start) / s.width
	}
	if int(i) >= s.n {
		s.n = int(i) + 1
	}
	if limited {
		s.limited[pol][i]++
	} else {
		s.admitted[pol][i]++
	}
}

func (s *series) merge() {
	for _, arr := range [][][maxBuckets]int64{s.admitted, s.limited} {
		for p := range arr {
			a := &arr[p]
			for j := range maxBuckets / 2 {
				a[j] = a[2*j] + a[2*j+1]
			}
			clear(a[maxBuckets/2:])
		}
	}
	s.width *= 2
	s.n = (s.n + 1) / 2
}
