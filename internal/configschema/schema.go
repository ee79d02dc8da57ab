// Package configschema generates the configuration's JSON Schema.
//
// It generates the JSON Schema of the configuration file from the typed
// structs of internal/policy (their `yaml` tags and doc comments), so that editors
// complete and flag fields (configs/example.yaml carries the yaml-language-server modeline).
//
// The structs are the source of truth: `make schema` (go generate ./internal/configschema/)
// writes configs/ratelimit-proxy.schema.json, and a test fails when the checked-in file is
// stale. What reflection cannot see (enumerations, patterns, bounds, which fields an algorithm
// needs) is added here, from the same rules as policy.Validate; rules that span fields or need
// parsing (duplicate names, CIDRs, URLs, environment variables) stay with
// `ratelimit-proxy validate`.
//
// The schema is as strict as the loader about types, with two differences it errs strict on:
// keys are matched as written (the loader folds their case), and an empty value (`key:` with
// nothing after it), which the loader reads as unset, is flagged.
package configschema

//go:generate go run ./schemagen -o ../../configs/ratelimit-proxy.schema.json

import (
	"bytes"
	"encoding/json"
	"fmt"
	gopath "path"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"github.com/invopop/jsonschema"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// File is where the schema is checked in, from the repository root.
const File = "configs/ratelimit-proxy.schema.json"

// RegenerateCommand is the one command that rewrites File after a config struct changed.
const RegenerateCommand = "make schema   (or: go generate ./internal/configschema/)"

// node is a schema object as decoded JSON.
type node = map[string]any

// Generate returns the schema, indented, with a trailing newline. policyDir is the directory of
// internal/policy's source, read for the doc comments that become descriptions.
func Generate(policyDir string) ([]byte, error) {
	comments := &jsonschema.Reflector{}
	if err := comments.AddGoComments("", policyDir); err != nil {
		return nil, fmt.Errorf("configschema: read comments: %w", err)
	}
	// AddGoComments keys comments by the directory as given (joined to its empty base).
	prefix := gopath.Join("", filepath.ToSlash(filepath.Dir(filepath.Join(policyDir, "config.go"))))
	r := &jsonschema.Reflector{
		FieldNameTag:               "yaml",
		RequiredFromJSONSchemaTags: true, // required fields are listed below, not inferred
		ExpandedStruct:             true,
		Anonymous:                  true,
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			if t == reflect.TypeFor[time.Duration]() {
				return &jsonschema.Schema{Type: "string", Pattern: durationPattern}
			}
			return nil
		},
		LookupComment: func(t reflect.Type, field string) string {
			key := prefix + "." + t.Name()
			if field != "" {
				key += "." + field
			}
			return description(t, field, comments.CommentMap[key])
		},
	}
	s := r.Reflect(&policy.Config{})
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("configschema: %w", err)
	}
	var root node
	if err := json.Unmarshal(b, &root); err != nil {
		return nil, fmt.Errorf("configschema: %w", err)
	}
	g := &gen{root: root}
	g.refine()
	if err := g.defaults(); err != nil {
		return nil, err
	}
	if len(g.errs) > 0 {
		return nil, fmt.Errorf("configschema: %s", strings.Join(g.errs, "; "))
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // patterns hold & and <, which editors should show as written
	enc.SetIndent("", "  ")
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("configschema: %w", err)
	}
	return out.Bytes(), nil
}

// description turns a Go doc comment into a schema description: one paragraph, and the field's
// Go name at its start replaced by its name in the file.
func description(t reflect.Type, field, text string) string {
	text = strings.Join(strings.Fields(text), " ")
	if field == "" || text == "" {
		return text
	}
	if f, ok := t.FieldByName(field); ok {
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" {
			if rest, ok := strings.CutPrefix(text, field+" "); ok {
				text = tag + " " + rest
			}
		}
	}
	return text
}

// durationPattern is a non-negative Go duration as time.ParseDuration reads it ("0", "1m30s",
// "1.5h", "500ms"); every duration field rejects negative ones.
const durationPattern = `^\+?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`

// zeroDurationPattern is a duration of zero, for the fields that must be positive (a schema
// "not": RE2 and the editors' JavaScript engines share no lookahead).
const zeroDurationPattern = `^\+?(0|((0+(\.0*)?|\.0+)(ns|us|µs|μs|ms|s|m|h))+)$`

// Patterns of the values policy.Validate checks one field at a time.
const (
	namePattern  = `^[A-Za-z0-9_.-]{1,64}$`
	tokenPattern = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$" // an HTTP header name (RFC 9110 token)
	ratePattern  = `^([0-9]+(\.[0-9]*)?|\.[0-9]+)/[smh]$`
	zeroRate     = `^(0+(\.0*)?|\.0+)/[smh]$`
	// Host and Transfer-Encoding never reach a request's headers (net/http moves them out).
	unseenHeaderPattern = `^([Hh][Oo][Ss][Tt]|[Tt][Rr][Aa][Nn][Ss][Ff][Ee][Rr]-[Ee][Nn][Cc][Oo][Dd][Ii][Nn][Gg])$`
	sha256Pattern       = `^sha256:[0-9a-f]{64}$`
	tablePattern        = `^[A-Za-z0-9_.-]{3,255}$`
	regionPattern       = `^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	maxCount            = limitterms.MaxCount // the bound validation applies
)

var (
	methods = []any{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"}
)

type gen struct {
	root node
	errs []string
}

// at returns the schema of a field, following $ref and list items: "store.dynamodb.table",
// "policies[].overrides[].key". A path the structs do not have is recorded as an error, so a
// renamed field cannot silently lose its constraints.
func (g *gen) at(path string) node {
	cur := g.root
	for _, seg := range strings.Split(path, ".") {
		name, list := strings.CutSuffix(seg, "[]")
		props, _ := g.resolve(cur)["properties"].(node)
		next, ok := props[name].(node)
		if !ok {
			g.errs = append(g.errs, "no field "+path)
			return node{}
		}
		cur = next
		if list {
			items, ok := g.resolve(cur)["items"].(node)
			if !ok {
				g.errs = append(g.errs, path+" is not a list")
				return node{}
			}
			cur = items
		}
	}
	return g.resolve(cur)
}

// resolve follows a local $ref ("#/$defs/Name").
func (g *gen) resolve(n node) node {
	ref, ok := n["$ref"].(string)
	if !ok {
		return n
	}
	defs, _ := g.root["$defs"].(node)
	if d, ok := defs[strings.TrimPrefix(ref, "#/$defs/")].(node); ok {
		return d
	}
	g.errs = append(g.errs, "dangling "+ref)
	return n
}

func (g *gen) set(path string, kv ...any) {
	n := g.at(path)
	for i := 0; i+1 < len(kv); i += 2 {
		n[kv[i].(string)] = kv[i+1]
	}
}

func (g *gen) require(path string, fields ...string) {
	n := g.root
	if path != "" {
		n = g.at(path)
	}
	n["required"] = fields
}

// refine adds what reflection cannot see: the rules of policy.Validate that concern one field,
// and which fields each algorithm needs.
func (g *gen) refine() {
	g.root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	g.root["title"] = "ratelimit-proxy configuration"
	g.root["description"] = "The YAML file of `ratelimit-proxy serve` and `validate`. Generated from internal/policy/config.go " +
		"by `make schema`; docs/configuration.md is the reference. Rules across fields (duplicate names, CIDRs, URLs, " +
		"environment variables) are checked by `ratelimit-proxy validate`."
	// Every other field may come from a RATELIMIT_* variable instead of the file.
	g.require("", "policies")

	g.set("upstream", "pattern", `^[hH][tT][tT][pP][sS]?://`)
	unseen := node{"pattern": unseenHeaderPattern}
	g.set("identity.api_key_header", "pattern", tokenPattern, "not", unseen)
	g.set("identity.user_header", "pattern", tokenPattern, "not", unseen)
	for _, p := range []string{"upstream_timeout", "store.timeout", "server.read_header_timeout", "server.read_timeout",
		"server.idle_timeout", "server.drain_timeout", "policies[].window", "policies[].overrides[].window"} {
		g.set(p, "not", node{"pattern": zeroDurationPattern})
	}
	g.set("identity.ipv6_prefix", "minimum", 1, "maximum", 128)
	g.set("identity.jwt.hs256_secret_env", "pattern", `^[A-Za-z_][A-Za-z0-9_]*$`)
	g.set("headers.reset", "enum", []any{"unix", "delta"})
	g.set("store.backend", "enum", []any{"memory", "dynamodb", "redis"})
	g.set("store.on_error", "enum", []any{"allow", "deny", "local"})
	g.set("store.max_keys", "minimum", 1)
	g.set("store.replicas", "minimum", 1, "maximum", 10000)
	g.set("store.dynamodb.table", "pattern", tablePattern)
	g.set("store.dynamodb.region", "pattern", regionPattern)
	g.set("store.dynamodb.mode", "enum", []any{"refund", "transaction"})
	g.set("store.redis.mode", "enum", []any{"single", "sentinel", "cluster"})
	g.set("store.redis.url", "pattern", `^(rediss?|valkeys?)://`)
	g.set("store.redis.password_env", "pattern", `^[A-Za-z_][A-Za-z0-9_]*$`)
	g.set("store.redis.key_prefix", "pattern", `^[^{} \t\r\n]{1,64}$`)
	g.set("store.redis.wait_replicas", "minimum", 0, "maximum", 16)
	g.set("server.max_header_bytes", "minimum", 1)
	g.set("upstream_protocol", "enum", []any{"http1", "h2c", "auto"})
	g.set("server.max_concurrent_streams", "minimum", 1, "maximum", 10000)
	g.set("log.level", "enum", []any{"debug", "info", "warn", "error"})
	g.set("policies", "minItems", 1)

	g.require("policies[]", "name", "key", "algorithm")
	g.set("policies[].name", "pattern", namePattern)
	g.set("policies[].key", "anyOf", []any{
		node{"enum": []any{"ip", "api_key", "user", "global"}},
		node{"pattern": "^header:" + strings.TrimPrefix(tokenPattern, "^"),
			"not": node{"pattern": "^header:" + strings.TrimPrefix(unseenHeaderPattern, "^")}},
	})
	var algorithms []any
	for _, a := range policy.AlgorithmNames() {
		algorithms = append(algorithms, a)
	}
	g.set("policies[].algorithm", "enum", algorithms)
	// A status code (100 to 599, written as a number or a string) or a class such as 5xx.
	g.set("policies[].charge_on", "minItems", 1)
	g.set("policies[].charge_on[]", "pattern", `^([1-5][0-9][0-9]|[1-5]xx)$`, "minimum", 100, "maximum", 599)
	g.set("policies[].mode", "enum", []any{"enforce", "shadow"})
	g.set("policies[].cost", "minimum", 1, "maximum", maxCount)
	g.require("policies[].costs[]", "cost")
	g.set("policies[].costs[].cost", "minimum", 1, "maximum", maxCount)
	g.set("policies[].costs[].methods[]", "enum", methods)
	g.set("policies[].costs[].path_prefix", "pattern", "^/")
	g.set("policies[].costs[]", "anyOf", []any{node{"required": []any{"methods"}}, node{"required": []any{"path_prefix"}}})
	g.set("policies[].period", "enum", []any{"day", "week", "month"})
	g.set("policies[].offset", "minimum", 0, "maximum", 27)
	g.set("policies[].match.methods[]", "enum", methods)
	// protect (validate_protect.go): the single-field rules.
	g.set("protect.concurrency.limit", "minimum", 1, "maximum", 100000)
	g.set("protect.concurrency.min_limit", "minimum", 1, "maximum", 100000)
	g.set("protect.concurrency.max_limit", "minimum", 1, "maximum", 100000)
	g.set("protect.status", "enum", []any{503, 429})
	g.require("protect.priorities[]", "name")
	g.set("protect.priorities[].name", "enum", []any{"critical", "default", "sheddable"})
	g.set("protect.priorities[].reserve", "minimum", 0, "exclusiveMaximum", 1)
	g.set("protect.priorities[].match.methods[]", "enum", methods)
	g.set("protect.priorities[].match.path_prefix", "pattern", "^/")
	g.set("policies[].match.path_prefix", "pattern", "^/")
	g.require("policies[].overrides[]", "key")
	g.set("policies[].overrides[].key", "anyOf", []any{
		node{"pattern": sha256Pattern},
		// ip policies also take an address or CIDR; validate checks which.
		node{"pattern": `^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$`},
	})
	for _, at := range []string{"policies[]", "policies[].overrides[]"} {
		g.set(at+".rate", "pattern", ratePattern, "not", node{"pattern": zeroRate})
		g.set(at+".burst", "maximum", maxCount)
		g.set(at+".limit", "maximum", maxCount)
	}
	// An override is either unlimited or sets a limit, not both.
	g.set("policies[].overrides[]", "oneOf", []any{
		node{"required": []any{"unlimited"}, "properties": node{"unlimited": node{"const": true}},
			"not": node{"anyOf": []any{node{"required": []any{"rate"}}, node{"required": []any{"burst"}}, node{"required": []any{"limit"}}, node{"required": []any{"window"}}}}},
		node{"anyOf": []any{node{"required": []any{"rate"}}, node{"required": []any{"burst"}}, node{"required": []any{"limit"}}, node{"required": []any{"window"}}},
			"not": node{"required": []any{"unlimited"}, "properties": node{"unlimited": node{"const": true}}}},
	})

	// Each algorithm family needs its own fields and refuses the other's (a zero is unset).
	zero := node{"const": 0}
	bucketFields := node{
		"required": []any{"rate", "burst"},
		"properties": node{
			"burst": node{"minimum": 1}, "limit": zero, "window": false,
			"overrides": node{"items": node{"properties": node{"burst": node{"minimum": 1}, "limit": zero, "window": false}}},
		},
	}
	windowFields := node{
		"required": []any{"limit", "window"},
		"properties": node{
			"limit": node{"minimum": 1}, "rate": node{"const": ""}, "burst": zero,
			"overrides": node{"items": node{"properties": node{"limit": node{"minimum": 1}, "rate": node{"const": ""}, "burst": zero}}},
		},
	}
	concurrencyFields := node{
		"required": []any{"limit"},
		"properties": node{
			"limit": node{"minimum": 1}, "rate": node{"const": ""}, "burst": zero, "window": false, "charge_on": false,
			"overrides": node{"items": node{"properties": node{"limit": node{"minimum": 1}, "rate": node{"const": ""}, "burst": zero, "window": false}}},
		},
	}
	// A quota counts limit per calendar period; period, time_zone and offset are its alone.
	quotaFields := node{
		"required": []any{"limit", "period"},
		"properties": node{
			"limit": node{"minimum": 1}, "rate": node{"const": ""}, "burst": zero, "window": false,
			"overrides": node{"items": node{"properties": node{"limit": node{"minimum": 1}, "rate": node{"const": ""}, "burst": zero, "window": false}}},
		},
	}
	notCalendar := node{"properties": node{"period": false, "time_zone": false, "offset": zero}}
	isAlg := func(names ...any) node {
		return node{"required": []any{"algorithm"}, "properties": node{"algorithm": node{"enum": names}}}
	}
	g.set("policies[]", "allOf", []any{
		node{"if": isAlg("token_bucket", "leaky_bucket"), "then": bucketFields},
		node{"if": isAlg("fixed_window", "sliding_window"), "then": windowFields},
		node{"if": isAlg("concurrency"), "then": concurrencyFields},
		node{"if": isAlg("quota"), "then": quotaFields},
		node{"if": isAlg("token_bucket", "leaky_bucket", "fixed_window", "sliding_window", "concurrency"), "then": notCalendar},
		node{"if": isAlg("concurrency"), "then": node{"properties": node{"cost": false, "costs": false}}},
		// A leaky bucket holds requests instead of charging them on their answer.
		node{"if": isAlg("leaky_bucket"), "then": node{"properties": node{"charge_on": false}}},
	})
	for p, d := range undocumented {
		if n := g.at(p); n["description"] == nil {
			n["description"] = d
		}
	}
	g.loosenStrings()
}

// undocumented describes the fields whose Go doc comment is missing or shared with another
// field; a doc comment in internal/policy/config.go takes precedence.
var undocumented = map[string]string{
	"identity.jwt.audience":            "audience, when set, must be one of the token's aud values. (Optional)",
	"policies[].match":                 "match restricts the policy to some requests; empty matches everything.",
	"policies[].match.methods":         "methods the policy applies to, in upper case; GET also matches HEAD. (Optional) default: every method.",
	"policies[].match.path_prefix":     "path_prefix the request path (and its cleaned form) must start with; starts with /. (Optional) default: every path.",
	"policies[].overrides":             "overrides set other limits for some keys, or exempt them (unlimited: true); first match wins for sha256: keys, the most specific prefix for CIDRs.",
	"policies[].overrides[].rate":      "rate replaces the policy's rate for these keys (buckets).",
	"policies[].overrides[].burst":     "burst replaces the policy's burst for these keys (buckets).",
	"policies[].overrides[].limit":     "limit replaces the policy's limit for these keys (windows, concurrency).",
	"policies[].overrides[].window":    "window replaces the policy's window for these keys (windows).",
	"policies[].overrides[].unlimited": "unlimited: true neither counts nor limits these keys; exclusive with the limit fields.",
}

// loosenStrings lets every string field take an unquoted number or boolean, as the loader does
// (it keeps their text: `name: 2024`), except those whose values cannot be numbers: enumerations,
// durations and rates. Done last and everywhere, so that fields added later get it too.
func (g *gen) loosenStrings() {
	var walk func(n node)
	walk = func(n node) {
		if n["type"] == "string" && n["enum"] == nil && n["pattern"] != durationPattern && n["pattern"] != ratePattern {
			n["type"] = []any{"string", "number", "boolean"}
		}
		for _, v := range n {
			switch v := v.(type) {
			case node:
				walk(v)
			case []any:
				for _, e := range v {
					if e, ok := e.(node); ok {
						walk(e)
					}
				}
			}
		}
	}
	walk(g.root)
}

// defaults records the defaults the loader fills in, read from what policy.Parse makes of small
// files, so that they cannot drift from load.go.
func (g *gen) defaults() error {
	files := []struct {
		yaml    string
		at      func(*policy.Config) any
		path    string
		written []string // fields the file sets: not defaults
	}{
		{"upstream: http://h\npolicies: [{name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}]",
			func(c *policy.Config) any { return *c }, "", []string{"upstream", "policies"}},
		{"upstream: http://h\npolicies: [{name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}]",
			func(c *policy.Config) any { return c.Policies[0] }, "policies[]", []string{"name", "key", "algorithm", "rate", "burst"}},
		{"upstream: http://h\nidentity: {jwt: {hs256_secret_env: S}}\npolicies: [{name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}]",
			func(c *policy.Config) any { return *c.Identity.JWT }, "identity.jwt", []string{"hs256_secret_env"}},
		{"upstream: http://h\nstore: {backend: dynamodb, dynamodb: {table: t}}\npolicies: [{name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}]",
			func(c *policy.Config) any { return *c.Store.DynamoDB }, "store.dynamodb", []string{"table"}},
		{"upstream: http://h\nprotect: {}\npolicies: [{name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}]",
			func(c *policy.Config) any { return *c.Protect }, "protect", nil},
	}
	noEnv := func(string) string { return "" }
	for _, f := range files {
		cfg, err := policy.Parse([]byte(f.yaml), policy.LoadOptions{Getenv: noEnv})
		if err != nil {
			return fmt.Errorf("configschema: defaults: %w", err)
		}
		g.walkDefaults(reflect.ValueOf(f.at(cfg)), f.path, f.written)
	}
	return nil
}

func (g *gen) walkDefaults(v reflect.Value, path string, skip []string) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || tag == "" || contains(skip, tag) {
			continue
		}
		p := tag
		if path != "" {
			p = path + "." + tag
		}
		fv := v.Field(i)
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			if d := time.Duration(fv.Int()); d != 0 {
				g.set(p, "default", limitterms.ShortDuration(d))
			}
		case f.Type.Kind() == reflect.Struct:
			g.walkDefaults(fv, p, nil)
		case f.Type.Kind() == reflect.String, f.Type.Kind() == reflect.Int, f.Type.Kind() == reflect.Int64, f.Type.Kind() == reflect.Bool:
			if !fv.IsZero() {
				g.set(p, "default", fv.Interface())
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
