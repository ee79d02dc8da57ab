package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// accessLine is the part of one gateway log line (see proxy.logAccess) that a replay reads.
// Numbers stay raw: ts may be a number with some encoders, and a status or duration that does
// not parse costs that field only, never the line.
type accessLine struct {
	Logger   string                     `json:"logger"`
	Msg      string                     `json:"msg"`
	TS       json.RawMessage            `json:"ts"`
	Time     json.RawMessage            `json:"time"`
	Method   string                     `json:"method"`
	Path     string                     `json:"path"`
	Status   json.RawMessage            `json:"status"`
	Duration json.RawMessage            `json:"duration_seconds"`
	Keys     map[string]json.RawMessage `json:"keys"`
}

// parseGateway reads one line of the gateway's own log. Access lines (logger "access", message
// "request") are requests; every other well-formed line of that log (startup, reload, sampled
// warnings) is skipped.
//
// Key values are pseudonyms (keys: {"ip": ..., "api_key": ...}): the ip pseudonym becomes the
// ip key value itself, so CIDR overrides cannot match, and sha256 overrides of raw values
// cannot either.
func (p *parser) parseGateway(line []byte, rec *record) error {
	var l accessLine
	if err := json.Unmarshal(line, &l); err != nil {
		if se := (*json.SyntaxError)(nil); errors.As(err, &se) && se.Offset >= int64(len(line)) {
			return fmt.Errorf("json: object is not closed: %w", err)
		}
		return fmt.Errorf("json: %w", err)
	}
	if l.Logger != "access" || l.Msg != "request" {
		return errSkip
	}
	tm := jsonText(l.Time)
	if tm == "" {
		tm = jsonText(l.TS)
	}
	t, ok := parseISOTime([]byte(tm))
	if !ok {
		return fmt.Errorf("json: time %q: want RFC 3339", clipString(tm))
	}
	rec.t = t
	rec.f.Method, rec.f.Path = l.Method, l.Path
	if rec.f.Method == "" || rec.f.Path == "" || rec.f.Path[0] != '/' {
		return fmt.Errorf("json: method %q, path %q: want both", clipString(rec.f.Method), clipString(rec.f.Path))
	}
	if len(l.Status) > 0 {
		rec.status = status(l.Status)
	}
	if d, ok := seconds(l.Duration); ok {
		rec.duration = d
	}
	// Kinds in a fixed order: the headers' backing array keeps the first ones, and a replay
	// must not depend on map order.
	for _, kind := range slices.Sorted(maps.Keys(l.Keys)) {
		if v := jsonText(l.Keys[kind]); v != "" {
			setKind(rec, kind, v)
		}
	}
	// A line without keys (none configured) charges global policies only.
	rec.pseudonymous = true
	return nil
}

// jsonText is raw's value when it is a JSON string, and "" for anything else.
func jsonText(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
