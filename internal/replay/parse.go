package replay

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unsafe"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Format is a log format that replay reads.
type Format uint8

// The formats. Auto picks one per line: `{` starts a JSON line of the gateway, a first field
// that is an ALB request type followed by an ISO 8601 time an ALB line, anything else a
// combined one.
const (
	Auto     Format = iota
	Combined        // nginx / Apache "combined", optionally followed by extra fields (KeyFields)
	ALB             // AWS Application Load Balancer access logs
	Gateway         // the gateway's own access log (log.access)
)

var formatNames = [...]string{Auto: "auto", Combined: "combined", ALB: "alb", Gateway: "json"}

func (f Format) String() string {
	if int(f) < len(formatNames) {
		return formatNames[f]
	}
	return fmt.Sprintf("Format(%d)", f)
}

// ParseFormat reads a --format value: auto, combined, alb or json.
func ParseFormat(s string) (Format, error) {
	for f, n := range formatNames {
		if s == n {
			return Format(f), nil
		}
	}
	return 0, fmt.Errorf("format %q: must be auto, combined, alb or json", s)
}

// errSkip marks a line that is well-formed but no request: another line of the gateway's own log
// (startup, reload, sampled warnings), or an empty line.
var errSkip = errors.New("not a request line")

// record is one parsed request. Its strings point into the line (see view) and are valid only
// until the next line is read.
type record struct {
	t        int64 // unix nanoseconds
	coarse   bool  // t has a resolution of one second (see Replayer's spreading)
	status   int   // the answer's status; 0 when unknown
	duration int64 // how long the answer took (ns); 0 when unknown
	f        policy.Fields
	// pseudonymous: the key values are pseudonyms already (the gateway's log), shown as they
	// are instead of being turned into pseudonyms.
	pseudonymous bool
	headers      [4]policy.KindValue // backing store of f.Headers
}

// view returns b as a string without copying. The string aliases the line buffer, which the
// reader reuses for the next line: it is valid while the line is processed, and anything kept
// longer (the top keys) is cloned. This saves an allocation per field at a million lines a
// second.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// parser reads one line into rec, or returns an error (errSkip for lines that are no request).
type parser struct {
	format    Format
	keyFields []string // the kinds of the extra fields after combined's user agent ("" skips one)
	scratch   []byte   // unescaped paths
	// The last combined timestamp parsed, and its value.
	lastTS [26]byte
	lastT  int64
	lastOK bool
}

func (p *parser) parse(line []byte, rec *record) error {
	line = bytes.TrimRight(line, "\r")
	if len(bytes.TrimSpace(line)) == 0 {
		return errSkip
	}
	rec.f = policy.Fields{}
	rec.pseudonymous, rec.coarse, rec.status, rec.duration = false, false, 0, 0
	p.scratch = p.scratch[:0]
	switch f := p.format; {
	case f == Gateway || f == Auto && line[0] == '{':
		return p.parseGateway(line, rec)
	case f == ALB || f == Auto && (line[0] == 'h' || line[0] == 'g' || line[0] == 'w') && looksALB(line):
		return p.parseALB(line, rec)
	default:
		return p.parseCombined(line, rec)
	}
}

// field reads one space-separated field of a line: a quoted string (backslash escapes kept
// as written, which is fine for the fields read here) or a bare word. It returns the field
// without its quotes and the rest after the separating blanks.
func field(s []byte) (f, rest []byte, ok bool) {
	if len(s) == 0 {
		return nil, nil, false
	}
	if s[0] == '"' {
		// The closing quote is the first one not escaped by an odd run of backslashes.
		i := 1
		for {
			j := bytes.IndexByte(s[i:], '"')
			if j < 0 {
				return nil, nil, false
			}
			i += j
			bs := 0
			for k := i - 1; k > 0 && s[k] == '\\'; k-- {
				bs++
			}
			if bs%2 == 0 {
				break
			}
			i++
		}
		return s[1:i], skipBlanks(s[i+1:]), true
	}
	i := bytes.IndexByte(s, ' ')
	if i < 0 {
		return s, nil, true
	}
	return s[:i], skipBlanks(s[i+1:]), true
}

func skipBlanks(s []byte) []byte {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	return s
}

// parseCombined reads `$remote_addr - $remote_user [$time_local] "$request" $status
// $body_bytes_sent "$http_referer" "$http_user_agent"` and then one extra field per
// keyFields entry.
func (p *parser) parseCombined(line []byte, rec *record) error {
	addr, rest, _ := field(line)
	a, err := netip.ParseAddr(view(addr))
	if err != nil {
		return fmt.Errorf("combined: remote address %q: not an IP address", clip(addr))
	}
	rec.f.Client = a
	// ident and remote user.
	if _, rest, _ = field(rest); len(rest) == 0 {
		return errors.New("combined: line ends after the remote address")
	}
	if _, rest, _ = field(rest); len(rest) == 0 || rest[0] != '[' {
		return errors.New("combined: no [time] after the remote user")
	}
	end := bytes.IndexByte(rest, ']')
	if end < 0 {
		return errors.New("combined: [time] is not closed")
	}
	ts := rest[1:end]
	if !p.lastOK || !bytes.Equal(ts, p.lastTS[:]) {
		// Most lines share their second with the line before: parse each second once.
		t, ok := parseCLFTime(ts)
		if !ok {
			p.lastOK = false
			return fmt.Errorf("combined: time %q: want 02/Jan/2006:15:04:05 -0700", clip(ts))
		}
		copy(p.lastTS[:], ts) // parseCLFTime accepts exactly len(lastTS) bytes
		p.lastT, p.lastOK = t, true
	}
	rec.t, rec.coarse = p.lastT, true
	rest = skipBlanks(rest[end+1:])
	if len(rest) == 0 || rest[0] != '"' {
		return errors.New(`combined: no "request" after the time`)
	}
	req, rest, ok := field(rest)
	if !ok {
		return errors.New("combined: request is not closed")
	}
	if err := p.requestLine(req, rec); err != nil {
		return fmt.Errorf("combined: %w", err)
	}
	// status, bytes, referer, user agent: present in combined, absent in common.
	for i := range 4 {
		var v []byte
		if v, rest, ok = field(rest); !ok {
			if len(p.keyFields) > 0 {
				return errors.New("combined: line ends before the extra key fields")
			}
			return nil
		}
		if i == 0 {
			rec.status = status(v)
		}
	}
	for _, kind := range p.keyFields {
		var v []byte
		if v, rest, ok = field(rest); !ok {
			return fmt.Errorf("combined: no extra field for %s", kindLabel(kind))
		}
		if kind == "" || len(v) == 0 || (len(v) == 1 && v[0] == '-') {
			continue // skipped column, or nginx's "-" for an empty variable
		}
		if kind == kindDuration {
			d, ok := seconds(v)
			if !ok {
				return fmt.Errorf("combined: duration %q: want seconds such as 0.125", clip(v))
			}
			rec.duration = d
			continue
		}
		setKind(rec, kind, view(v))
	}
	return nil
}

// kindDuration is the --key-field entry of a column holding the request's duration in seconds
// (nginx $request_time), which concurrency and charge_on policies need.
const kindDuration = "duration"

// status reads a three-digit status code; anything else is 0 (unknown).
func status(b []byte) int {
	if n, ok := num(b); ok && len(b) == 3 {
		return n
	}
	return 0
}

// seconds reads a non-negative decimal number of seconds (0.125, 3, 1e-3) as nanoseconds.
func seconds(b []byte) (int64, bool) {
	f, err := strconv.ParseFloat(view(b), 64)
	if err != nil || f < 0 || f > 1e6 || f != f {
		return 0, false
	}
	return int64(f * 1e9), true
}

func kindLabel(kind string) string {
	if kind == "" {
		return "a skipped column"
	}
	return kind
}

// setKind stores a key value of the given kind.
func setKind(rec *record, kind, v string) {
	switch kind {
	case "ip":
		rec.f.IP = v
	case "api_key":
		rec.f.APIKey = v
	case "user":
		rec.f.User = v
	default:
		if len(rec.f.Headers) < len(rec.headers) {
			rec.f.Headers = rec.headers[:len(rec.f.Headers)+1]
			rec.f.Headers[len(rec.f.Headers)-1] = policy.KindValue{Kind: kind, Value: v}
		}
	}
}

// requestLine reads `METHOD TARGET PROTOCOL` (the protocol may be missing, as in HTTP/0.9
// lines). TARGET is a path or an absolute URL (ALB); the query is dropped and the path is
// percent-decoded, as net/http decodes URL.Path, which the gateway matches.
func (p *parser) requestLine(req []byte, rec *record) error {
	sp := bytes.IndexByte(req, ' ')
	if sp <= 0 {
		return fmt.Errorf("request %q: want METHOD TARGET PROTOCOL", clip(req))
	}
	method := req[:sp]
	for _, c := range method {
		if c < 'A' || c > 'Z' {
			return fmt.Errorf("request %q: method is not an upper-case token", clip(req))
		}
	}
	target := req[sp+1:]
	if i := bytes.IndexByte(target, ' '); i >= 0 {
		target = target[:i]
	}
	if i := bytes.Index(target, []byte("://")); i >= 0 && target[0] != '/' {
		// An absolute URL: drop the scheme and authority.
		rest := target[i+3:]
		j := bytes.IndexByte(rest, '/')
		if j < 0 {
			target = []byte("/")
		} else {
			target = rest[j:]
		}
	}
	if i := bytes.IndexAny(target, "?#"); i >= 0 {
		target = target[:i]
	}
	if len(target) == 0 || (target[0] != '/' && !(len(target) == 1 && target[0] == '*')) {
		return fmt.Errorf("request %q: target is not a path", clip(req))
	}
	rec.f.Method = view(method)
	if bytes.IndexByte(target, '%') < 0 {
		rec.f.Path = view(target)
		return nil
	}
	start := len(p.scratch)
	for i := 0; i < len(target); i++ {
		c := target[i]
		if c == '%' && i+2 < len(target) && ishex(target[i+1]) && ishex(target[i+2]) {
			c = unhex(target[i+1])<<4 | unhex(target[i+2])
			i += 2
		}
		p.scratch = append(p.scratch, c)
	}
	rec.f.Path = view(p.scratch[start:])
	return nil
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// albTypes are the first fields of ALB log lines.
var albTypes = []string{"http", "https", "h2", "grpcs", "ws", "wss"}

func looksALB(line []byte) bool {
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 || sp+11 > len(line) {
		return false
	}
	typ := view(line[:sp])
	known := false
	for _, t := range albTypes {
		if typ == t {
			known = true
			break
		}
	}
	t := line[sp+1:]
	return known && isDigit(t[0]) && t[4] == '-' && t[10] == 'T'
}

// parseALB reads an ALB access log entry: `type time elb client:port target:port
// request_processing_time target_processing_time response_processing_time elb_status_code
// target_status_code received_bytes sent_bytes "request" "user_agent" ... request_creation_time
// ...`. The clock is request_creation_time (field 22) when the line has it, else time (when the
// response was sent).
func (p *parser) parseALB(line []byte, rec *record) error {
	var fields [22][]byte
	rest := line
	n := 0
	for n < len(fields) {
		f, r, ok := field(rest)
		if !ok {
			break
		}
		fields[n], rest = f, r
		n++
		if len(rest) == 0 {
			break
		}
	}
	if n < 13 {
		return fmt.Errorf("alb: %d fields, want at least 13", n)
	}
	t, ok := parseISOTime(fields[1])
	if !ok {
		return fmt.Errorf("alb: time %q: want 2006-01-02T15:04:05.000000Z", clip(fields[1]))
	}
	if n == len(fields) {
		if ct, ok := parseISOTime(fields[21]); ok {
			t = ct
		}
	}
	rec.t = t
	client := fields[3]
	if i := bytes.LastIndexByte(client, ':'); i > 0 {
		client = client[:i]
	}
	client = bytes.TrimSuffix(bytes.TrimPrefix(client, []byte("[")), []byte("]"))
	a, err := netip.ParseAddr(view(client))
	if err != nil {
		return fmt.Errorf("alb: client %q: not an IP address and port", clip(fields[3]))
	}
	rec.f.Client = a
	if err := p.requestLine(fields[12], rec); err != nil {
		return fmt.Errorf("alb: %w", err)
	}
	rec.status = status(fields[8]) // elb_status_code: what the client got
	// request, target and response processing times; -1 when not applicable.
	for _, f := range fields[5:8] {
		if d, ok := seconds(f); ok {
			rec.duration += d
		}
	}
	return nil
}

// clip shortens a value quoted in an error message; unparseable lines can be arbitrarily long
// and must not flood the report.
func clip(b []byte) string {
	const max = 40
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

// clipString is clip for strings.
func clipString(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// validKind reports whether kind is a key kind that --key-field accepts.
func validKind(kind string) bool {
	switch kind {
	case "api_key", "user", kindDuration, "":
		return true
	}
	name, ok := strings.CutPrefix(kind, "header:")
	return ok && name != "" && !strings.ContainsAny(name, " \t:")
}

// ParseKeyFields reads a --key-field value: a comma-separated list of the kinds of the extra
// fields that follow the combined format's user agent, in order: api_key, user, header:NAME,
// duration (seconds, as nginx's $request_time) or "-" for a field to skip. The client address is always $remote_addr (behind a load balancer,
// nginx's real_ip module makes it the client's).
func ParseKeyFields(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "-" {
			k = ""
		} else if k == "" {
			return nil, fmt.Errorf("key field %q: empty entry (use - to skip a column)", s)
		}
		if n, ok := strings.CutPrefix(k, "header:"); ok {
			k = "header:" + strings.ToLower(n)
		}
		if !validKind(k) {
			return nil, fmt.Errorf("key field %q: must be api_key, user, header:NAME, duration or -", k)
		}
		out = append(out, k)
	}
	return out, nil
}
