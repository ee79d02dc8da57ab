// Package console is the operators' console.
//
// It is the operators' console, a third front end on the admin listener beside
// /metrics: a JSON API under /v1/ (policies, a key's state without charging it, resets,
// temporary exemptions, the heaviest keys of each policy), the live page at /, and the hooks the
// front ends call per decision (hook.go): the proxy's Console.Adjust applies exemptions and
// Console.Observe feeds the heavy-hitter sketches and the per-second series; the rate limit
// service's Console.ExemptRLS and Console.ObserveRLS do the same for its rules, which the
// console names by their label (envoyrules.Rule.Label).
//
// It reads and resets keys through the store's Peek and Reset (the Keys interface), keeps no raw
// client key (keys are shown as the access log shows them: as their pseudonyms, IPs included, an
// rls descriptor as the pseudonym of its entries) and adds no per-client metric label; a key
// is looked up by its raw value only with a token (rawLookupAllowed). HostGuard and CrossOrigin
// (host.go) guard the whole admin listener: it answers only requests naming it, against DNS
// rebinding, and refuses browsers' cross-origin writes. Every view is this replica's: the sketches
// and series count what this replica decided (`ratelimit-proxy admin top --replica URL ...`
// merges replicas), while key states, resets and exemptions are the store's (shared on
// DynamoDB).
package console

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// seriesLen is how many seconds of allowed/limited counts the page charts: 15 minutes.
const seriesLen = 900

// ringLen is how many seconds a policy keeps counts of: seriesLen rounded up to a power of two,
// so that a second's slot is its low bits (no division, no bounds check on the request path).
const ringLen = 1024

// generation is how long a sketch counts before it becomes the previous one: "the heaviest keys
// of the last minutes" are those of the current and the previous generation (5 to 10 minutes).
const generation = 5 * time.Minute

// polState is what the console keeps per policy name (an rls rule's: its label).
type polState struct {
	// series[s%ringLen] counts the charges of second s. Atomic, so that counting a charge
	// takes no lock; a slot is emptied for a new second under mu (turn).
	series [ringLen]second
	seed   uint64 // the sampling's random offset (hook.go)

	mu        sync.Mutex // guards the sketches
	cur, prev *topSketch
	genStart  int64 // Unix ns when cur began
}

// second is one second's counts of a policy: allowed in the low 32 bits of n, limited in the
// high ones, so that one atomic add counts a charge and tells its number in the second.
type second struct {
	at atomic.Int64 // the Unix second counted; another value: stale
	n  atomic.Uint64
}

// limitedOne is one limited charge in second.n.
const limitedOne = 1 << 32

// counts returns the allowed and limited counts of n.
func counts(n uint64) (allowed, limited uint32) { return uint32(n), uint32(n >> 32) }

// Console is the operators' console of one replica. It is safe for concurrent use; create it
// with New.
type Console struct {
	o      Options
	states sync.Map // policy name (an rls rule's label) -> *polState
	// The request path finds a policy's state by the policy's index in its set rather than by
	// hashing its name (hook.go).
	policies indexCache[*policy.Policy]
	rules    indexCache[*envoyrules.Rule]
	ex       exemptions
	resets   resetLog
	m        *metrics
}

func (c *Console) state(name string) *polState {
	if v, ok := c.states.Load(name); ok {
		return v.(*polState)
	}
	v, _ := c.states.LoadOrStore(name, &polState{seed: rand.Uint64()})
	return v.(*polState)
}

// globalLabel is the key shown for a global policy's single bucket.
const globalLabel = "(global)"

// top returns policy name's heaviest keys of the current and previous generation, merged.
func (c *Console) top(name string, n int, now time.Time) []TopKey {
	v, ok := c.states.Load(name)
	if !ok {
		return []TopKey{}
	}
	st := v.(*polState)
	st.mu.Lock()
	var lists [][]TopKey
	if st.cur != nil && now.UnixNano()-st.genStart < 2*int64(generation) {
		lists = append(lists, st.cur.list())
		if st.prev != nil && now.UnixNano()-st.genStart < int64(generation) {
			lists = append(lists, st.prev.list())
		}
	}
	st.mu.Unlock()
	out := mergeTop(n, lists...)
	if out == nil {
		out = []TopKey{}
	}
	return out
}

// byPseudonym finds a tracked key of policy name by its label, for lookups by pseudonym: the
// console keeps no raw key, so only a key in the policy's sketch (one of its heaviest lately)
// can be found this way.
func (c *Console) byPseudonym(name, label string) (topEntry, bool) {
	v, ok := c.states.Load(name)
	if !ok {
		return topEntry{}, false
	}
	st := v.(*polState)
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, s := range []*topSketch{st.cur, st.prev} {
		if s == nil {
			continue
		}
		if e, ok := s.findLabel(label); ok {
			return e, true
		}
	}
	return topEntry{}, false
}

// Point is one second of a policy's series.
type Point struct {
	At      int64  `json:"t"` // Unix seconds
	Allowed uint32 `json:"allowed"`
	Limited uint32 `json:"limited"`
}

// series returns policy name's counts per second over the last 15 minutes up to now, oldest
// first, one point per second (zeros included).
func (c *Console) series(name string, now time.Time) []Point {
	out := make([]Point, seriesLen)
	end := now.Unix()
	for i := range out {
		out[i].At = end - seriesLen + 1 + int64(i)
	}
	v, ok := c.states.Load(name)
	if !ok {
		return out
	}
	st := v.(*polState)
	for i := range out {
		s := out[i].At
		if sl := &st.series[s&(ringLen-1)]; sl.at.Load() == s {
			out[i].Allowed, out[i].Limited = counts(sl.n.Load())
		}
	}
	return out
}
