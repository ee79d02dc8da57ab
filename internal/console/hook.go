package console

// The console's hooks on the request path of both front ends: the proxy's Adjust and Observe
// (proxy.Console) and the rate limit service's ExemptRLS and ObserveRLS (rls.Console). They run
// once per decision, so they are written for few instructions: a policy's state is found by
// its index, a charge is counted in its second without a lock, and under load the sketch
// samples (docs/benchmarks.md measures the cost in instructions, scripts/bench/console-instr.sh).

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// The sketch counts every charge of a policy up to exactPerSecond charges in a second; past
// them, in that second, it counts one charge in sampleEvery, sampleEvery times over. The
// per-second series count every charge. So a policy under light load has exact counts, and
// under heavy load the sketch's work per charge (its lock, its lookup, its heap step: most of
// the hook's cost) shrinks eightfold, for a sampling error that is small for the heavy keys the
// sketch is for (docs/operations.md, "Heavy hitters and their error bound").
//
// Which charges are sampled follows a Weyl sequence over the charge's number in its second
// (n), started at a random offset per policy: charge n is taken when the top three bits of
// (n + seed) * 2^64/phi are zero. Over any arithmetic progression of n (a client sending every
// k-th request of the policy) the sequence is equidistributed, so no periodic pattern of
// requests is sampled more or less than one in eight in the long run; and the offset is secret,
// so a client cannot aim its requests at the numbers left out.
const (
	exactPerSecond = 1000
	sampleEvery    = 8 // a power of two, whose log2 (3) sampleShift keeps
	sampleShift    = 64 - 3
	weyl           = 0x9e3779b97f4a7c15 // 2^64 / the golden ratio
)

// instant is a decision's time as the series and sketches use it.
type instant struct {
	ns, sec int64
	slot    uint16 // sec's slot of the series: its low bits
}

func instantOf(now time.Time) instant {
	ns := now.UnixNano()
	sec := ns / int64(time.Second)
	return instant{ns: ns, sec: sec, slot: uint16(sec) & (ringLen - 1)}
}

// count counts one charge in its second (one: 1, or limitedOne for a refused charge) and
// returns the sketch's weight for it: 1 within the second's first exactPerSecond charges, then
// sampleEvery for a sampled charge and 0 for the others (the sketch skips them). Observe has
// it written out in its loop (a call per charge costs as much as the count).
func (st *polState) count(at *instant, one uint64) uint64 {
	sl := &st.series[at.slot&(ringLen-1)]
	if sl.at.Load() != at.sec {
		st.turn(sl, at.sec)
	}
	return weight(sl.n.Add(one), st.seed)
}

// weight is the sketch's weight of the charge that made a second's counts n (count).
func weight(n, seed uint64) uint64 {
	if n = n&(limitedOne-1) + n>>32; n <= exactPerSecond { // the charge's number in its second
		return 1
	}
	return sampleEvery &^ -((n + seed) * weyl >> sampleShift) // 0 unless the top bits are 0
}

// turn empties slot sl for second sec, once: writers that saw the old second wait here, and
// count only after the slot says sec (stored last), so no count of sec is lost to the reset.
func (st *polState) turn(sl *second, sec int64) {
	st.mu.Lock()
	if sl.at.Load() != sec {
		sl.n.Store(0)
		sl.at.Store(sec)
	}
	st.mu.Unlock()
}

// record counts w requests (all limited or none) of charge ch in the policy's sketch. It
// returns the sketch entry when the key has just entered it (the caller then sets its label),
// else nil. The caller holds st.mu. A key the sketch tracks calls nothing.
func (st *polState) record(topK int, at *instant, ch *bucket.Charge, w uint64, limited bool) *topEntry {
	s := st.cur
	if s == nil || at.ns-st.genStart >= int64(generation) {
		s = st.rotate(topK, at.ns)
	}
	var lw uint64
	if limited {
		lw = w
	}
	s.total += w
	if i := s.find(&ch.Key); i >= 0 {
		s.bump(i, w, lw, &ch.Limit)
		return nil
	}
	return s.insert(&ch.Key, w, lw, &ch.Limit)
}

// rotate starts a new generation of the sketch at ns: the current one becomes the previous.
func (st *polState) rotate(topK int, ns int64) *topSketch {
	st.prev, st.cur, st.genStart = st.cur, newTopSketch(topK), ns
	return st.cur
}

// indexCache holds the states of one set's policies (P: *policy.Policy) or rls rules
// (*envoyrules.Rule) by their index in the set (Policy.Index, RLSRule.Index), each with the
// policy it is for: a lookup is one atomic load and a comparison. Copied on write when a policy
// is first seen (after a reload, the new set's policies take the indexes over).
type indexCache[P comparable] struct {
	slots atomic.Pointer[[]indexSlot[P]]
	mu    sync.Mutex
}

type indexSlot[P comparable] struct {
	of P
	st *polState
}

// get returns the state of of, at index i of its set and named name. (Observe has it written
// out, for the proxy's policies.)
func (ic *indexCache[P]) get(c *Console, of P, i int, name string) *polState {
	if s := ic.slots.Load(); s != nil && uint(i) < uint(len(*s)) {
		if e := &(*s)[i]; e.of == of {
			return e.st
		}
	}
	return ic.add(c, of, i, name)
}

// add finds the state of name and caches it for of at index i (past maxCachedPolicies, the
// state is looked up by name each time).
func (ic *indexCache[P]) add(c *Console, of P, i int, name string) *polState {
	st := c.state(name)
	if i < 0 || i >= maxCachedPolicies {
		return st
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	var old []indexSlot[P]
	if s := ic.slots.Load(); s != nil {
		old = *s
	}
	s := make([]indexSlot[P], max(len(old), i+1))
	copy(s, old)
	s[i] = indexSlot[P]{of: of, st: st}
	ic.slots.Store(&s)
	return st
}

// maxCachedPolicies bounds the index caches.
const maxCachedPolicies = 1 << 16

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
	at := instantOf(now)
	slots := c.policies.slots.Load() // indexCache.get, written out: one load per request
	for i := range p.Charges {
		pol := p.Policies[i]
		var st *polState
		if slots != nil && uint(pol.Index) < uint(len(*slots)) && (*slots)[pol.Index].of == pol {
			st = (*slots)[pol.Index].st
		} else {
			st = c.policies.add(c, pol, pol.Index, pol.Name)
		}
		limited := i < len(results) && !results[i].Allowed
		one := uint64(1)
		if limited {
			one = limitedOne
		}
		sl := &st.series[at.slot&(ringLen-1)] // st.count(&at, one), written out
		if sl.at.Load() != at.sec {
			st.turn(sl, at.sec)
		}
		w := weight(sl.n.Add(one), st.seed)
		if w == 0 {
			continue
		}
		st.mu.Lock()
		if e := st.record(c.o.TopK, &at, &p.Charges[i], w, limited); e != nil {
			e.label = c.label(p, i)
		}
		st.mu.Unlock()
	}
}

// label is how charge i's key is shown: "(global)" for a global policy, the pseudonym of any
// other key, an IP's too, as the access log's key fields show it (the console stores, labels
// and shows no raw key).
func (c *Console) label(p *policy.Plan, i int) string {
	if kind := p.Policies[i].KeyKind; kind != "global" {
		return c.o.Pseudonyms.Of(kind, p.KeyValue(i))
	}
	return globalLabel
}

// ExemptRLS reports the active exemption at now of rule r's bucket key: ok with the limit that
// replaces the rule's, or unlimited. Without exemptions it costs one atomic load.
func (c *Console) ExemptRLS(now time.Time, r *envoyrules.Rule, key bucket.Key) (l bucket.Limit, unlimited, ok bool) {
	idx := c.ex.index.Load()
	if idx == nil || len(*idx) == 0 {
		return bucket.Limit{}, false, false
	}
	e := (*idx)[exKey{policy: r.Label, key: key}]
	if e == nil || now.UnixNano() >= e.expires {
		return bucket.Limit{}, false, false
	}
	return e.lim, e.Unlimited, true
}

// ObserveRLS counts one decided descriptor of domain (refused when limited): charge ch of the
// rule that m matched, for entries. The rule's series and sketch are those of its label; the
// key is shown as rlsLabel shows it, computed only when the key enters the sketch.
func (c *Console) ObserveRLS(now time.Time, domain string, m *envoyrules.Match, entries []envoyrules.Entry, ch *bucket.Charge, limited bool) {
	at := instantOf(now)
	st := c.rules.get(c, m.Rule, m.Rule.Index, m.Rule.Label)
	one := uint64(1)
	if limited {
		one = limitedOne
	}
	w := st.count(&at, one)
	if w == 0 {
		return
	}
	st.mu.Lock()
	if e := st.record(c.o.TopK, &at, ch, w, limited); e != nil {
		e.label = rlsLabel(c.o.Pseudonyms, domain, m.KeyEntries(entries))
	}
	st.mu.Unlock()
}

// rlsLabel is how the console shows an rls descriptor's key: the pseudonym, of kind
// "rls:DOMAIN", of its entries as the bucket key hashed them ("k=v" each, NUL-terminated). Never
// a value in clear, not even for rules whose metrics carry values (detailed_metric,
// value_to_metric): a descriptor value may be an API key or a token, and the console cannot
// tell which (docs/operations.md).
func rlsLabel(ps *policy.Pseudonyms, domain string, entries []envoyrules.Entry) string {
	n := 0
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	var b strings.Builder
	b.Grow(n)
	for _, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
		b.WriteByte(0)
	}
	return ps.Of("rls:"+domain, b.String())
}
