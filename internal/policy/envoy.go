package policy

// This file reads envoyproxy/ratelimit's configuration files (the folder rls.config_dir names)
// and checks them (envoy_limits.go checks a rate_limit block); envoy_rules.go compiles what it
// read into RLSRules. The format is that project's, field for field, so that its users copy
// their files over unchanged; the fields marked "extension" below are ratelimit-proxy's own and
// let a rule use the rest of the engine.

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

// RLSUnit is a rate_limit's unit, numbered as envoy.service.ratelimit.v3's
// RateLimitResponse.RateLimit.Unit so that the RLS front end can hand it over as is.
type RLSUnit int32

// The units. The zero RLSUnit is UNKNOWN.
const (
	UnitSecond RLSUnit = 1
	UnitMinute RLSUnit = 2
	UnitHour   RLSUnit = 3
	UnitDay    RLSUnit = 4
	UnitMonth  RLSUnit = 5
	UnitYear   RLSUnit = 6
	UnitWeek   RLSUnit = 7
)

var rlsUnits = map[string]RLSUnit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// Duration is the unit's length as envoyproxy/ratelimit counts it: a month is 30 days and a
// year 365, and windows are aligned to multiples of it since the Unix epoch. 0 for UNKNOWN.
func (u RLSUnit) Duration() time.Duration {
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

// maxRLSPeriod bounds a rule's window (unit times unit_multiplier) and a token bucket's refill
// time: a year, as envoyproxy/ratelimit's largest unit, plus a leap day.
const maxRLSPeriod = 366 * 24 * time.Hour

// maxRLSFiles bounds the files read from rls.config_dir, and maxRLSFileBytes each file: a
// folder mounted by mistake (a home directory) is refused rather than read in full.
const (
	maxRLSFiles     = 1000
	maxRLSFileBytes = 4 << 20
)

// rlsFile is one configuration file as written.
type rlsFile struct {
	name        string // path as read, for errors
	domain      string
	descriptors []rlsDescriptorConfig
}

// rlsDescriptorConfig is one entry of a descriptors list.
type rlsDescriptorConfig struct {
	key, value     string
	rateLimit      *rlsRateLimitConfig
	descriptors    []rlsDescriptorConfig
	shadowMode     bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	at             string // field path, for errors
}

// rlsRateLimitConfig is a descriptor's rate_limit block.
type rlsRateLimitConfig struct {
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
	lease          *LeaseConfig
	at             string
}

// loadRLSDir reads and checks every *.yaml and *.yml file of dir (not its subfolders, nor
// hidden files: Kubernetes mounts a ConfigMap as such files plus hidden `..data` links) and
// compiles them. Problems are added to es, each naming its file and field.
func loadRLSDir(es *Errors, dir string, cfg *Config) *RLSRules {
	names, err := rlsFileNames(dir)
	if err != nil {
		es.add("rls.config_dir", dir, err.Error())
		return nil
	}
	var files []*rlsFile
	for _, name := range names {
		data, err := readBounded(name)
		if err != nil {
			es.add(name, "", err.Error())
			continue
		}
		if f := parseRLSFile(es, name, data); f != nil {
			files = append(files, f)
		}
	}
	before := len(*es)
	rules := compileRLS(es, files, cfg)
	if len(*es) != before {
		return nil
	}
	return rules
}

// rlsFileNames lists the configuration files of dir, sorted, following symbolic links.
func rlsFileNames(dir string) ([]string, error) {
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
	if len(out) > maxRLSFiles {
		return nil, fmt.Errorf("holds %d configuration files, more than %d", len(out), maxRLSFiles)
	}
	slices.Sort(out)
	return out, nil
}

// RLSFiles lists the configuration files of dir as the loader reads them (sorted, *.yaml and
// *.yml, hidden files skipped), so that the reloader can tell when they change.
func RLSFiles(dir string) ([]string, error) { return rlsFileNames(dir) }

func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRLSFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read: %w", err)
	}
	if len(data) > maxRLSFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxRLSFileBytes)
	}
	return data, nil
}

// parseRLSFile decodes one file, reporting every unknown field and every value of the wrong
// type with its path. It returns nil when the file is not YAML at all.
func parseRLSFile(es *Errors, name string, data []byte) *rlsFile {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		es.add(name, "", "invalid YAML: "+err.Error())
		return nil
	}
	f := &rlsFile{name: name}
	if len(doc.Content) == 0 {
		es.add(name+": domain", "", "required: the file is empty")
		return f
	}
	p := rlsParser{es: es, file: name}
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

// rlsParser walks a file's YAML nodes, recording problems under the file's name.
type rlsParser struct {
	es   *Errors
	file string
}

func (p *rlsParser) add(at, value, msg string) { p.es.add(p.file+": "+at, value, msg) }

func join(at, field string) string {
	if at == "" {
		return field
	}
	return at + "." + field
}

func (p *rlsParser) unknown(key, at string) {
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

func (p *rlsParser) mapping(n *yaml.Node, at string) bool {
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

func (p *rlsParser) str(n *yaml.Node, at string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		p.add(at, "", "must be a string")
		return ""
	}
	return n.Value
}

func (p *rlsParser) boolean(n *yaml.Node, at string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		p.add(at, n.Value, "must be true or false")
		return false
	}
	return b
}

func (p *rlsParser) integer(n *yaml.Node, at string) int64 {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		p.add(at, n.Value, "must be an integer")
		return 0
	}
	return v
}

// quotaMode accepts quota_mode: false (the default, as envoyproxy/ratelimit means it) and
// refuses true.
func (p *rlsParser) quotaMode(n *yaml.Node, at string) {
	if p.boolean(n, at) {
		p.unknown("quota_mode", strings.TrimSuffix(at, ".quota_mode"))
	}
}

func (p *rlsParser) descriptors(n *yaml.Node, at string) []rlsDescriptorConfig {
	if n.Kind != yaml.SequenceNode {
		if n.Tag == "!!null" {
			return nil
		}
		p.add(at, "", "must be a list")
		return nil
	}
	out := make([]rlsDescriptorConfig, 0, len(n.Content))
	for i, item := range n.Content {
		dat := fmt.Sprintf("%s[%d]", at, i)
		d := rlsDescriptorConfig{at: dat}
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

func (p *rlsParser) rateLimit(n *yaml.Node, at string) *rlsRateLimitConfig {
	if !p.mapping(n, at) {
		return nil
	}
	rl := &rlsRateLimitConfig{at: at}
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

func (p *rlsParser) replaces(n *yaml.Node, at string) []string {
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

func (p *rlsParser) lease(n *yaml.Node, at string) *LeaseConfig {
	if !p.mapping(n, at) {
		return nil
	}
	l := new(LeaseConfig)
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j].Value, n.Content[j+1]
		fat := join(at, k)
		switch k {
		case "enabled":
			l.Enabled = p.boolean(v, fat)
		case "shards":
			l.Shards = int(p.integer(v, fat))
		case "ttl":
			s := p.str(v, fat)
			d, err := time.ParseDuration(s)
			if err != nil && s != "" {
				p.add(fat, s, "must be a duration such as 150ms")
			}
			l.TTL = d
		default:
			p.unknown(k, at)
		}
	}
	return l
}
