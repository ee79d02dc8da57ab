package policy

// Spellings that upstreams read as something the gateway judges: a path that starts with "//",
// the names frameworks read as the access_token query parameter, and the spellings of one
// Authorization credential. docs/algorithms.md has the table of upstreams.

import (
	"strings"
	"unicode/utf8"
)

// authorityPath reports whether the (decoded) request path starts with two slashes, counting
// '\' as one (the WHATWG URL parser does, for http URLs) and skipping the tabs and line breaks
// that parser removes: Node's `new URL(req.url, base)` and Python's urlsplit read what follows
// as a host, while the gateway would merge the slashes.
//
// A path that does not start with '/' is judged as CanonicalPath roots it ("x" as "/x"), so
// that a path and its canonical form are refused alike: "\n/" is "/\n/".
func authorityPath(p string) bool {
	if p == "" {
		return false
	}
	i := 1
	if p[0] != '/' {
		i = 0
	}
	for ; i < len(p); i++ {
		switch p[i] {
		case '\t', '\n', '\r':
		case '/', '\\':
			return true
		default:
			return false
		}
	}
	return false
}

// mayNameToken reports, in one pass and without allocating, whether a raw query may hold a
// parameter that some framework reads as access_token: one whose name holds "token" in any
// case, a percent escape, or a byte beyond ASCII (a Unicode letter that folds to one of
// "token"'s, such as the Kelvin sign K). Others need no parsing.
func mayNameToken(q string) bool {
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '%' || c >= utf8.RuneSelf:
			return true
		case (c == 't' || c == 'T') && len(q)-i >= 5 && strings.EqualFold(q[i:i+5], "token"):
			return true
		}
	}
	return false
}

// isAccessTokenName reports whether a decoded query parameter name is read as access_token by
// some mainstream framework:
//
//   - ASP.NET Core compares query keys case-insensitively (Unicode folds too: acceſs_token);
//   - PHP drops leading spaces and turns ' ', '.' and a '[' without a closing ']' into '_'
//     (access.token, access+token, access[token), cuts the name at a NUL byte, and reads
//     access_token[] or access_token[x] as an access_token array;
//   - Rack (Rails) reads access_token[] as an array under access_token too.
//
// Percent-encoded names and '+' for a space were decoded by url.ParseQuery before.
func isAccessTokenName(k string) bool {
	const want = "access_token"
	if len(k) < len(want) {
		return false
	}
	if k == want {
		return true
	}
	if i := strings.IndexByte(k, 0); i >= 0 {
		k = k[:i]
	}
	k = strings.TrimLeft(k, " ")
	var b []byte
	b = appendFolded(b, k)
	for i, c := range b {
		switch c {
		case ' ', '.':
			b[i] = '_'
		case '[':
			if strings.IndexByte(string(b[i:]), ']') < 0 {
				b[i] = '_'
			}
		}
	}
	n := string(b)
	return n == want || strings.HasPrefix(n, want+"[")
}

// normalCredential is an Authorization (or Proxy-Authorization) value as one credential:
// `scheme SP credentials`, with the scheme in the case its registry spells it (first letter
// upper, the rest lower: Bearer, Basic) and the whitespace around and between the two cut to
// one space. RFC 9110 makes the scheme case-insensitive and servers split on any run of
// whitespace, so `bearer K`, `BEARER K`, `Bearer  K` and "Bearer\tK" are all the credential
// `Bearer K`: as an api key, every spelling is one key. A value that is already normal is
// returned as is, without allocating.
func normalCredential(v string) string {
	t := trimOWS(v)
	i := strings.IndexAny(t, " \t")
	if i < 0 {
		return t // a bare token
	}
	scheme, cred := t[:i], trimOWS(t[i:])
	if t == v && cred == t[i+1:] && t[i] == ' ' && titleCase(scheme) {
		return v
	}
	b := make([]byte, 0, len(scheme)+1+len(cred))
	for j := 0; j < len(scheme); j++ {
		c := lowerASCII(scheme[j])
		if j == 0 && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		b = append(b, c)
	}
	b = append(b, ' ')
	b = append(b, cred...)
	return string(b)
}

// titleCase reports whether s is in normalCredential's case: no lower-case first letter and no
// upper-case letter after it.
func titleCase(s string) bool {
	if s != "" && 'a' <= s[0] && s[0] <= 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return false
		}
	}
	return true
}

// isCredentialHeader reports whether canonical names the header that carries `scheme
// credentials` (RFC 9110 §11.6.2): its key value is judged as normalCredential gives it.
// (Proxy-Authorization carries them too, but the gateway removes it before forwarding, and
// validation refuses a key on it.)
func isCredentialHeader(canonical string) bool { return canonical == "Authorization" }
