package policy

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/configyaml"
)

// LoadOptions are the inputs of Load and Parse besides the file itself.
type LoadOptions struct {
	// Getenv reads the RATELIMIT_* overrides. nil means os.Getenv. It is called only while
	// loading: a Set never reads the environment behind the caller's back.
	Getenv func(string) string
}

// source is where a Config came from, so that later problems (validation's) are reported at
// their line.
type source struct {
	file string
	doc  *configyaml.Doc
}

// Load reads the configuration file at path; see Parse. Its problems name the file (and
// validation's problems of the Config, later).
func Load(path string, opts LoadOptions) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return ParseFile(path, data, opts)
}

// ParseFile is Parse of data read from the file at path: its problems, and validation's later,
// name the file and their line (FILE:LINE:COL in FieldError.Text).
func ParseFile(path string, data []byte, opts LoadOptions) (*Config, error) {
	cfg, es, err := parseFile(path, data, opts)
	if err != nil {
		return nil, err
	}
	if err := es.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func parseFile(path string, data []byte, opts LoadOptions) (*Config, Errors, error) {
	cfg, es, err := parse(data, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	cfg.src.file = path
	for i := range es {
		if es[i].Line > 0 {
			es[i].File = path
		}
	}
	return cfg, es, nil
}

// Parse decodes a YAML configuration, applies the defaults (defaults.go) and the RATELIMIT_*
// environment overrides (env.go), and returns the Config. Decoding is strict: unknown fields,
// values of the wrong type and fields written twice are reported together as Errors, each with
// its path and line. Parse does not validate values; call Validate or Compile.
//
// Keys are case-insensitive, so `Listen:` is `listen:`.
func Parse(data []byte, opts LoadOptions) (*Config, error) {
	cfg, es, err := parse(data, opts)
	if err != nil {
		return nil, err
	}
	if err := es.err(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// parse is Parse, also returning the Config when the file has problems (those fields keep
// their defaults), for a report of everything at once (Check). err is a file that is not YAML.
func parse(data []byte, opts LoadOptions) (*Config, Errors, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	cfg := new(Config)
	cfg.SetDefaults()
	doc, problems, err := configyaml.Decode(data, cfg, configyaml.Options{FoldCase: true})
	if err != nil {
		return nil, nil, fmt.Errorf("invalid YAML: %w", err)
	}
	cfg.src.doc = doc
	es := applyEnv(cfg, getenv)
	for _, p := range problems {
		es = append(es, FieldError{Path: p.Path, Value: p.Value, Msg: p.Msg, Line: p.Line, Col: p.Col})
	}
	for i := range cfg.Policies {
		p := &cfg.Policies[i]
		at := "policies[" + strconv.Itoa(i) + "]"
		p.windowSet, p.costSet = doc.Has(at+".window"), doc.Has(at+".cost")
		for j := range p.Overrides {
			p.Overrides[j].windowSet = doc.Has(at + ".overrides[" + strconv.Itoa(j) + "].window")
		}
	}
	return cfg, es, nil
}

// locate gives the problems of c's own fields the file's name and their line.
func (c *Config) locate(es Errors) {
	for i := range es {
		e := &es[i]
		if e.File != "" || strings.HasPrefix(e.Path, EnvPrefix) {
			continue // a rule file's, or an environment variable's
		}
		e.File = c.src.file
		if pos := c.src.doc.Pos(e.Path); pos.Line > 0 {
			e.Line, e.Col = pos.Line, pos.Col
		}
	}
}

// Check loads the file at path and compiles it, as Load and Compile do, but reports every
// problem of the file in one go: those of decoding (unknown fields, types) and validation's,
// in file order. A field that did not decode is reported once, for that. This is what
// `ratelimit-proxy validate` runs.
func Check(path string, lo LoadOptions, co CompileOptions) (*Config, *Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("load config: %w", err)
	}
	return CheckData(path, data, lo, co)
}

// CheckData is Check of data read from the file at path.
func CheckData(path string, data []byte, lo LoadOptions, co CompileOptions) (*Config, *Set, error) {
	cfg, decodeErrs, err := parseFile(path, data, lo)
	if err != nil {
		return nil, nil, err
	}
	if len(decodeErrs) == 0 {
		set, err := Compile(cfg, co)
		if err != nil {
			return nil, nil, err
		}
		return cfg, set, nil
	}
	checkErrs, _, _, _ := cfg.check(co.Getenv)
	cfg.locate(checkErrs)
	all := decodeErrs
	for _, e := range checkErrs {
		if !slices.ContainsFunc(decodeErrs, func(d FieldError) bool { return within(e.Path, d.Path) }) {
			all = append(all, e)
		}
	}
	sortByPlace(all, path)
	return nil, nil, all
}

// within reports whether path is at or below field (policies[0].limit is within policies[0]).
func within(path, field string) bool {
	rest, ok := strings.CutPrefix(path, field)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}

// sortByPlace orders es as they appear: first those without a line (environment variables,
// fields the file left out), then the file's by line, then the rule files' in their order.
func sortByPlace(es Errors, file string) {
	rank := func(e FieldError) int {
		switch {
		case e.File != "" && e.File != file:
			return 2
		case e.Line == 0:
			return 0
		}
		return 1
	}
	slices.SortStableFunc(es, func(a, b FieldError) int {
		if c := cmp.Compare(rank(a), rank(b)); c != 0 || rank(a) != 1 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Col, b.Col))
	})
}
