// Package configyaml decodes YAML configuration files strictly into typed structs.
//
// Decode walks the parsed document against the struct's `yaml` tags and reports every
// problem at once, each with its field path and line:column: unknown fields (with the known
// name they most resemble), values of the wrong type, durations that do not parse, fields
// written twice. Both configuration formats (ratelimit-proxy's and envoyproxy/ratelimit's)
// are read with it, so both are strict the same way.
//
// Defaults are the caller's: fill them in before Decode (a field the file leaves out keeps
// its value), and give the types of optional blocks and list entries a SetDefaults method,
// which Decode calls on each one it creates.
package configyaml

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Problem is one problem of a document: Path locates the field (`policies[2].rate`), Value is
// what the file wrote there (empty for a list or mapping), Msg says what is wrong. Line and
// Col are 1-based.
type Problem struct {
	Path, Value, Msg string
	Line, Col        int
}

// Defaulter is a type whose zero value is not its default: Decode calls SetDefaults on every
// value of it that it creates (an optional block the file writes, a list's entry) before
// decoding into it.
type Defaulter interface {
	SetDefaults()
}

// Options tune Decode.
type Options struct {
	// FoldCase matches keys to tags case-insensitively (`Listen:` is `listen:`).
	FoldCase bool
}

// Pos is a line and column, 1-based; the zero Pos is unknown.
type Pos struct{ Line, Col int }

// Doc is where the decoded document wrote each field, for reporting later problems (a value
// that validation refuses) at their place. The zero Doc knows no place.
type Doc struct {
	pos map[string]Pos
}

// Has reports whether the document wrote path (a null value counts as unwritten).
func (d *Doc) Has(path string) bool {
	if d == nil {
		return false
	}
	_, ok := d.pos[path]
	return ok
}

// Pos is the place of path or, when the document did not write it (a required field left
// out), of its nearest written ancestor; the zero Pos when there is none.
func (d *Doc) Pos(path string) Pos {
	if d == nil {
		return Pos{}
	}
	for path != "" {
		if p, ok := d.pos[path]; ok {
			return p
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return Pos{}
}

// maxNodes bounds the nodes one document may expand to: aliases may repeat a subtree many
// times over (a "billion laughs" file), and a walk would visit every copy. maxProblems bounds
// the report of a document that is wrong everywhere.
const (
	maxNodes    = 1 << 18
	maxProblems = 1000
)

var errTooLarge = fmt.Errorf("the document expands to more than %d nodes (aliases)", maxNodes)

// Decode decodes data into out, a pointer to a struct. It returns err for a document that is
// not YAML at all (its message carries the line); otherwise every problem of the document, in
// file order, and the places of the fields it wrote. Fields that have a problem keep the value
// they had. An empty document decodes to nothing.
func Decode(data []byte, out any, opts Options) (*Doc, []Problem, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, err
	}
	d := &decoder{opts: opts, doc: &Doc{pos: map[string]Pos{}}}
	v := reflect.ValueOf(out)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, nil, fmt.Errorf("configyaml: Decode needs a non-nil pointer, got %T", out)
	}
	if len(root.Content) > 0 {
		d.value(root.Content[0], v.Elem(), "")
	}
	if d.nodes > maxNodes {
		return nil, nil, errTooLarge
	}
	return d.doc, d.problems, nil
}

type decoder struct {
	opts     Options
	doc      *Doc
	problems []Problem
	nodes    int
}

func (d *decoder) add(n *yaml.Node, path, value, msg string) {
	if len(d.problems) >= maxProblems {
		return
	}
	if path == "" {
		path = "(file)"
	}
	d.problems = append(d.problems, Problem{Path: path, Value: value, Msg: msg, Line: n.Line, Col: n.Column})
}

// scalar is the text of a scalar node, "" for a list or mapping (never shown).
func scalar(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

var durationType = reflect.TypeFor[time.Duration]()

// value decodes n into v at path.
func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	if d.nodes++; d.nodes > maxNodes {
		return
	}
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // `key:` with nothing after it leaves the field as it was
	}
	if path != "" {
		d.doc.pos[path] = Pos{n.Line, n.Column}
	}
	t := v.Type()
	switch {
	case t == durationType:
		dur, err := time.ParseDuration(scalar(n))
		if n.Kind != yaml.ScalarNode || err != nil {
			d.add(n, path, scalar(n), "must be a duration such as 500ms, 1m or 2h")
			return
		}
		v.SetInt(int64(dur))
	case t.Kind() == reflect.Pointer:
		if n.Kind != yaml.MappingNode && t.Elem().Kind() == reflect.Struct {
			d.add(n, path, scalar(n), "must be a mapping")
			return
		}
		if v.IsNil() {
			v.Set(New(t.Elem()))
		}
		d.value(n, v.Elem(), path)
	case t.Kind() == reflect.Struct:
		d.mapping(n, v, path)
	case t.Kind() == reflect.Slice:
		d.list(n, v, path)
	case t.Kind() == reflect.Map:
		d.dict(n, v, path)
	case t.Kind() == reflect.Interface:
		var x any
		if err := n.Decode(&x); err != nil {
			d.add(n, path, scalar(n), err.Error())
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	case n.Kind != yaml.ScalarNode:
		d.add(n, path, "", "must be "+want(t))
	case t.Kind() == reflect.String:
		// YAML authors rarely quote `rate: 50` or `name: 2024`: the text is kept, and
		// validation judges it.
		v.SetString(n.Value)
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(n.Value)
		if n.Tag != "!!bool" || err != nil {
			d.add(n, path, n.Value, "must be true or false")
			return
		}
		v.SetBool(b)
	case v.CanInt():
		i, ok := integer(n)
		if !ok || v.OverflowInt(i) {
			d.add(n, path, n.Value, "must be an integer")
			return
		}
		v.SetInt(i)
	case v.CanFloat():
		f, err := strconv.ParseFloat(n.Value, 64)
		if (n.Tag != "!!int" && n.Tag != "!!float") || err != nil {
			var yf float64
			if n.Tag != "!!float" || n.Decode(&yf) != nil { // .inf, .nan
				d.add(n, path, n.Value, "must be a number")
				return
			}
			f = yf
		}
		v.SetFloat(f)
	default:
		d.add(n, path, n.Value, fmt.Sprintf("configyaml: cannot decode into %s", t))
	}
}

// integer reads an integer node; an integral float (2.0) counts, 2.5 does not.
func integer(n *yaml.Node) (int64, bool) {
	switch n.Tag {
	case "!!int":
		var i int64
		if n.Decode(&i) != nil {
			return 0, false
		}
		return i, true
	case "!!float":
		var f float64
		if n.Decode(&f) != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

// want names what a value of t must be, for "must be ...".
func want(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "a mapping"
	}
	return "an integer"
}

// New returns a pointer to a new T, with its defaults when it is a Defaulter.
func New(t reflect.Type) reflect.Value {
	p := reflect.New(t)
	if df, ok := p.Interface().(Defaulter); ok {
		df.SetDefaults()
	}
	return p
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// mapping decodes a mapping into the struct v.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.add(n, path, scalar(n), "must be a mapping")
		return
	}
	fields := Fields(v.Type())
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" { // `<<: *defaults`
			for val.Kind == yaml.AliasNode {
				val = val.Alias
			}
			d.mapping(val, v, path)
			continue
		}
		name := k.Value
		idx := -1
		for j, f := range fields {
			if f.Name == name || d.opts.FoldCase && strings.EqualFold(f.Name, name) {
				idx = j
				break
			}
		}
		if idx < 0 {
			msg := "unknown field"
			if s := suggestField(name, fields); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.add(k, join(path, name), "", msg)
			continue
		}
		f := fields[idx]
		sub := join(path, f.Name)
		if line, dup := seen[f.Name]; dup {
			d.add(k, sub, "", fmt.Sprintf("written twice (first on line %d)", line))
			continue
		}
		seen[f.Name] = k.Line
		d.value(val, v.FieldByIndex(f.Index), sub)
	}
}

// list decodes a sequence into the slice v; a struct entry starts from its defaults.
func (d *decoder) list(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.add(n, path, scalar(n), "must be a list")
		return
	}
	out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		out.Index(i).Set(New(v.Type().Elem()).Elem())
		d.value(item, out.Index(i), fmt.Sprintf("%s[%d]", path, i))
	}
	v.Set(out)
}

// dict decodes a mapping into the map v (string keys).
func (d *decoder) dict(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.add(n, path, scalar(n), "must be a mapping")
		return
	}
	t := v.Type()
	if t.Key().Kind() != reflect.String {
		d.add(n, path, "", fmt.Sprintf("configyaml: cannot decode into %s", t))
		return
	}
	m := reflect.MakeMapWithSize(t, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.add(k, path, "", "keys must be strings")
			continue
		}
		e := New(t.Elem()).Elem()
		d.value(val, e, join(path, k.Value))
		m.SetMapIndex(reflect.ValueOf(k.Value).Convert(t.Key()), e)
	}
	v.Set(m)
}

// Field is one field of a struct as the file names it.
type Field struct {
	Name  string // the yaml tag's name
	Index []int
	Type  reflect.Type
}

// Fields lists the fields of struct t that have a yaml tag, in declaration order; fields
// tagged "-" or untagged are not the file's.
func Fields(t reflect.Type) []Field {
	var out []Field
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		out = append(out, Field{Name: name, Index: f.Index, Type: f.Type})
	}
	return out
}

// suggestField is the field of fs that name most resembles or, when none does, a field one
// block down (`match.methods` for a `methds:` written in a policy beside match).
func suggestField(name string, fs []Field) string {
	var own, nested, last []string
	for _, f := range fs {
		own = append(own, f.Name)
		t := f.Type
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() == reflect.Struct && t != durationType {
			for _, sub := range Fields(t) {
				nested = append(nested, f.Name+"."+sub.Name)
				last = append(last, sub.Name)
			}
		}
	}
	if s := Suggest(name, own); s != "" {
		return s
	}
	if s := Suggest(name, last); s != "" {
		return nested[slices.Index(last, s)]
	}
	return ""
}
