package simddb

import (
	"bytes"
	"cmp"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Item is one item's attributes.
type Item = map[string]types.AttributeValue

// env resolves an expression's #names and :values.
type env struct {
	names  map[string]string
	values map[string]types.AttributeValue
}

func (e *env) name(el elem) (string, error) {
	if !strings.HasPrefix(el.name, "#") {
		return el.name, nil
	}
	n, ok := e.names[el.name]
	if !ok {
		return "", validation("An expression attribute name used in the document path is not defined; attribute name: " + el.name)
	}
	return n, nil
}

func (e *env) value(name string) (types.AttributeValue, error) {
	v, ok := e.values[name]
	if !ok {
		return nil, validation("An expression attribute value used in expression is not defined; attribute value: " + name)
	}
	return v, nil
}

// get returns the value at p in item, or nil.
func (e *env) get(item Item, p path) (types.AttributeValue, error) {
	var cur types.AttributeValue
	for i, el := range p {
		if i == 0 {
			n, err := e.name(el)
			if err != nil {
				return nil, err
			}
			cur = item[n]
			continue
		}
		switch c := cur.(type) {
		case *types.AttributeValueMemberM:
			if el.isIdx {
				return nil, nil
			}
			n, err := e.name(el)
			if err != nil {
				return nil, err
			}
			cur = c.Value[n]
		case *types.AttributeValueMemberL:
			if !el.isIdx || el.index >= len(c.Value) {
				return nil, nil
			}
			cur = c.Value[el.index]
		default:
			return nil, nil
		}
		if cur == nil {
			return nil, nil
		}
	}
	return cur, nil
}

// num parses a number attribute.
func num(s string) (*big.Rat, bool) {
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

// canonInt reports whether s is an integer in canonical form (no sign but a minus, no leading
// zero, not "-0"): the store's numbers, which need no big.Rat.
func canonInt(s string) bool {
	d := s
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 19 || (d[0] == '0' && (len(d) > 1 || len(s) > 1)) {
		return false
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return false
		}
	}
	return true
}

// canonNum is the form DynamoDB returns a number in.
func canonNum(r *big.Rat) string {
	if r.IsInt() {
		return r.Num().String()
	}
	s := r.FloatString(40)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func compare(a, b types.AttributeValue) (int, bool) {
	switch x := a.(type) {
	case *types.AttributeValueMemberN:
		y, ok := b.(*types.AttributeValueMemberN)
		if !ok {
			return 0, false
		}
		if canonInt(x.Value) && canonInt(y.Value) {
			a, err1 := strconv.ParseInt(x.Value, 10, 64)
			b, err2 := strconv.ParseInt(y.Value, 10, 64)
			if err1 == nil && err2 == nil {
				return cmp.Compare(a, b), true
			}
		}
		ra, ok1 := num(x.Value)
		rb, ok2 := num(y.Value)
		if !ok1 || !ok2 {
			return 0, false
		}
		return ra.Cmp(rb), true
	case *types.AttributeValueMemberS:
		y, ok := b.(*types.AttributeValueMemberS)
		if !ok {
			return 0, false
		}
		return strings.Compare(x.Value, y.Value), true
	case *types.AttributeValueMemberB:
		y, ok := b.(*types.AttributeValueMemberB)
		if !ok {
			return 0, false
		}
		return bytes.Compare(x.Value, y.Value), true
	}
	return 0, false
}

// Equal reports whether two attribute values are the same value (numbers by value, sets in any
// order).
func Equal(a, b types.AttributeValue) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	switch x := a.(type) {
	case *types.AttributeValueMemberN, *types.AttributeValueMemberS, *types.AttributeValueMemberB:
		c, ok := compare(a, b)
		return ok && c == 0
	case *types.AttributeValueMemberBOOL:
		y, ok := b.(*types.AttributeValueMemberBOOL)
		return ok && x.Value == y.Value
	case *types.AttributeValueMemberNULL:
		_, ok := b.(*types.AttributeValueMemberNULL)
		return ok
	case *types.AttributeValueMemberSS:
		y, ok := b.(*types.AttributeValueMemberSS)
		return ok && sameSet(x.Value, y.Value, func(s string) string { return s })
	case *types.AttributeValueMemberNS:
		y, ok := b.(*types.AttributeValueMemberNS)
		return ok && sameSet(x.Value, y.Value, normNum)
	case *types.AttributeValueMemberBS:
		y, ok := b.(*types.AttributeValueMemberBS)
		return ok && sameSet(x.Value, y.Value, func(b []byte) string { return string(b) })
	case *types.AttributeValueMemberL:
		y, ok := b.(*types.AttributeValueMemberL)
		return ok && slices.EqualFunc(x.Value, y.Value, Equal)
	case *types.AttributeValueMemberM:
		y, ok := b.(*types.AttributeValueMemberM)
		return ok && EqualItems(x.Value, y.Value)
	}
	return false
}

// EqualItems reports whether two items hold the same attributes (nil and empty alike).
func EqualItems(a, b Item) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func normNum(s string) string {
	if canonInt(s) {
		return s
	}
	if r, ok := num(s); ok {
		return canonNum(r)
	}
	return s
}

func sameSet[T any](a, b []T, key func(T) string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]bool{}
	for _, v := range a {
		m[key(v)] = true
	}
	for _, v := range b {
		if !m[key(v)] {
			return false
		}
	}
	return true
}

// operandValue evaluates a condition's operand against item (nil when it names nothing).
func (e *env) operandValue(item Item, o *operand) (types.AttributeValue, error) {
	switch o.kind {
	case 'v':
		return e.value(o.value)
	case 'p':
		return e.get(item, o.path)
	case 's':
		v, err := e.get(item, o.path)
		if err != nil || v == nil {
			return nil, err
		}
		n := -1
		switch x := v.(type) {
		case *types.AttributeValueMemberS:
			n = len(x.Value)
		case *types.AttributeValueMemberB:
			n = len(x.Value)
		case *types.AttributeValueMemberSS:
			n = len(x.Value)
		case *types.AttributeValueMemberNS:
			n = len(x.Value)
		case *types.AttributeValueMemberBS:
			n = len(x.Value)
		case *types.AttributeValueMemberL:
			n = len(x.Value)
		case *types.AttributeValueMemberM:
			n = len(x.Value)
		}
		if n < 0 {
			return nil, nil
		}
		return &types.AttributeValueMemberN{Value: fmt.Sprint(n)}, nil
	}
	return nil, fmt.Errorf("simddb: operand kind %c in a condition", o.kind)
}

// eval evaluates condition c on item (nil: no item).
func (e *env) eval(item Item, c *cond) (bool, error) {
	switch c.kind {
	case "and", "or":
		l, err := e.eval(item, c.l)
		if err != nil {
			return false, err
		}
		r, err := e.eval(item, c.r)
		if err != nil {
			return false, err
		}
		if c.kind == "and" {
			return l && r, nil
		}
		return l || r, nil
	case "not":
		v, err := e.eval(item, c.l)
		return !v && err == nil, err
	case "attribute_exists", "attribute_not_exists":
		v, err := e.get(item, c.apath)
		if err != nil {
			return false, err
		}
		return (v != nil) == (c.kind == "attribute_exists"), nil
	case "attribute_type":
		v, err := e.get(item, c.apath)
		if err != nil {
			return false, err
		}
		t, err := e.operandValue(item, c.args[0])
		if err != nil {
			return false, err
		}
		s, ok := t.(*types.AttributeValueMemberS)
		return ok && v != nil && typeName(v) == s.Value, nil
	case "begins_with":
		v, err := e.get(item, c.apath)
		if err != nil {
			return false, err
		}
		p, err := e.operandValue(item, c.args[0])
		if err != nil {
			return false, err
		}
		switch x := v.(type) {
		case *types.AttributeValueMemberS:
			y, ok := p.(*types.AttributeValueMemberS)
			return ok && strings.HasPrefix(x.Value, y.Value), nil
		case *types.AttributeValueMemberB:
			y, ok := p.(*types.AttributeValueMemberB)
			return ok && bytes.HasPrefix(x.Value, y.Value), nil
		}
		return false, nil
	case "contains":
		v, err := e.get(item, c.apath)
		if err != nil {
			return false, err
		}
		p, err := e.operandValue(item, c.args[0])
		if err != nil || p == nil {
			return false, err
		}
		return contains(v, p), nil
	case "cmp":
		a, err := e.operandValue(item, c.args[0])
		if err != nil {
			return false, err
		}
		b, err := e.operandValue(item, c.args[1])
		if err != nil {
			return false, err
		}
		if a == nil || b == nil {
			return false, nil
		}
		switch c.op {
		case "=":
			return Equal(a, b), nil
		case "<>":
			return !Equal(a, b), nil
		}
		r, ok := compare(a, b)
		if !ok {
			return false, nil
		}
		switch c.op {
		case "<":
			return r < 0, nil
		case "<=":
			return r <= 0, nil
		case ">":
			return r > 0, nil
		}
		return r >= 0, nil
	case "between":
		var vs [3]types.AttributeValue
		for i := range vs {
			v, err := e.operandValue(item, c.args[i])
			if err != nil {
				return false, err
			}
			if v == nil {
				return false, nil
			}
			vs[i] = v
		}
		lo, ok1 := compare(vs[0], vs[1])
		hi, ok2 := compare(vs[0], vs[2])
		return ok1 && ok2 && lo >= 0 && hi <= 0, nil
	case "in":
		v, err := e.operandValue(item, c.args[0])
		if err != nil || v == nil {
			return false, err
		}
		for _, a := range c.args[1:] {
			w, err := e.operandValue(item, a)
			if err != nil {
				return false, err
			}
			if Equal(v, w) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, fmt.Errorf("simddb: condition %q", c.kind)
}

func contains(v, p types.AttributeValue) bool {
	switch x := v.(type) {
	case *types.AttributeValueMemberS:
		y, ok := p.(*types.AttributeValueMemberS)
		return ok && strings.Contains(x.Value, y.Value)
	case *types.AttributeValueMemberSS:
		y, ok := p.(*types.AttributeValueMemberS)
		return ok && slices.Contains(x.Value, y.Value)
	case *types.AttributeValueMemberNS:
		y, ok := p.(*types.AttributeValueMemberN)
		return ok && slices.ContainsFunc(x.Value, func(s string) bool { return normNum(s) == normNum(y.Value) })
	case *types.AttributeValueMemberBS:
		y, ok := p.(*types.AttributeValueMemberB)
		return ok && slices.ContainsFunc(x.Value, func(b []byte) bool { return bytes.Equal(b, y.Value) })
	case *types.AttributeValueMemberL:
		return slices.ContainsFunc(x.Value, func(w types.AttributeValue) bool { return Equal(w, p) })
	}
	return false
}

func typeName(v types.AttributeValue) string {
	switch v.(type) {
	case *types.AttributeValueMemberS:
		return "S"
	case *types.AttributeValueMemberN:
		return "N"
	case *types.AttributeValueMemberB:
		return "B"
	case *types.AttributeValueMemberSS:
		return "SS"
	case *types.AttributeValueMemberNS:
		return "NS"
	case *types.AttributeValueMemberBS:
		return "BS"
	case *types.AttributeValueMemberM:
		return "M"
	case *types.AttributeValueMemberL:
		return "L"
	case *types.AttributeValueMemberNULL:
		return "NULL"
	case *types.AttributeValueMemberBOOL:
		return "BOOL"
	}
	return "?"
}

// setValue evaluates a SET action's value against the item as it was before the update.
func (e *env) setValue(old Item, o *operand) (types.AttributeValue, error) {
	switch o.kind {
	case 'v':
		return e.value(o.value)
	case 'p':
		v, err := e.get(old, o.path)
		if err == nil && v == nil {
			err = validation("The provided expression refers to an attribute that does not exist in the item")
		}
		return v, err
	case 'i':
		v, err := e.get(old, o.path)
		if err != nil || v != nil {
			return v, err
		}
		return e.setValue(old, o.l)
	case 'l':
		a, err := e.setValue(old, o.l)
		if err != nil {
			return nil, err
		}
		b, err := e.setValue(old, o.r)
		if err != nil {
			return nil, err
		}
		la, ok1 := a.(*types.AttributeValueMemberL)
		lb, ok2 := b.(*types.AttributeValueMemberL)
		if !ok1 || !ok2 {
			return nil, validation("An operand in the update expression has an incorrect data type")
		}
		return &types.AttributeValueMemberL{Value: append(slices.Clone(la.Value), lb.Value...)}, nil
	case '+', '-':
		a, err := e.setValue(old, o.l)
		if err != nil {
			return nil, err
		}
		b, err := e.setValue(old, o.r)
		if err != nil {
			return nil, err
		}
		na, ok1 := a.(*types.AttributeValueMemberN)
		nb, ok2 := b.(*types.AttributeValueMemberN)
		if !ok1 || !ok2 {
			return nil, validation("An operand in the update expression has an incorrect data type")
		}
		ra, _ := num(na.Value)
		rb, _ := num(nb.Value)
		if o.kind == '+' {
			return &types.AttributeValueMemberN{Value: canonNum(new(big.Rat).Add(ra, rb))}, nil
		}
		return &types.AttributeValueMemberN{Value: canonNum(new(big.Rat).Sub(ra, rb))}, nil
	}
	return nil, fmt.Errorf("simddb: operand kind %c in SET", o.kind)
}

// paths resolves the actions' paths and refuses overlapping ones (a check of the expression
// alone, made before any item is read).
func (e *env) paths(acts []action) ([]resolved, error) {
	paths := make([]resolved, len(acts))
	for i, a := range acts {
		r, err := e.resolve(a.path)
		if err != nil {
			return nil, err
		}
		for j := range i {
			if overlaps(paths[j], r) {
				return nil, validation(fmt.Sprintf("Invalid UpdateExpression: Two document paths overlap with each other; must remove or rewrite one of these paths; path one: [%s], path two: [%s]", paths[j], r))
			}
		}
		paths[i] = r
	}
	return paths, nil
}

// resolved is a path with its names resolved.
type resolved []elem

func (e *env) resolve(p path) (resolved, error) {
	out := make(resolved, len(p))
	for i, el := range p {
		if el.isIdx {
			out[i] = el
			continue
		}
		n, err := e.name(el)
		if err != nil {
			return nil, err
		}
		out[i] = elem{name: n}
	}
	return out, nil
}

func (r resolved) String() string {
	var b strings.Builder
	for i, el := range r {
		switch {
		case el.isIdx:
			fmt.Fprintf(&b, "[%d]", el.index)
		case i > 0:
			b.WriteString("." + el.name)
		default:
			b.WriteString(el.name)
		}
	}
	return b.String()
}

// overlaps reports whether one path is a prefix of the other.
func overlaps(a, b resolved) bool {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var errBadPath = validation("The document path provided in the update expression is invalid for update")

// parentOf returns the container that holds the last element of r in item (creating nothing).
func parentOf(item Item, r resolved) (types.AttributeValue, error) {
	cur := types.AttributeValue(&types.AttributeValueMemberM{Value: item})
	for _, el := range r[:len(r)-1] {
		switch c := cur.(type) {
		case *types.AttributeValueMemberM:
			if el.isIdx {
				return nil, errBadPath
			}
			cur = c.Value[el.name]
		case *types.AttributeValueMemberL:
			if !el.isIdx || el.index >= len(c.Value) {
				return nil, errBadPath
			}
			cur = c.Value[el.index]
		default:
			return nil, errBadPath
		}
		if cur == nil {
			return nil, errBadPath
		}
	}
	return cur, nil
}

// put writes v at r in item (whose containers are copies the update owns).
func put(item Item, r resolved, v types.AttributeValue) error {
	parent, err := parentOf(item, r)
	if err != nil {
		return err
	}
	last := r[len(r)-1]
	switch c := parent.(type) {
	case *types.AttributeValueMemberM:
		if last.isIdx {
			return errBadPath
		}
		c.Value[last.name] = v
	case *types.AttributeValueMemberL:
		if !last.isIdx {
			return errBadPath
		}
		if last.index >= len(c.Value) {
			c.Value = append(c.Value, v)
		} else {
			c.Value[last.index] = v
		}
	default:
		return errBadPath
	}
	return nil
}

// remove deletes r from item; a missing attribute is no error, a missing parent is.
func remove(item Item, r resolved) error {
	parent, err := parentOf(item, r)
	if err != nil {
		if len(r) > 1 {
			return err
		}
		return nil
	}
	last := r[len(r)-1]
	switch c := parent.(type) {
	case *types.AttributeValueMemberM:
		delete(c.Value, last.name)
	case *types.AttributeValueMemberL:
		if last.isIdx && last.index < len(c.Value) {
			c.Value = slices.Delete(c.Value, last.index, last.index+1)
		}
	}
	return nil
}

// apply runs the update's actions on a deep copy of old (nil: no item) and returns the new item
// and the resolved paths it updated.
func (e *env) apply(old Item, acts []action) (Item, []resolved, error) {
	paths, err := e.paths(acts)
	if err != nil {
		return nil, nil, err
	}
	// Every value is computed from the item as it was (DynamoDB evaluates the whole expression
	// against the old item).
	vals := make([]types.AttributeValue, len(acts))
	for i, a := range acts {
		var err error
		switch a.kind {
		case "SET":
			vals[i], err = e.setValue(old, a.value)
		case "ADD", "DELETE":
			vals[i], err = e.value(a.value.value)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	item := CopyItem(old)
	if item == nil {
		item = Item{}
	}
	for i, a := range acts {
		r := paths[i]
		switch a.kind {
		case "SET":
			if err := put(item, r, CopyValue(vals[i])); err != nil {
				return nil, nil, err
			}
		case "REMOVE":
			if err := remove(item, r); err != nil {
				return nil, nil, err
			}
		case "ADD", "DELETE":
			cur, _ := (&env{}).get(item, toPath(r))
			nv, err := addOrDelete(a.kind, cur, vals[i])
			if err != nil {
				return nil, nil, err
			}
			if nv == nil {
				if err := remove(item, r); err != nil {
					return nil, nil, err
				}
			} else if err := put(item, r, nv); err != nil {
				return nil, nil, err
			}
		}
	}
	return item, paths, nil
}

func toPath(r resolved) path { return path(r) }

// addOrDelete is ADD's or DELETE's new value (nil: remove the attribute).
func addOrDelete(kind string, cur, v types.AttributeValue) (types.AttributeValue, error) {
	bad := validation("An operand in the update expression has an incorrect data type")
	if kind == "ADD" {
		if n, ok := v.(*types.AttributeValueMemberN); ok {
			if cur == nil {
				return &types.AttributeValueMemberN{Value: normNum(n.Value)}, nil
			}
			c, ok := cur.(*types.AttributeValueMemberN)
			if !ok {
				return nil, bad
			}
			a, _ := num(c.Value)
			b, _ := num(n.Value)
			return &types.AttributeValueMemberN{Value: canonNum(new(big.Rat).Add(a, b))}, nil
		}
	}
	switch x := v.(type) {
	case *types.AttributeValueMemberSS:
		var have []string
		if cur != nil {
			c, ok := cur.(*types.AttributeValueMemberSS)
			if !ok {
				return nil, bad
			}
			have = c.Value
		}
		out := setOp(kind, have, x.Value, func(s string) string { return s })
		if len(out) == 0 {
			return nil, nil
		}
		return &types.AttributeValueMemberSS{Value: out}, nil
	case *types.AttributeValueMemberNS:
		var have []string
		if cur != nil {
			c, ok := cur.(*types.AttributeValueMemberNS)
			if !ok {
				return nil, bad
			}
			have = c.Value
		}
		out := setOp(kind, have, x.Value, normNum)
		if len(out) == 0 {
			return nil, nil
		}
		return &types.AttributeValueMemberNS{Value: out}, nil
	}
	return nil, bad
}

func setOp(kind string, have, v []string, key func(string) string) []string {
	out := slices.Clone(have)
	for _, s := range v {
		i := slices.IndexFunc(out, func(h string) bool { return key(h) == key(s) })
		switch {
		case kind == "ADD" && i < 0:
			out = append(out, s)
		case kind == "DELETE" && i >= 0:
			out = slices.Delete(out, i, i+1)
		}
	}
	return out
}

// project is the part of item that the paths reach (UPDATED_OLD, UPDATED_NEW): each path's
// whole top-level attribute, as DynamoDB Local answers for a map member.
func project(item Item, paths []resolved) Item {
	out := Item{}
	for _, r := range paths {
		if v, _ := (&env{}).get(item, toPath(r)); v != nil {
			out[r[0].name] = CopyValue(item[r[0].name])
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// CopyItem deep-copies an item (nil stays nil).
func CopyItem(it Item) Item {
	if it == nil {
		return nil
	}
	out := make(Item, len(it))
	for k, v := range it {
		out[k] = CopyValue(v)
	}
	return out
}

// CopyValue deep-copies a value, numbers in DynamoDB's canonical form.
func CopyValue(v types.AttributeValue) types.AttributeValue {
	switch x := v.(type) {
	case *types.AttributeValueMemberN:
		return &types.AttributeValueMemberN{Value: normNum(x.Value)}
	case *types.AttributeValueMemberS:
		return &types.AttributeValueMemberS{Value: x.Value}
	case *types.AttributeValueMemberB:
		return &types.AttributeValueMemberB{Value: bytes.Clone(x.Value)}
	case *types.AttributeValueMemberBOOL:
		return &types.AttributeValueMemberBOOL{Value: x.Value}
	case *types.AttributeValueMemberNULL:
		return &types.AttributeValueMemberNULL{Value: x.Value}
	case *types.AttributeValueMemberSS:
		return &types.AttributeValueMemberSS{Value: slices.Clone(x.Value)}
	case *types.AttributeValueMemberNS:
		out := make([]string, len(x.Value))
		for i, s := range x.Value {
			out[i] = normNum(s)
		}
		return &types.AttributeValueMemberNS{Value: out}
	case *types.AttributeValueMemberBS:
		out := make([][]byte, len(x.Value))
		for i, b := range x.Value {
			out[i] = bytes.Clone(b)
		}
		return &types.AttributeValueMemberBS{Value: out}
	case *types.AttributeValueMemberL:
		out := make([]types.AttributeValue, len(x.Value))
		for i, w := range x.Value {
			out[i] = CopyValue(w)
		}
		return &types.AttributeValueMemberL{Value: out}
	case *types.AttributeValueMemberM:
		return &types.AttributeValueMemberM{Value: CopyItem(x.Value)}
	}
	return v
}
