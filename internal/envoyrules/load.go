// Package envoyrules reads envoyproxy/ratelimit's rule files.
//
// It reads envoyproxy/ratelimit's rule files (the folder rls.config_dir names)
// and compiles them into Rules: descriptor trees that match a request's descriptors, and the
// bucket keys, limits and metric labels of the matched rules. The format is that project's,
// field for field, so that its users copy their files over unchanged; the fields marked
// "extension" below are ratelimit-proxy's own and let a rule use the rest of the engine.
//
// It sits below internal/policy, which loads the rules while it validates a configuration
// (Set.RLS returns them), and never imports it: what a rule shares with a proxy policy (the
// bounds of counts, pool names and how a pool or a namespace marks a bucket key, algorithm
// names, quota time zones) comes from internal/limitspec, and the rest of the configuration
// comes in as Options. The RLS front end (internal/rls) serves the compiled rules.
package envoyrules

// This file reads the files and checks their structure; limits.go checks a rate_limit block,
// and rules.go compiles what was read into Rules.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Options are what the rules take from the rest of the gateway's configuration.
type Options struct {
	// Namespace is store.dynamodb.namespace: it scopes the domains' bucket keys as it scopes
	// the proxy policies' (a rule's pool ignores it, as a policy's does). "" leaves the keys as
	// they always were.
	Namespace string
}

// Problem is one problem found in a rule file: Path names the file and the field
// (`edge.yaml: descriptors[0].rate_limit.unit`), Value is the offending value as written (empty
// when there is none to show), and Msg says what is wrong. internal/policy reports each as one
// of its configuration's FieldErrors.
type Problem struct {
	Path, Value, Msg string
}

// problemList collects Problems in the order they are found.
type problemList []Problem

func (ps *problemList) add(path, value, msg string) {
	*ps = append(*ps, Problem{Path: path, Value: value, Msg: msg})
}

// Unit is a rate_limit's unit, numbered as envoy.service.ratelimit.v3's
// RateLimitResponse.RateLimit.Unit so that the RLS front end can hand it over as is.
type Unit int32

// The units. The zero Unit is UNKNOWN.
const (
	UnitSecond Unit = 1
	UnitMinute Unit = 2
	UnitHour   Unit = 3
	UnitDay    Unit = 4
	UnitMonth  Unit = 5
	UnitYear   Unit = 6
	UnitWeek   Unit = 7
)

var units = map[string]Unit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// Duration is the unit's length as envoyproxy/ratelimit counts it: a month is 30 days and a
// year 365, and windows are aligned to multiples of it since the Unix epoch. 0 for UNKNOWN.
func (u Unit) Duration() time.Duration {
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return 24 * time.Hour
	case UnitWeek:
		return 7 * 24 * time.Hour
	case UnitMonth:
		return 30 * 24 * time.Hour
	case UnitYear:
		return 365 * 24 * time.Hour
	}
	return 0
}

// maxPeriod bounds a rule's window (unit times unit_multiplier) and a token bucket's refill
// time: a year, as envoyproxy/ratelimit's largest unit, plus a leap day.
const maxPeriod = 366 * 24 * time.Hour

// maxFiles bounds the files read from rls.config_dir, and maxFileBytes each file: a
// folder mounted by mistake (a home directory) is refused rather than read in full.
const (
	maxFiles     = 1000
	maxFileBytes = 4 << 20
)

// ruleFile is one configuration file as written.
type ruleFile struct {
	name        string // path as read, for errors
	domain      string
	descriptors []descriptorConfig
}

// descriptorConfig is one entry of a descriptors list.
type descriptorConfig struct {
	key, value     string
	rateLimit      *rateLimitConfig
	descriptors    []descriptorConfig
	shadowMode     bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	at             string // field path, for errors
}

// rateLimitConfig is a descriptor's rate_limit block.
type rateLimitConfig struct {
	unit            string
	requestsPerUnit int64
	rpuSet          bool
	unlimited       bool
	name            string
	replaces        []string
	// Extensions.
	unitMultiplier int64
	algorithm      string
	burst          int64
	timeZone       string
	offset         int
	pool           string
	lease          *leaseConfig
	at             string
}

// Load reads, checks and compiles every *.yaml and *.yml file of dir (not its subfolders, nor
// hidden files: Kubernetes mounts a ConfigMap as such files plus hidden `..data` links). err
// reports a folder that cannot be listed. Otherwise problems are every problem of the files, in
// the order of the files, each naming its file and field; rules is nil unless there is none.
func Load(dir string, opts Options) (rules *Rules, problems []Problem, err error) {
	names, err := Files(dir)
	if err != nil {
		return nil, nil, err
	}
	var es problemList
	var files []*ruleFile
	for _, name := range names {
		data, err := readBounded(name)
		if err != nil {
			es.add(name, "", err.Error())
			continue
		}
		if f := parseFile(&es, name, data); f != nil {
			files = append(files, f)
		}
	}
	rules = compile(&es, files, opts)
	if len(es) != 0 {
		return nil, es, nil
	}
	return rules, nil, nil
}

// Files lists the rule files of dir as Load reads them (sorted, *.yaml and *.yml, hidden files
// skipped, symbolic links followed), so that the reloader can tell when they change.
func Files(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot read the folder: %w", err)
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		p := filepath.Join(dir, name)
		st, err := os.Stat(p) // follows a ConfigMap's symbolic links
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		out = append(out, p)
	}
	if len(out) > maxFiles {
		return nil, fmt.Errorf("holds %d configuration files, more than %d", len(out), maxFiles)
	}
	slices.Sort(out)
	return out, nil
}

func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxFileBytes)
	}
	return data, nil
}

// parseFile decodes one file, reporting every unknown field and every value of the wrong
// type with its path. It returns nil when the file is not YAML at all.
func parseFile(es *problemList, name string, data []byte) *ruleFile {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		es.add(name, "", "invalid YAML: "+err.Error())
		return nil
	}
	f := &ruleFile{name: name}
	if len(doc.Content) == 0 {
		es.add(name+": domain", "", "required: the file is empty")
		return f
	}
	p := parser{es: es, file: name}
	root := doc.Content[0]
	if !p.mapping(root, "") {
		return f
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i].Value, root.Content[i+1]
		switch k {
		case "domain":
			f.domain = p.str(v, "domain")
		case "descriptors":
			f.descriptors = p.descriptors(v, "descriptors")
		default:
			p.unknown(k, "")
		}
	}
	if f.domain == "" {
		p.add("domain", "", "required: the domain Envoy's rate limit filter names")
	}
	return f
}

// parser walks a file's YAML nodes, recording problems under the file's name.
type parser struct {
	es   *problemList
	file string
}

func (p *parser) add(at, value, msg string) { p.es.add(p.file+": "+at, value, msg) }

func join(at, field string) string {
	if at == "" {
		return field
	}
	return at + "." + field
}

func (p *parser) unknown(key, at string) {
	switch key {
	case "quota_mode":
		// envoyproxy/ratelimit's quota mode answers OVER_LIMIT only when all quota
		// descriptors of a request are over; a silent "false" here would over-limit requests.
		p.add(join(at, key), "", "not supported by ratelimit-proxy (quota mode); remove it, or set it to false")
	case "metadata":
		p.add(join(at, key), "", "not supported by ratelimit-proxy: it answers no dynamic metadata; remove it")
	default:
		p.add(join(at, key), "", "unknown field")
	}
}

func (p *parser) mapping(n *yaml.Node, at string) bool {
	if n.Kind != yaml.MappingNode {
		where := at
		if where == "" {
			where = "(file)"
		}
		p.add(where, "", "must be a mapping")
		return false
	}
	return true
}

func (p *parser) str(n *yaml.Node, at string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(at, "", "must be a string")
		return ""
	}
	return n.Value
}

func (p *parser) boolean(n *yaml.Node, at string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.add(at, n.Value, "must be true or false")
		return false
	}
	return b
}

func (p *parser) integer(n *yaml.Node, at string) int64 {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		p.add(at, n.Value, "must be an integer")
		return 0
	}
	return v
}

// quotaMode accepts quota_mode: false (the default, as envoyproxy/ratelimit means it) and
// refuses true.
func (p *parser) quotaMode(n *yaml.Node, at string) {
	if p.boolean(n, at) {
		p.unknown("quota_mode", strings.TrimSuffix(at, ".quota_mode"))
	}
}

func (p *parser) descriptors(n *yaml.Node, at string) []descriptorConfig {
	if n.Kind != yaml.SequenceNode {
		if n.Tag == "!!null" {
			return nil
		}
		p.add(at, "", "must be a list")
		return nil
	}
	out := make([]descriptorConfig, 0, len(n.Content))
	for i, item := range n.Content {
		dat := fmt.Sprintf("%s[%d]", at, i)
		d := descriptorConfig{at: dat}
		if !p.mapping(item, dat) {
			continue
		}
		for j := 0; j+1 < len(item.Content); j += 2 {
			k, v := item.Content[j].Value, item.Content[j+1]
			fat := join(dat, k)
			switch k {
			case "key":
				d.key = p.str(v, fat)
			case "value":
				d.value = p.str(v, fat)
			case "rate_limit":
				d.rateLimit = p.rateLimit(v, fat)
			case "descriptors":
				d.descriptors = p.descriptors(v, fat)
			case "shadow_mode":
				d.shadowMode = p.boolean(v, fat)
			case "detailed_metric":
				d.detailedMetric = p.boolean(v, fat)
			case "value_to_metric":
				d.valueToMetric = p.boolean(v, fat)
			case "share_threshold":
				d.shareThreshold = p.boolean(v, fat)
			case "quota_mode":
				p.quotaMode(v, fat)
			default:
				p.unknown(k, dat)
			}
		}
		out = append(out, d)
	}
	return out
}

func (p *parser) rateLimit(n *yaml.Node, at string) *rateLimitConfig {
	if !p.mapping(n, at) {
		return nil
	}
	rl := &rateLimitConfig{at: at}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j].Value, n.Content[j+1]
		fat := join(at, k)
		switch k {
		case "unit":
			rl.unit = p.str(v, fat)
		case "requests_per_unit":
			rl.requestsPerUnit, rl.rpuSet = p.integer(v, fat), true
		case "unlimited":
			rl.unlimited = p.boolean(v, fat)
		case "name":
			rl.name = p.str(v, fat)
		case "replaces":
			rl.replaces = p.replaces(v, fat)
		case "unit_multiplier":
			rl.unitMultiplier = p.integer(v, fat)
		case "algorithm":
			rl.algorithm = p.str(v, fat)
		case "burst":
			rl.burst = p.integer(v, fat)
		case "time_zone":
			rl.timeZone = p.str(v, fat)
		case "offset":
			rl.offset = int(p.integer(v, fat))
		case "pool":
			rl.pool = p.str(v, fat)
		case "lease":
			rl.lease = p.lease(v, fat)
		default:
			p.unknown(k, at)
		}
	}
	return rl
}

func (p *parser) replaces(n *yaml.Node, at string) []string {
	if n.Kind != yaml.SequenceNode {
		p.add(at, "", "must be a list of {name: ...}")
		return nil
	}
	var out []string
	for i, item := range n.Content {
		iat := fmt.Sprintf("%s[%d]", at, i)
		if !p.mapping(item, iat) {
			continue
		}
		name := ""
		for j := 0; j+1 < len(item.Content); j += 2 {
			k, v := item.Content[j].Value, item.Content[j+1]
			if k != "name" {
				p.unknown(k, iat)
				continue
			}
			name = p.str(v, iat+".name")
		}
		if name == "" {
			p.add(iat+".name", "", "required: the name of the rate_limit it replaces")
			continue
		}
		out = append(out, name)
	}
	return out
}

// leaseConfig is a rate_limit's lease block (an extension), read as a policy's lease block is.
type leaseConfig struct {
	enabled bool
	shards  int
	ttl     time.Duration
}

func (p *parser) lease(n *yaml.Node, at string) *leaseConfig {
	if !p.mapping(n, at) {
		return nil
	}
	l := new(leaseConfig)
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j].Value, n.Content[j+1]
		fat := join(at, k)
		switch k {
		case "enabled":
			l.enabled = p.boolean(v, fat)
		case "shards":
			l.shards = int(p.integer(v, fat))
		case "ttl":
			s := p.str(v, fat)
			d, err := time.ParseDuration(s)
			if err != nil && s != "" {
				p.add(fat, s, "must be a duration such as 150ms")
			}
			l.ttl = d
		default:
			p.unknown(k, at)
		}
	}
	return l
}
