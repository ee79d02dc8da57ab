// Package admin is the operators' console, a third front end on the admin listener beside
// /metrics: a JSON API under /v1/ (policies, a key's state without charging it, resets,
// temporary exemptions, the heaviest keys of each policy), the live page at /, and the hooks the
// proxy calls per request (Console.Adjust applies exemptions, Console.Observe feeds the
// heavy-hitter sketches and the per-second series).
//
// It reads and resets keys through the store's Peek and Reset (the Keys interface), keeps no raw
// client key (keys are shown as the access log shows them: an IP in clear, other keys as their
// pseudonyms) and adds no per-client metric label. Every view is this replica's: the sketches
// and series count what this replica decided (`ratelimit-proxy admin top --replica URL ...`
// merges replicas), while key states, resets and exemptions are the store's (shared on
// DynamoDB).
package admin

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// seriesLen is how many seconds of allowed/limited counts the page charts: 15 minutes.
const seriesLen = 900

// generation is how long a sketch counts before it becomes the previous one: "the heaviest keys
// of the last minutes" are those of the current and the previous generation (5 to 10 minutes).
const generation = 5 * time.Minute

// polState is what the console keeps per policy name.
type polState struct {
	mu        sync.Mutex
	cur, prev *topSketch
	genStart  int64 // Unix ns when cur began
	// series[s%seriesLen] counts the requests of second s (stamp[...] == s; older: stale).
	stamp   [seriesLen]int64
	allowed [seriesLen]uint32
	limited [seriesLen]uint32
}

// Console is the operators' console of one replica. It is safe for concurrent use; create it
// with New.
type Console struct {
	o      Options
	states sync.Map // policy name -> *polState
	// byPol caches states by compiled policy, so that the request path looks a policy up by
	// pointer rather than hashing its name: copied on write when a policy is first seen (after
	// a reload, the new set's policies), read with one atomic load.
	byPol   atomic.Pointer[map[*policy.Policy]*polState]
	byPolMu sync.Mutex
	ex      exemptions
	resets  resetLog
	m       *metrics
}

// stateOf returns pol's state: by pointer, else by name (and remembered by pointer).
func (c *Console) stateOf(pol *policy.Policy) *polState {
	if m := c.byPol.Load(); m != nil {
		if st := (*m)[pol]; st != nil {
			return st
		}
	}
	st := c.state(pol.Name)
	c.byPolMu.Lock()
	old := c.byPol.Load()
	n := 0
	if old != nil {
		n = len(*old)
	}
	m := make(map[*policy.Policy]*polState, n+1)
	if old != nil && n < maxCachedPolicies { // past it, start afresh: policies of old sets go
		for k, v := range *old {
			m[k] = v
		}
	}
	m[pol] = st
	c.byPol.Store(&m)
	c.byPolMu.Unlock()
	return st
}

// maxCachedPolicies bounds byPol, which grows by the policies of each reloaded set.
const maxCachedPolicies = 1024

func (c *Console) state(name string) *polState {
	if v, ok := c.states.Load(name); ok {
		return v.(*polState)
	}
	v, _ := c.states.LoadOrStore(name, &polState{})
	return v.(*polState)
}

// Adjust applies the active exemptions to a planned request, before its charges are taken: an
// exempt key's charge carries the exemption's limit instead, or is dropped for an unlimited one.
// Without exemptions it costs one atomic load.
func (c *Console) Adjust(p *policy.Plan) {
	idx := c.ex.index.Load()
	if idx == nil || len(*idx) == 0 {
		return
	}
	ns := c.o.Now().UnixNano()
	for i := 0; i < len(p.Charges); {
		e := (*idx)[exKey{policy: p.Policies[i].Name, key: p.Charges[i].Key}]
		if e == nil || ns >= e.expires {
			i++
			continue
		}
		if !e.Unlimited {
			p.Charges[i].Limit = e.lim
			i++
			continue
		}
		p.Charges = append(p.Charges[:i], p.Charges[i+1:]...)
		p.Policies = append(p.Policies[:i], p.Policies[i+1:]...)
		if i < len(p.Values) {
			p.Values = append(p.Values[:i], p.Values[i+1:]...)
		}
	}
}

// Observe counts a decided request: per charge, one request (refused when its result did not
// conform) in its policy's per-second series and heavy-hitter sketch. results[i] is charge i's.
func (c *Console) Observe(now time.Time, p *policy.Plan, results []bucket.Result) {
	ns := now.UnixNano()
	sec := ns / int64(time.Second)
	slot := int(sec % seriesLen)
	for i := range p.Charges {
		pol := p.Policies[i]
		ch := &p.Charges[i]
		limited := i < len(results) && !results[i].Allowed
		st := c.stateOf(pol)
		st.mu.Lock()
		if st.cur == nil || ns-st.genStart >= int64(generation) {
			st.prev, st.cur, st.genStart = st.cur, newTopSketch(c.o.TopK), ns
		}
		if st.stamp[slot] != sec {
			st.stamp[slot], st.allowed[slot], st.limited[slot] = sec, 0, 0
		}
		if limited {
			st.limited[slot]++
		} else {
			st.allowed[slot]++
		}
		if e, fresh := st.cur.add(ch.Key, limited, &ch.Limit); fresh {
			e.label = c.label(p, i)
		}
		st.mu.Unlock()
	}
}

// label is how charge i's key is shown: the ip key in clear, "(global)" for a global policy,
// the pseudonym of any other key (as the access log's key fields).
func (c *Console) label(p *policy.Plan, i int) string {
	switch kind := p.Policies[i].KeyKind; kind {
	case "ip":
		return p.KeyValue(i)
	case "global":
		return globalLabel
	default:
		return c.o.Pseudonyms.Of(kind, p.KeyValue(i))
	}
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
		if e, ok := s.find(label); ok {
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
	st.mu.Lock()
	for i := range out {
		s := out[i].At
		slot := int(s % seriesLen)
		if st.stamp[slot] == s {
			out[i].Allowed, out[i].Limited = st.allowed[slot], st.limited[slot]
		}
	}
	st.mu.Unlock()
	return out
}
