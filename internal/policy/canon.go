package policy

import (
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// Route canonicalization: the method and path in the form policies match, so that a request an
// upstream folds into a limited route (post for POST, /API/Login for /api/login, /api;x/login
// for /api/login, //api\login, /x for /x/) is charged by that route's policies. It runs on every
// request: a path that is already canonical is recognised in one pass and not copied, and no
// path is allocated for (Plan writes into its own buffer). docs/algorithms.md has the table of
// upstreams and what each folds.

// methodSet is a set of request methods, one bit per method a policy may list (see methods in
// validate.go), and methodOther for any other.
type methodSet uint16

const (
	methodGet methodSet = 1 << iota
	methodHead
	methodPost
	methodPut
	methodPatch
	methodDelete
	methodConnect
	methodOptions
	methodTrace
	// methodOther is every method no policy can list: it matches only policies without methods.
	methodOther
)

// knownMethods are the methods a policy may list, in bit order.
var knownMethods = [...]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"}

// methodBit is the bit of m, compared case-insensitively: Flask, Django, Rails and others
// upper-case the method before they route, so `post` runs the POST handler.
func methodBit(m string) methodSet {
	for i, k := range knownMethods {
		if m == k {
			return 1 << i
		}
	}
	for i, k := range knownMethods {
		if strings.EqualFold(m, k) {
			return 1 << i
		}
	}
	return methodOther
}

// CanonicalMethod is m as policies match it: a method a policy may list, in upper case, however
// m spells it; any other method unchanged (it matches only policies without methods).
func CanonicalMethod(m string) string {
	if b := methodBit(m); b != methodOther {
		for i := range knownMethods {
			if b == 1<<i {
				return knownMethods[i]
			}
		}
	}
	return m
}

// methodsOf is the set of methods a policy (or cost entry) lists; 0 means any method. A list
// with GET also holds HEAD (see matchMethods).
func methodsOf(listed []string) methodSet {
	var s methodSet
	for _, m := range matchMethods(listed) {
		s |= methodBit(m)
	}
	return s
}

// Method-override headers: Express's method-override, Laravel, Symfony, Rails (Rack),
// ASP.NET Core and Google's APIs run the handler of the method these name instead of the
// request's own.
var overrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// overrideMethods is the set of methods that the lines of an override header name: every line
// and every comma-separated element (frameworks differ on which one they take).
func overrideMethods(lines []string) methodSet {
	var s methodSet
	for _, line := range lines {
		for line != "" {
			var elem string
			elem, line, _ = strings.Cut(line, ",")
			if elem = trimOWS(elem); elem != "" {
				s |= methodBit(elem)
			}
		}
	}
	return s
}

// CanonicalPath is the path as policies match it (see appendCanonPath); fold says whether case
// is folded. dots reports a "." or ".." segment, which the gateway refuses: upstreams
// disagree on it.
func CanonicalPath(p string, fold bool) (canon string, dots bool) {
	if isCanonPath(p, fold) {
		return p, false
	}
	b, dots := appendCanonPath(nil, p, fold)
	return string(b), dots
}

// isCanonPath reports, in one pass and without allocating, whether p is its own canonical form:
// it starts with '/' and has no ';', no '\', no empty, "." or ".." segment but a trailing
// slash, and with fold no upper-case ASCII letter and no byte above 0x7F.
func isCanonPath(p string, fold bool) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == ';' || c == '\\':
			return false
		case c == '/':
			if i+1 < len(p) && p[i+1] == '/' {
				return false
			}
		case c == '.':
			if p[i-1] == '/' { // p[0] is '/', so i >= 1
				end := i + 1
				if end < len(p) && p[end] == '.' {
					end++
				}
				if end == len(p) || p[end] == '/' {
					return false
				}
			}
		case fold && ('A' <= c && c <= 'Z' || c >= utf8.RuneSelf):
			return false
		}
	}
	return true
}

// appendCanonPath appends to dst the canonical form of the (percent-decoded) path p:
//
//   - every segment loses its `;` parameters (Tomcat, Jetty, Spring): /api;x/login is
//     /api/login; the parameters run to the next '/';
//   - then '\' separates segments as '/' does (IIS and ASP.NET);
//   - empty segments go (repeated slashes merge, as nginx and Werkzeug do) but a trailing slash
//     stays;
//   - "." and ".." segments are resolved (and reported: the gateway refuses such a path);
//   - with fold, letters are folded to lower case, Unicode ones too, through upper case first,
//     so that every spelling that a case-insensitive comparison (Express, ASP.NET) takes for
//     the same letter folds alike: ſ to s, K (Kelvin) to k, ı to i;
//   - the result starts with '/' (the empty path is "/").
//
// It is idempotent: a canonical path is its own canonical form.
func appendCanonPath(dst []byte, p string, fold bool) (_ []byte, dots bool) {
	start := len(dst)
	trailing := false
	for i := 0; i <= len(p); {
		j := i + strings.IndexByte(p[i:], '/')
		if j < i {
			j = len(p)
		}
		// The parameters run to the next '/': Tomcat cuts /api;\x/login to /api/login.
		seg := p[i:j]
		if k := strings.IndexByte(seg, ';'); k >= 0 {
			seg = seg[:k]
		}
		for {
			sub, rest, more := strings.Cut(seg, `\`)
			switch sub {
			case "":
				trailing = true
			case ".":
				dots, trailing = true, true
			case "..":
				dots, trailing = true, true
				// Drop the last segment written (nothing above the root).
				k := len(dst)
				for k > start && dst[k-1] != '/' {
					k--
				}
				if k > start {
					k-- // and its slash
				}
				dst = dst[:k]
			default:
				trailing = false
				dst = append(dst, '/')
				if fold {
					dst = appendFolded(dst, sub)
				} else {
					dst = append(dst, sub...)
				}
			}
			if !more {
				break
			}
			seg = rest
		}
		i = j + 1
	}
	if len(dst) == start || trailing {
		dst = append(dst, '/')
	}
	return dst, dots
}

// appendFolded appends s with its letters folded (see appendCanonPath). Bytes that are not
// UTF-8 are kept as they are.
func appendFolded(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, c)
			i++
			continue
		}
		dst = utf8.AppendRune(dst, foldRune(r))
		i += size
	}
	return dst
}

// foldRune is r's case-folded form: lower(upper(r)), repeated until it stays (a handful of
// runes need a second round), so that folding is idempotent.
func foldRune(r rune) rune {
	for range 4 {
		f := unicode.ToLower(unicode.ToUpper(r))
		if f == r {
			break
		}
		r = f
	}
	return r
}

// pathMatcher is a compiled match.path_prefix (or cost entry path_prefix).
type pathMatcher struct {
	prefix string // canonical, folded unless sensitive; "" matches every path
	// bare is the prefix without its trailing slash ("" when it has none, or is "/"): a
	// path_prefix of /x/ also matches /x, which Express, Rails, ASP.NET and Spring serve the
	// same, and Flask and Django redirect to /x/, and /x.json (a format suffix, see match).
	bare      string
	sensitive bool // match.path_case_sensitive
}

func newPathMatcher(prefix string, sensitive bool) pathMatcher {
	if prefix == "" {
		return pathMatcher{sensitive: sensitive}
	}
	canon, _ := CanonicalPath(prefix, !sensitive) // validated: canonical but for case
	m := pathMatcher{prefix: canon, sensitive: sensitive}
	if len(canon) > 1 && canon[len(canon)-1] == '/' {
		m.bare = canon[:len(canon)-1]
	}
	return m
}

// match reports whether the request's canonical path (folded or exact, as the matcher needs)
// has the prefix, or is the prefix without its trailing slash, with or without a format suffix.
func (m *pathMatcher) match(rt *route) bool {
	if m.prefix == "" {
		return true
	}
	p := rt.folded
	if m.sensitive {
		p = rt.exact
	}
	if strings.HasPrefix(p, m.prefix) {
		return true
	}
	if m.bare == "" || !strings.HasPrefix(p, m.bare) {
		return false
	}
	// /x, and /x.json: Rails routes a format suffix (/x(.:format)) and Spring before 5.3 a
	// suffix pattern to the handler of /x.
	rest := p[len(m.bare):]
	return rest == "" || rest[0] == '.' && strings.IndexByte(rest, '/') < 0
}

// route is one request as matchers see it.
type route struct {
	methods methodSet // the request's method, and with method_override judge those it names
	folded  string    // canonical path, case folded
	exact   string    // canonical path, case kept; only when the set has case-sensitive matchers
}

// canonInto returns p's canonical form: p itself when it is canonical already, else written
// at the end of *buf. The string shares *buf's memory: it is valid until *buf is overwritten
// (the next Plan into the same Plan value), and never leaves the planning of one request.
func canonInto(buf *[]byte, p string, fold bool) (canon string, dots bool) {
	if isCanonPath(p, fold) {
		return p, false
	}
	start := len(*buf)
	b, dots := appendCanonPath(*buf, p, fold)
	*buf = b
	return unsafe.String(&b[start], len(b)-start), dots // a canonical path is never empty
}
