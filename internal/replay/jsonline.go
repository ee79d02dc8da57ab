package replay

import (
	"bytes"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// parseGateway reads one line of the gateway's own log. Access lines (logger "access", message
// "request", see proxy.logAccess) are requests; every other well-formed line of that log
// (startup, reload, sampled warnings) is skipped. A hand-written scanner for the flat object
// those lines are: encoding/json would allocate a map or a struct's strings per line.
//
// Key values are pseudonyms (keys: {"ip": ..., "api_key": ...}): the ip pseudonym becomes the
// ip key value itself, so CIDR overrides cannot match, and sha256 overrides of raw values
// cannot either.
func (p *parser) parseGateway(line []byte, rec *record) error {
	s := skipWS(line)
	if len(s) == 0 || s[0] != '{' {
		return errors.New("json: not an object")
	}
	s = skipWS(s[1:])
	var logger, msg, ts, tm []byte
	first := true
	for {
		if len(s) == 0 {
			return errors.New("json: object is not closed")
		}
		if s[0] == '}' {
			if len(skipWS(s[1:])) != 0 {
				return errors.New("json: text after the object")
			}
			break
		}
		if !first {
			if s[0] != ',' {
				return errors.New("json: want , between members")
			}
			s = skipWS(s[1:])
		}
		first = false
		key, rest, err := p.jsonString(s)
		if err != nil {
			return err
		}
		s = skipWS(rest)
		if len(s) == 0 || s[0] != ':' {
			return errors.New("json: want : after a member name")
		}
		s = skipWS(s[1:])
		var val []byte
		switch view(key) {
		case "logger", "msg", "ts", "time", "method", "path":
			if len(s) > 0 && s[0] != '"' {
				// ts may be a number with some encoders; nothing else is read as one.
				rest, err = skipValue(s)
				if err != nil {
					return err
				}
				s = skipWS(rest)
				continue
			}
			val, rest, err = p.jsonString(s)
			if err != nil {
				return err
			}
			switch view(key) {
			case "logger":
				logger = val
			case "msg":
				msg = val
			case "ts":
				ts = val
			case "time":
				tm = val
			case "method":
				rec.f.Method = view(val)
			case "path":
				rec.f.Path = view(val)
			}
		case "status", "duration_seconds":
			rest, err = skipValue(s)
			if err != nil {
				return err
			}
			v := s[:len(s)-len(rest)]
			if view(key) == "status" {
				rec.status = status(v)
			} else if d, ok := seconds(v); ok {
				rec.duration = d
			}
		case "keys":
			rest, err = p.jsonKeys(s, rec)
			if err != nil {
				return err
			}
		default:
			rest, err = skipValue(s)
			if err != nil {
				return err
			}
		}
		s = skipWS(rest)
	}
	if view(logger) != "access" || view(msg) != "request" {
		return errSkip
	}
	if tm == nil {
		tm = ts
	}
	t, ok := parseISOTime(tm)
	if !ok {
		return fmt.Errorf("json: time %q: want RFC 3339", clip(tm))
	}
	rec.t = t
	if rec.f.Method == "" || len(rec.f.Path) == 0 || rec.f.Path[0] != '/' {
		return fmt.Errorf("json: method %q, path %q: want both", clipString(rec.f.Method), clipString(rec.f.Path))
	}
	// A line without keys (none configured) charges global policies only.
	rec.pseudonymous = true
	return nil
}

// jsonKeys reads the "keys" object: kind to pseudonym.
func (p *parser) jsonKeys(s []byte, rec *record) ([]byte, error) {
	if len(s) == 0 || s[0] != '{' {
		return skipValue(s) // not an object: ignored
	}
	s = skipWS(s[1:])
	first := true
	for {
		if len(s) == 0 {
			return nil, errors.New("json: keys object is not closed")
		}
		if s[0] == '}' {
			return s[1:], nil
		}
		if !first {
			if s[0] != ',' {
				return nil, errors.New("json: want , between keys")
			}
			s = skipWS(s[1:])
		}
		first = false
		kind, rest, err := p.jsonString(s)
		if err != nil {
			return nil, err
		}
		s = skipWS(rest)
		if len(s) == 0 || s[0] != ':' {
			return nil, errors.New("json: want : in keys")
		}
		s = skipWS(s[1:])
		if len(s) == 0 || s[0] != '"' {
			if rest, err = skipValue(s); err != nil {
				return nil, err
			}
			s = skipWS(rest)
			continue
		}
		val, rest, err := p.jsonString(s)
		if err != nil {
			return nil, err
		}
		if len(val) > 0 {
			setKind(rec, view(kind), view(val))
		}
		s = skipWS(rest)
	}
}

func skipWS(s []byte) []byte {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t' || s[0] == '\n' || s[0] == '\r') {
		s = s[1:]
	}
	return s
}

// jsonString reads a JSON string at the start of s. Without escapes the value aliases s; with
// them it is decoded into the parser's scratch buffer.
func (p *parser) jsonString(s []byte) (val, rest []byte, err error) {
	if len(s) == 0 || s[0] != '"' {
		return nil, nil, errors.New("json: want a string")
	}
	end := 1
	escaped := false
	for end < len(s) && s[end] != '"' {
		if s[end] == '\\' {
			escaped = true
			end++
		} else if s[end] < 0x20 {
			return nil, nil, errors.New("json: control character in a string")
		}
		end++
	}
	if end >= len(s) {
		return nil, nil, errors.New("json: string is not closed")
	}
	if !escaped {
		return s[1:end], s[end+1:], nil
	}
	start := len(p.scratch)
	in := s[1:end]
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' {
			p.scratch = append(p.scratch, c)
			continue
		}
		i++
		if i >= len(in) {
			return nil, nil, errors.New("json: bad escape")
		}
		switch in[i] {
		case '"', '\\', '/':
			p.scratch = append(p.scratch, in[i])
		case 'b':
			p.scratch = append(p.scratch, '\b')
		case 'f':
			p.scratch = append(p.scratch, '\f')
		case 'n':
			p.scratch = append(p.scratch, '\n')
		case 'r':
			p.scratch = append(p.scratch, '\r')
		case 't':
			p.scratch = append(p.scratch, '\t')
		case 'u':
			r, ok := hex4(in[i+1:])
			if !ok {
				return nil, nil, errors.New("json: bad \\u escape")
			}
			i += 4
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if i+2 < len(in) && in[i+1] == '\\' && in[i+2] == 'u' {
					if lo, ok := hex4(in[i+3:]); ok {
						if d := utf16.DecodeRune(r, lo); d != utf8.RuneError {
							r2 = d
							i += 6
						}
					}
				}
				r = r2
			}
			p.scratch = utf8.AppendRune(p.scratch, r)
		default:
			return nil, nil, errors.New("json: bad escape")
		}
	}
	return p.scratch[start:], s[end+1:], nil
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		if !ishex(c) {
			return 0, false
		}
		r = r<<4 | rune(unhex(c))
	}
	return r, true
}

// skipValue skips one JSON value (string, number, literal, object or array) and returns what
// follows it. It checks the nesting, not every detail of the grammar: a value it accepts but
// JSON would not only ever costs that line its other fields, never a wrong request.
func skipValue(s []byte) ([]byte, error) {
	if len(s) == 0 {
		return nil, errors.New("json: want a value")
	}
	switch c := s[0]; {
	case c == '"':
		end := 1
		for end < len(s) && s[end] != '"' {
			if s[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(s) {
			return nil, errors.New("json: string is not closed")
		}
		return s[end+1:], nil
	case c == '{' || c == '[':
		depth := 0
		for i := 0; i < len(s); i++ {
			switch s[i] {
			case '"':
				rest, err := skipValue(s[i:])
				if err != nil {
					return nil, err
				}
				i = len(s) - len(rest) - 1
			case '{', '[':
				depth++
				if depth > 64 {
					return nil, errors.New("json: nested too deep")
				}
			case '}', ']':
				depth--
				if depth == 0 {
					return s[i+1:], nil
				}
			}
		}
		return nil, errors.New("json: object or array is not closed")
	default:
		i := bytes.IndexAny(s, ",}] \t\r\n")
		if i == 0 {
			return nil, errors.New("json: want a value")
		}
		if i < 0 {
			return nil, nil
		}
		return s[i:], nil
	}
}
