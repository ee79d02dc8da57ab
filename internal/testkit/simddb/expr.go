package simddb

import (
	"fmt"
	"strconv"
	"strings"
)

// The expression language's subset: condition expressions (comparisons, BETWEEN, IN, AND, OR,
// NOT, parentheses, attribute_exists, attribute_not_exists, attribute_type, begins_with,
// contains, size) and update expressions (SET with +, -, if_not_exists and list_append; REMOVE;
// ADD; DELETE), over document paths of names (#n or plain), map members and list indexes.

type tokKind uint8

const (
	tEOF tokKind = iota
	tIdent
	tName  // #name
	tValue // :value
	tNum   // a list index
	tPunct
)

type token struct {
	kind tokKind
	text string
}

func lex(s string) ([]token, error) {
	var out []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#' || c == ':' || isIdentByte(c):
			j := i + 1
			for j < len(s) && isIdentByte(s[j]) {
				j++
			}
			k := tIdent
			switch {
			case c == '#':
				k = tName
			case c == ':':
				k = tValue
			case c >= '0' && c <= '9':
				k = tNum
			}
			if (k == tName || k == tValue) && j == i+1 {
				return nil, fmt.Errorf("syntax error at %q", s[i:])
			}
			out = append(out, token{k, s[i:j]})
			i = j
		case c == '<' || c == '>':
			if i+1 < len(s) && (s[i+1] == '=' || (c == '<' && s[i+1] == '>')) {
				out = append(out, token{tPunct, s[i : i+2]})
				i += 2
			} else {
				out = append(out, token{tPunct, s[i : i+1]})
				i++
			}
		case strings.IndexByte("()=,.[]+-", c) >= 0:
			out = append(out, token{tPunct, s[i : i+1]})
			i++
		default:
			return nil, fmt.Errorf("syntax error: unexpected %q", c)
		}
	}
	return append(out, token{kind: tEOF}), nil
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// elem is one step of a document path: a name (resolved through the attribute names when it
// starts with #) or a list index.
type elem struct {
	name  string
	index int
	isIdx bool
}

type path []elem

// operand is a value in an expression: a path, a :value, or a function of them.
type operand struct {
	kind  byte // 'p' path, 'v' value, 's' size(path), 'i' if_not_exists, 'l' list_append, '+', '-'
	path  path
	value string
	l, r  *operand
}

// cond is a condition expression's node.
type cond struct {
	kind  string // "and", "or", "not", "cmp", "between", "in", or a function's name
	op    string
	l, r  *cond
	args  []*operand
	apath path
}

type parser struct {
	toks []token
	pos  int
	// names and values are the #names and :values the expression uses.
	names, values map[string]bool
}

func newParser(s string, names, values map[string]bool) (*parser, error) {
	toks, err := lex(s)
	if err != nil {
		return nil, err
	}
	return &parser{toks: toks, names: names, values: values}, nil
}

func (p *parser) peek() token { return p.toks[p.pos] }
func (p *parser) next() token { t := p.toks[p.pos]; p.pos++; return t }

func (p *parser) keyword(k string) bool {
	if t := p.peek(); t.kind == tIdent && strings.EqualFold(t.text, k) {
		p.pos++
		return true
	}
	return false
}

func (p *parser) punct(s string) bool {
	if t := p.peek(); t.kind == tPunct && t.text == s {
		p.pos++
		return true
	}
	return false
}

func (p *parser) expect(s string) error {
	if !p.punct(s) {
		return fmt.Errorf("syntax error: expected %q near %q", s, p.peek().text)
	}
	return nil
}

func (p *parser) path() (path, error) {
	var out path
	t := p.next()
	switch t.kind {
	case tName:
		p.names[t.text] = true
	case tIdent:
		if isReserved(t.text) {
			return nil, fmt.Errorf("attribute name is a reserved keyword; reserved keyword: %s", t.text)
		}
	default:
		return nil, fmt.Errorf("syntax error: expected a path near %q", t.text)
	}
	out = append(out, elem{name: t.text})
	for {
		switch {
		case p.punct("."):
			t := p.next()
			if t.kind != tName && t.kind != tIdent {
				return nil, fmt.Errorf("syntax error: expected a name after '.' near %q", t.text)
			}
			if t.kind == tName {
				p.names[t.text] = true
			}
			out = append(out, elem{name: t.text})
		case p.punct("["):
			t := p.next()
			if t.kind != tNum {
				return nil, fmt.Errorf("syntax error: expected an index near %q", t.text)
			}
			n, err := strconv.Atoi(t.text)
			if err != nil {
				return nil, fmt.Errorf("syntax error: index %q", t.text)
			}
			if err := p.expect("]"); err != nil {
				return nil, err
			}
			out = append(out, elem{index: n, isIdx: true})
		default:
			return out, nil
		}
	}
}

// isReserved covers the reserved words the store's attributes would hit (DynamoDB reserves
// hundreds; the store names every attribute through #names).
func isReserved(s string) bool {
	switch strings.ToUpper(s) {
	case "COUNT", "TTL", "SIZE", "AND", "OR", "NOT", "SET", "REMOVE", "ADD", "DELETE", "BETWEEN", "IN", "DATA", "VALUE", "KEY", "NAME", "TIME", "TIMESTAMP":
		return true
	}
	return false
}

// operand parses an operand of a condition (set is false) or of a SET action's value.
func (p *parser) operand(set bool) (*operand, error) {
	t := p.peek()
	switch {
	case t.kind == tValue:
		p.pos++
		p.values[t.text] = true
		return &operand{kind: 'v', value: t.text}, nil
	case t.kind == tIdent && p.toks[p.pos+1].kind == tPunct && p.toks[p.pos+1].text == "(":
		fn := strings.ToLower(t.text)
		p.pos += 2
		var o *operand
		switch {
		case fn == "size" && !set:
			pa, err := p.path()
			if err != nil {
				return nil, err
			}
			o = &operand{kind: 's', path: pa}
		case fn == "if_not_exists" && set:
			pa, err := p.path()
			if err != nil {
				return nil, err
			}
			if err := p.expect(","); err != nil {
				return nil, err
			}
			v, err := p.setValue()
			if err != nil {
				return nil, err
			}
			o = &operand{kind: 'i', path: pa, l: v}
		case fn == "list_append" && set:
			a, err := p.setValue()
			if err != nil {
				return nil, err
			}
			if err := p.expect(","); err != nil {
				return nil, err
			}
			b, err := p.setValue()
			if err != nil {
				return nil, err
			}
			o = &operand{kind: 'l', l: a, r: b}
		default:
			return nil, fmt.Errorf("invalid function name; function: %s", t.text)
		}
		if err := p.expect(")"); err != nil {
			return nil, err
		}
		return o, nil
	}
	pa, err := p.path()
	if err != nil {
		return nil, err
	}
	return &operand{kind: 'p', path: pa}, nil
}

// setValue parses a SET action's value: an operand, or two joined by + or -.
func (p *parser) setValue() (*operand, error) {
	l, err := p.operand(true)
	if err != nil {
		return nil, err
	}
	for _, op := range []string{"+", "-"} {
		if p.punct(op) {
			r, err := p.operand(true)
			if err != nil {
				return nil, err
			}
			return &operand{kind: op[0], l: l, r: r}, nil
		}
	}
	return l, nil
}

func (p *parser) condOr() (*cond, error) {
	l, err := p.condAnd()
	if err != nil {
		return nil, err
	}
	for p.keyword("OR") {
		r, err := p.condAnd()
		if err != nil {
			return nil, err
		}
		l = &cond{kind: "or", l: l, r: r}
	}
	return l, nil
}

func (p *parser) condAnd() (*cond, error) {
	l, err := p.condNot()
	if err != nil {
		return nil, err
	}
	for p.keyword("AND") {
		r, err := p.condNot()
		if err != nil {
			return nil, err
		}
		l = &cond{kind: "and", l: l, r: r}
	}
	return l, nil
}

func (p *parser) condNot() (*cond, error) {
	if p.keyword("NOT") {
		c, err := p.condNot()
		if err != nil {
			return nil, err
		}
		return &cond{kind: "not", l: c}, nil
	}
	return p.condPrimary()
}

func (p *parser) condPrimary() (*cond, error) {
	if p.punct("(") {
		c, err := p.condOr()
		if err != nil {
			return nil, err
		}
		return c, p.expect(")")
	}
	t := p.peek()
	if t.kind == tIdent && p.toks[p.pos+1].kind == tPunct && p.toks[p.pos+1].text == "(" {
		switch fn := strings.ToLower(t.text); fn {
		case "attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains":
			p.pos += 2
			pa, err := p.path()
			if err != nil {
				return nil, err
			}
			c := &cond{kind: fn, apath: pa}
			if fn != "attribute_exists" && fn != "attribute_not_exists" {
				if err := p.expect(","); err != nil {
					return nil, err
				}
				a, err := p.operand(false)
				if err != nil {
					return nil, err
				}
				c.args = []*operand{a}
			}
			return c, p.expect(")")
		}
	}
	l, err := p.operand(false)
	if err != nil {
		return nil, err
	}
	switch {
	case p.keyword("BETWEEN"):
		lo, err := p.operand(false)
		if err != nil {
			return nil, err
		}
		if !p.keyword("AND") {
			return nil, fmt.Errorf("syntax error: BETWEEN without AND")
		}
		hi, err := p.operand(false)
		if err != nil {
			return nil, err
		}
		return &cond{kind: "between", args: []*operand{l, lo, hi}}, nil
	case p.keyword("IN"):
		if err := p.expect("("); err != nil {
			return nil, err
		}
		args := []*operand{l}
		for {
			a, err := p.operand(false)
			if err != nil {
				return nil, err
			}
			args = append(args, a)
			if !p.punct(",") {
				break
			}
		}
		return &cond{kind: "in", args: args}, p.expect(")")
	}
	t = p.next()
	switch t.text {
	case "=", "<>", "<", "<=", ">", ">=":
		if t.kind != tPunct {
			break
		}
		r, err := p.operand(false)
		if err != nil {
			return nil, err
		}
		return &cond{kind: "cmp", op: t.text, args: []*operand{l, r}}, nil
	}
	return nil, fmt.Errorf("syntax error: expected a comparator near %q", t.text)
}

// parseCond parses a whole condition expression.
func parseCond(s string, names, values map[string]bool) (*cond, error) {
	p, err := newParser(s, names, values)
	if err != nil {
		return nil, err
	}
	c, err := p.condOr()
	if err != nil {
		return nil, err
	}
	if p.peek().kind != tEOF {
		return nil, fmt.Errorf("syntax error: unexpected %q", p.peek().text)
	}
	return c, nil
}

// action is one action of an update expression.
type action struct {
	kind  string // SET, REMOVE, ADD, DELETE
	path  path
	value *operand
}

// parseUpdate parses a whole update expression.
func parseUpdate(s string, names, values map[string]bool) ([]action, error) {
	p, err := newParser(s, names, values)
	if err != nil {
		return nil, err
	}
	var out []action
	seen := map[string]bool{}
	for p.peek().kind != tEOF {
		t := p.next()
		kind := strings.ToUpper(t.text)
		if t.kind != tIdent || (kind != "SET" && kind != "REMOVE" && kind != "ADD" && kind != "DELETE") {
			return nil, fmt.Errorf("syntax error: unexpected %q", t.text)
		}
		if seen[kind] {
			return nil, fmt.Errorf("the %s section can only be used once in an update expression", kind)
		}
		seen[kind] = true
		for {
			pa, err := p.path()
			if err != nil {
				return nil, err
			}
			a := action{kind: kind, path: pa}
			switch kind {
			case "SET":
				if err := p.expect("="); err != nil {
					return nil, err
				}
				if a.value, err = p.setValue(); err != nil {
					return nil, err
				}
			case "ADD", "DELETE":
				v := p.next()
				if v.kind != tValue {
					return nil, fmt.Errorf("syntax error: %s needs a value near %q", kind, v.text)
				}
				p.values[v.text] = true
				a.value = &operand{kind: 'v', value: v.text}
			}
			out = append(out, a)
			if !p.punct(",") {
				break
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("syntax error: empty update expression")
	}
	return out, nil
}
