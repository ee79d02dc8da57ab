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
// names, quota time zones) comes from internal/limitterms, and the rest of the configuration
// comes in as Options. The RLS front end (internal/rls) serves the compiled rules.
package envoyrules

// This file reads the files and checks their structure; limits.go checks a rate_limit block,
// and rules.go compiles what was read into Rules.

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/configyaml"
)

// Options are what the rules take from the rest of the gateway's configuration.
type Options struct {
	// Namespace is store.dynamodb.namespace: it scopes the domains' bucket keys as it scopes
	// the proxy policies' (a rule's pool ignores it, as a policy's does). "" leaves the keys as
	// they always were.
	Namespace string
}

// Problem is one problem found in a rule file: File names the file and Path the field
// (`descriptors[0].rate_limit.unit`, empty for the whole file), Value is the offending value as written (empty
// when there is none to show), and Msg says what is wrong. internal/policy reports each as one
// of its configuration's FieldErrors.
type Problem struct {
	File, Path, Value, Msg string
	// Line and Col place it in File (1-based); 0 when it has no place.
	Line, Col int
}

// problemList collects Problems in the order they are found.
type problemList []Problem

func (ps *problemList) add(file, value, msg string) {
	*ps = append(*ps, Problem{File: file, Value: value, Msg: msg})
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
	doc         *configyaml.Doc
	domain      string
	descriptors []descriptorConfig
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

// The files as written, decoded strictly by internal/configyaml as the gateway's own
// configuration is. The unexported fields are filled in after decoding (prepare).

// descriptorConfig is one entry of a descriptors list.
type descriptorConfig struct {
	Key            string             `yaml:"key"`
	Value          string             `yaml:"value"`
	RateLimit      *rateLimitConfig   `yaml:"rate_limit"`
	Descriptors    []descriptorConfig `yaml:"descriptors"`
	ShadowMode     bool               `yaml:"shadow_mode"`
	DetailedMetric bool               `yaml:"detailed_metric"`
	ValueToMetric  bool               `yaml:"value_to_metric"`
	ShareThreshold bool               `yaml:"share_threshold"`
	// QuotaMode false is envoyproxy/ratelimit's default and accepted; true is refused.
	QuotaMode bool `yaml:"quota_mode"`

	at string // field path, for errors
}

// rateLimitConfig is a descriptor's rate_limit block.
type rateLimitConfig struct {
	Unit            string          `yaml:"unit"`
	RequestsPerUnit *int64          `yaml:"requests_per_unit"`
	Unlimited       bool            `yaml:"unlimited"`
	Name            string          `yaml:"name"`
	Replaces        []replaceConfig `yaml:"replaces"`
	// Extensions.
	UnitMultiplier int64        `yaml:"unit_multiplier"`
	Algorithm      string       `yaml:"algorithm"`
	Burst          int64        `yaml:"burst"`
	TimeZone       string       `yaml:"time_zone"`
	Offset         int          `yaml:"offset"`
	Pool           string       `yaml:"pool"`
	Lease          *leaseConfig `yaml:"lease"`

	replaces []string // the names of Replaces
	at       string
}

type replaceConfig struct {
	Name string `yaml:"name"`
}

// requestsPerUnit is requests_per_unit, 0 when unset.
func (rl *rateLimitConfig) requestsPerUnit() int64 {
	if rl.RequestsPerUnit == nil {
		return 0
	}
	return *rl.RequestsPerUnit
}

// leaseConfig is a rate_limit's lease block (an extension), written as a policy's lease block is.
type leaseConfig struct {
	Enabled bool          `yaml:"enabled"`
	Shards  int           `yaml:"shards"`
	TTL     time.Duration `yaml:"ttl"`
}

// unsupported are the fields envoyproxy/ratelimit knows that ratelimit-proxy refuses, and why.
var unsupported = map[string]string{
	// envoyproxy/ratelimit's quota mode answers OVER_LIMIT only when all quota descriptors of
	// a request are over; a silent "false" here would over-limit requests.
	"quota_mode": "not supported by ratelimit-proxy (quota mode); remove it, or set it to false",
	"metadata":   "not supported by ratelimit-proxy: it answers no dynamic metadata; remove it",
}

// parseFile decodes one file, reporting every unknown field and every value of the wrong
// type with its path and line. It returns nil when the file is not YAML at all.
func parseFile(es *problemList, name string, data []byte) *ruleFile {
	var in struct {
		Domain      string             `yaml:"domain"`
		Descriptors []descriptorConfig `yaml:"descriptors"`
	}
	doc, problems, err := configyaml.Decode(data, &in, configyaml.Options{})
	if err != nil {
		es.add(name, "", "invalid YAML: "+err.Error())
		return nil
	}
	p := parser{es: es, file: name, doc: doc}
	for _, pr := range problems {
		msg := pr.Msg
		field := pr.Path[strings.LastIndexByte(pr.Path, '.')+1:]
		if why, ok := unsupported[field]; ok && strings.HasPrefix(msg, "unknown field") {
			msg = why
		}
		*es = append(*es, Problem{File: name, Path: pr.Path, Value: pr.Value, Msg: msg, Line: pr.Line, Col: pr.Col})
	}
	p.prepare(in.Descriptors, "descriptors")
	f := &ruleFile{name: name, doc: doc, domain: in.Domain, descriptors: in.Descriptors}
	if f.domain == "" {
		msg := "required: the domain Envoy's rate limit filter names"
		if len(bytes.TrimSpace(data)) == 0 {
			msg = "required: the file is empty"
		}
		p.add("domain", "", msg)
	}
	return f
}

// parser turns a file's decoded descriptors into descriptorConfigs, and records problems
// under the file's name, at their line.
type parser struct {
	es   *problemList
	file string
	doc  *configyaml.Doc
}

func (p *parser) add(at, value, msg string) {
	pos := p.doc.Pos(at)
	*p.es = append(*p.es, Problem{File: p.file, Path: at, Value: value, Msg: msg, Line: pos.Line, Col: pos.Col})
}

// prepare gives the descriptors under at their paths and the names they replace, and refuses
// quota_mode: true.
func (p *parser) prepare(ds []descriptorConfig, at string) {
	for i := range ds {
		d := &ds[i]
		d.at = fmt.Sprintf("%s[%d]", at, i)
		if d.QuotaMode {
			p.add(d.at+".quota_mode", "", unsupported["quota_mode"])
		}
		if rl := d.RateLimit; rl != nil {
			rl.at = d.at + ".rate_limit"
			for j, r := range rl.Replaces {
				if r.Name == "" {
					p.add(fmt.Sprintf("%s.replaces[%d].name", rl.at, j), "", "required: the name of the rate_limit it replaces")
					continue
				}
				rl.replaces = append(rl.replaces, r.Name)
			}
		}
		p.prepare(d.Descriptors, d.at+".descriptors")
	}
}
