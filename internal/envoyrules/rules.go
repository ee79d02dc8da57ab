package envoyrules

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// Rules is the compiled content of rls.config_dir: envoyproxy/ratelimit's domains and their
// descriptor trees. It is immutable and safe for concurrent use; a reload compiles a new one
// with the rest of the policy.Set. The nil *Rules knows no domain.
type Rules struct {
	domains map[string]*Domain
	names   []string // sorted domain names
	files   []string // the files read, sorted
	rules   int
}

// Domain returns the domain's rules, or nil when no file names it.
func (r *Rules) Domain(name string) *Domain {
	if r == nil {
		return nil
	}
	return r.domains[name]
}

// Domains lists the configured domains, sorted.
func (r *Rules) Domains() []string {
	if r == nil {
		return nil
	}
	return r.names
}

// Files lists the configuration files the rules were compiled from, sorted.
func (r *Rules) Files() []string {
	if r == nil {
		return nil
	}
	return r.files
}

// Len is the number of rate_limit blocks (unlimited ones included).
func (r *Rules) Len() int {
	if r == nil {
		return 0
	}
	return r.rules
}

// Entry is one entry of a request's descriptor: Envoy's (key, value) pair.
type Entry struct {
	Key, Value string
}

// Domain is one domain's descriptor tree.
type Domain struct {
	Name  string
	root  node
	store string // what the domain's bucket keys hash first (see storeName)
}

// node is one descriptor of the tree.
type node struct {
	children map[Entry]*node // by (key, value); value "" is the key-only descriptor
	wild     []wildcard      // descriptors whose value holds a '*', in file order
	rule     *Rule           // nil: no rate_limit block here
	hasValue bool            // the descriptor names a value (exact or wildcard)
	pattern  string          // the wildcard value; "" when the value holds no '*'
	share    bool            // share_threshold: all values matching pattern share a bucket
	toMetric bool            // value_to_metric
	seg      string          // key, or key_value: the descriptor's part of a metric path
}

type wildcard struct {
	key   string
	parts []string // the value split on '*'
	node  *node
}

// How a descriptor entry was matched, as envoyproxy/ratelimit tells them apart for metrics.
const (
	matchExact uint8 = iota + 1
	matchWildcard
	matchKey
)

// Rule is one compiled rate_limit block.
type Rule struct {
	// Name is rate_limit.name; "" when unnamed. Replaces lists the names it drops.
	Name     string
	Replaces []string
	// Unlimited rules are answered OK without the store.
	Unlimited bool
	// Shadow (shadow_mode) rules count but never make a request OVER_LIMIT.
	Shadow bool
	// Limit is the engine's limit; Lease its lease mode (off unless the file asks).
	Limit bucket.Limit
	Lease bucket.Lease
	// RequestsPerUnit, Unit and UnitMultiplier are the rule as written, for the answer's
	// current_limit.
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32
	// Label is the metric label of the rule: the domain, then its name or else its descriptor
	// path (`domain.key_value.key`, wildcards as written). Rules with detailed_metric or
	// value_to_metric label per request instead: see Match.Label. The operators' console
	// names the rule by it.
	Label string
	// Index is the rule's position among all the rules of its Rules, from 0 to Len()-1:
	// what the operators' console finds the rule's state by on the call path.
	Index int

	detailed  bool   // detailed_metric on the rule's descriptor
	toMetric  bool   // some descriptor of the rule's path has value_to_metric
	keyPrefix []byte // hashed before the descriptor's entries
}

// Match is the outcome of matching one descriptor. Reuse one across calls: Domain.Match
// refills it without allocating once its slices have grown.
type Match struct {
	// Rule is the matched rule, nil when none applies.
	Rule  *Rule
	nodes []*node
	how   []uint8
}

// Match finds the rule of entries as envoyproxy/ratelimit does: level by level, the most
// specific descriptor wins (the exact value, then the first wildcard value that matches, then
// the key alone), and a rule applies only to a descriptor with exactly as many entries as its
// depth in the tree. It returns m.Rule.
func (d *Domain) Match(entries []Entry, m *Match) *Rule {
	m.Rule, m.nodes, m.how = nil, m.nodes[:0], m.how[:0]
	n := &d.root
	for i := range entries {
		e := entries[i]
		next, how := n.children[e], matchExact
		if next == nil {
			for j := range n.wild {
				if w := &n.wild[j]; w.key == e.Key && globMatch(w.parts, e.Value) {
					next, how = w.node, matchWildcard
					break
				}
			}
		}
		if next == nil {
			next, how = n.children[Entry{Key: e.Key}], matchKey
		}
		if next == nil {
			return nil
		}
		if !next.hasValue {
			how = matchKey
		}
		m.nodes, m.how = append(m.nodes, next), append(m.how, how)
		if i == len(entries)-1 {
			m.Rule = next.rule
			return m.Rule
		}
		if len(next.children) == 0 {
			return nil // the request is deeper than the tree: no rule, as envoyproxy/ratelimit
		}
		n = next
	}
	return nil
}

// globMatch reports whether value matches the pattern split on '*' (each '*' matches any run
// of bytes, the empty one included).
func globMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// Key is the bucket key of a matched descriptor: a digest of the domain (or the rule's pool),
// the rule's algorithm and window, and the entries' keys and values, so that every distinct
// descriptor has its own bucket, as in envoyproxy/ratelimit. An entry matched by a wildcard
// with share_threshold counts under the wildcard instead of its value. No raw value reaches
// the store.
func (m *Match) Key(entries []Entry) bucket.Key {
	return hashEntries(m.Rule.keyPrefix, entries, func(i int) (string, bool) {
		if m.how[i] == matchWildcard && m.nodes[i].share {
			return m.nodes[i].pattern, true
		}
		return "", false
	})
}

// KeyEntries returns the entries as Key hashes them: an entry matched by a wildcard with
// share_threshold carries the wildcard instead of its value, so that every value of one bucket
// gives the same entries. It returns entries itself when no entry is replaced.
func (m *Match) KeyEntries(entries []Entry) []Entry {
	var out []Entry
	for i := range entries {
		if m.how[i] == matchWildcard && m.nodes[i].share {
			if out == nil {
				out = slices.Clone(entries)
			}
			out[i].Value = m.nodes[i].pattern
		}
	}
	if out == nil {
		return entries
	}
	return out
}

// Label is the metric label of the matched rule: Rule.Label, except for rules whose
// descriptors ask for values in metrics. detailed_metric labels with every entry's value
// (key_value; share_threshold entries with their wildcard); value_to_metric puts the value of
// its own level in place of a wildcard or of a key-only match. Those allocate per call and
// make one series per distinct value: see docs/envoy.md on cardinality.
func (m *Match) Label(domain string, entries []Entry) string {
	r := m.Rule
	if !r.detailed && !r.toMetric {
		return r.Label
	}
	var b strings.Builder
	b.WriteString(domain)
	for i, e := range entries {
		n, how := m.nodes[i], m.how[i]
		b.WriteByte('.')
		b.WriteString(e.Key)
		var v string
		switch {
		case how == matchWildcard && n.share:
			v = n.pattern
		case r.detailed:
			v = e.Value
		case how == matchWildcard && n.toMetric:
			v = e.Value
		case how == matchWildcard:
			v = n.pattern
		case how == matchExact:
			v = e.Value
		case n.toMetric:
			v = e.Value
		}
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// OverrideLimit is the limit of a descriptor that carries its own (Envoy's rate limit
// override): requests per unit times multiplier, counted in a fixed window as
// envoyproxy/ratelimit counts it. ok is false for an unknown unit or one out of range.
func OverrideLimit(requestsPerUnit uint32, unit Unit, multiplier uint32) (l bucket.Limit, ok bool) {
	mult := max(int64(multiplier), 1)
	u := unit.Duration()
	if u == 0 || int64(requestsPerUnit) > limitterms.MaxCount || mult > int64(maxPeriod/u) {
		return bucket.Limit{}, false
	}
	return bucket.Limit{Algorithm: bucket.FixedWindow, Count: int64(requestsPerUnit), Window: time.Duration(mult) * u}, true
}

// OverrideKey is the bucket key of a descriptor with a limit override l: the key a fixed-window
// rule of the same window (and no pool) would give the same entries, so that both count alike.
func (d *Domain) OverrideKey(entries []Entry, l bucket.Limit) bucket.Key {
	var buf [128]byte
	return hashEntries(keyPrefix(buf[:0], d.store, l), entries, nil)
}

// hashEntries digests prefix and the entries, each key and value length-prefixed so that no
// two descriptors share a digest by moving bytes between their strings. sub, when not nil, may
// replace entry i's value.
func hashEntries(prefix []byte, entries []Entry, sub func(int) (string, bool)) bucket.Key {
	var buf [512]byte
	b := append(buf[:0], prefix...)
	for i, e := range entries {
		v := e.Value
		if sub != nil {
			if s, ok := sub(i); ok {
				v = s
			}
		}
		b = binary.AppendUvarint(b, uint64(len(e.Key)))
		b = append(b, e.Key...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	sum := sha256.Sum256(b)
	var k bucket.Key
	copy(k[:], sum[:])
	return k
}

// storeName is what a rule's bucket keys start with: its pool, or its domain within the
// store's namespace (limitterms.StoreName, as a proxy policy's). The \x03 marks domains apart
// from proxy policies (a policy name never starts with a control byte); a pool is shared on
// purpose, as a proxy policy's.
func storeName(namespace, domain, pool string) string {
	return limitterms.StoreName(namespace, "\x03rls\x00"+domain, pool)
}

// keyPrefix appends to b the part of a key before the entries: store name, algorithm with
// its window (or calendar), and "rls", which no proxy key kind is.
func keyPrefix(b []byte, store string, l bucket.Limit) []byte {
	b = append(b, store...)
	b = append(b, 0)
	b = append(b, limitterms.AlgorithmName(l.Algorithm)...)
	switch l.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow:
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(l.Window), 10)
	case bucket.Quota:
		zone := "UTC"
		if l.Zone != nil {
			zone = l.Zone.String()
		}
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(l.Period), 10)
		b = append(b, "/"+zone+"/"...)
		b = strconv.AppendInt(b, int64(l.Offset), 10)
	}
	return append(b, "\x00rls\x00"...)
}

// compile builds the rules of the parsed files; problems go to es.
func compile(es *problemList, files []*ruleFile, opts Options) *Rules {
	r := &Rules{domains: make(map[string]*Domain)}
	owner := make(map[string]string)
	for _, f := range files {
		r.files = append(r.files, f.name)
		if f.domain == "" {
			continue
		}
		p := parser{es: es, file: f.name, doc: f.doc}
		if first, dup := owner[f.domain]; dup {
			p.add("domain", f.domain, "also the domain of "+first+": each domain is in one file")
			continue
		}
		owner[f.domain] = f.name
		d := &Domain{Name: f.domain, store: storeName(opts.Namespace, f.domain, "")}
		r.rules += p.load(&d.root, f.descriptors, opts, d, f.domain, false)
		r.domains[f.domain] = d
		r.names = append(r.names, f.domain)
	}
	slices.Sort(r.names)
	i := 0
	for _, dn := range r.names {
		for _, rule := range r.domains[dn].Rules() {
			rule.Index = i
			i++
		}
	}
	return r
}

// load compiles descriptors under parent and returns how many rules it made. path is the
// parent's metric path; toMetric says whether some ancestor has value_to_metric.
func (p *parser) load(parent *node, ds []descriptorConfig, opts Options, d *Domain, path string, toMetric bool) int {
	rules := 0
	for i := range ds {
		dc := &ds[i]
		if dc.Key == "" {
			p.add(dc.at+".key", "", "required")
			continue
		}
		e := Entry{Key: dc.Key, Value: dc.Value}
		if parent.children[e] != nil {
			what := "key " + strconv.Quote(dc.Key)
			if dc.Value != "" {
				what += " with value " + strconv.Quote(dc.Value)
			}
			p.add(dc.at, "", "duplicate descriptor: "+what+" is already at this level")
			continue
		}
		n := &node{hasValue: dc.Value != "", share: dc.ShareThreshold, toMetric: dc.ValueToMetric, seg: dc.Key}
		if dc.Value != "" {
			n.seg += "_" + dc.Value
		}
		if strings.Contains(dc.Value, "*") {
			n.pattern = dc.Value
			parent.wild = append(parent.wild, wildcard{key: dc.Key, parts: strings.Split(dc.Value, "*"), node: n})
		} else if dc.ShareThreshold {
			p.add(dc.at+".share_threshold", "true", "applies to a wildcard value (one holding '*') only")
		}
		nodePath := path + "." + n.seg
		under := toMetric || dc.ValueToMetric
		if rl := dc.RateLimit; rl != nil {
			if rule := p.rule(rl, dc, opts, d, nodePath, under); rule != nil {
				n.rule = rule
				rules++
			}
		}
		if parent.children == nil {
			parent.children = make(map[Entry]*node)
		}
		parent.children[e] = n
		rules += p.load(n, dc.Descriptors, opts, d, nodePath, under)
	}
	return rules
}

// rule compiles one rate_limit block; nil when it has problems (reported).
func (p *parser) rule(rl *rateLimitConfig, dc *descriptorConfig, opts Options, d *Domain, path string, toMetric bool) *Rule {
	before := len(*p.es)
	for i, name := range rl.replaces {
		if name == rl.Name {
			p.add(rl.at+".replaces["+strconv.Itoa(i)+"].name", name, "a rate_limit cannot replace itself")
		}
	}
	if rl.Name != "" && strings.TrimSpace(rl.Name) == "" {
		p.add(rl.at+".name", rl.Name, "must not be blank")
	}
	lim, unit, ok := p.checkRateLimit(rl)
	if !ok || len(*p.es) != before {
		return nil
	}
	label := path
	if rl.Name != "" {
		label = d.Name + "." + rl.Name
	}
	r := &Rule{
		Name:      rl.Name,
		Replaces:  rl.replaces,
		Unlimited: rl.Unlimited,
		Shadow:    dc.ShadowMode,
		Limit:     lim,
		Unit:      unit,
		Label:     label,
		detailed:  dc.DetailedMetric,
		toMetric:  toMetric,
	}
	if rl.Unlimited {
		return r
	}
	r.RequestsPerUnit = uint32(rl.requestsPerUnit())
	r.UnitMultiplier = uint32(max(rl.UnitMultiplier, 1))
	if l := rl.Lease; l != nil && l.Enabled {
		r.Lease = bucket.Lease{Shards: max(l.Shards, 1), TTL: l.TTL}
	}
	r.keyPrefix = keyPrefix(nil, storeName(opts.Namespace, d.Name, rl.Pool), lim)
	return r
}
