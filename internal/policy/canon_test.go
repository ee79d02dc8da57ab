package policy

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		in, folded, exact string
		dots              bool
	}{
		{"/", "/", "/", false},
		{"", "/", "/", false},
		{"*", "/*", "/*", false},
		{"/api/login", "/api/login", "/api/login", false},
		{"/API/Login", "/api/login", "/API/Login", false},
		{"/api;x/login", "/api/login", "/api/login", false},
		{"/api/login;jsessionid=1", "/api/login", "/api/login", false},
		{"/;x/api/", "/api/", "/api/", false},
		{"/api/;x", "/api/", "/api/", false},
		{"//api//login", "/api/login", "/api/login", false},
		{`\api\login`, "/api/login", "/api/login", false},
		{"/api/login/", "/api/login/", "/api/login/", false},
		{"/public/../api/x", "/api/x", "/api/x", true},
		{"/public/..;/api/x", "/api/x", "/api/x", true},
		{"/a/./b", "/a/b", "/a/b", true},
		{"/a/b/..", "/a/", "/a/", true},
		{"/..", "/", "/", true},
		{"/.well-known/x..y/...", "/.well-known/x..y/...", "/.well-known/x..y/...", false},
		{"/ſtatus/adm\u0131n/\u212Aey", "/status/admin/key", "/ſtatus/adm\u0131n/\u212Aey", false},
		{"/Straße", "/straße", "/Straße", false},
		{"/a\xffB", "/a\xffb", "/a\xffB", false},
	}
	for _, tt := range tests {
		folded, dots := CanonicalPath(tt.in, true)
		exact, _ := CanonicalPath(tt.in, false)
		if folded != tt.folded || exact != tt.exact || dots != tt.dots {
			t.Errorf("CanonicalPath(%q) = %q, %q, dots %v; want %q, %q, dots %v", tt.in, folded, exact, dots, tt.folded, tt.exact, tt.dots)
		}
	}
}

func TestCanonicalMethod(t *testing.T) {
	for in, want := range map[string]string{"GET": "GET", "post": "POST", "pAtCh": "PATCH", "PURGE": "PURGE", "purge": "purge", "": ""} {
		if got := CanonicalMethod(in); got != want {
			t.Errorf("CanonicalMethod(%q) = %q, want %q", in, got, want)
		}
	}
}

// The fast path recognises canonical paths without copying: Plan allocates nothing for them,
// nor (into a reused Plan) for the paths it must fold.
func TestPlanRouteAllocations(t *testing.T) {
	set := mustCompile(t, `upstream: http://h
policies:
  - {name: login, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [POST], path_prefix: /api/login}}
  - {name: files, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {path_prefix: /Files/, path_case_sensitive: true}}
`)
	for _, target := range []string{"/api/login", "/API/Login;x", "//api//login/", "/Files/a"} {
		r := newRequest("POST", target, "192.0.2.1:1")
		var p Plan
		_ = set.Plan(r, &p) // grows the Plan's buffers
		if n := testing.AllocsPerRun(100, func() { _ = set.Plan(r, &p) }); n != 0 {
			t.Errorf("%s: got %v allocations per Plan, want 0", target, n)
		}
	}
}

// TestPlanCaseSensitiveAndMethodOverride: path_case_sensitive keeps case (but still ignores
// parameters and repeated slashes), method_override judge charges by every method named
// (each policy once) and strip judges the method alone and removes the headers.
func TestPlanCaseSensitiveAndMethodOverride(t *testing.T) {
	const policies = `policies:
  - {name: files, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {path_prefix: /Files/, path_case_sensitive: true}}
  - {name: reads, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [GET]}}
  - {name: writes, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [POST, DELETE]}}
`
	judge := mustCompile(t, "upstream: http://h\n"+policies)
	strip := mustCompile(t, "upstream: http://h\nmethod_override: strip\n"+policies)
	tests := []struct {
		set    *Set
		r      *http.Request
		want   []string
		strip  []string
		remain []string
	}{
		{judge, newRequest("GET", "/Files/a", "192.0.2.1:1"), []string{"files", "reads"}, nil, nil},
		{judge, newRequest("GET", "/files/a", "192.0.2.1:1"), []string{"reads"}, nil, nil},
		{judge, newRequest("GET", "/Files;x//a", "192.0.2.1:1"), []string{"files", "reads"}, nil, nil},
		{judge, newRequest("GET", "/Files", "192.0.2.1:1"), []string{"files", "reads"}, nil, nil},
		{judge, newRequest("GET", "/Files.json", "192.0.2.1:1"), []string{"files", "reads"}, nil, nil},
		{judge, newRequest("GET", "/Files.json/x", "192.0.2.1:1"), []string{"reads"}, nil, nil},
		{judge, newRequest("GET", "/Filesx", "192.0.2.1:1"), []string{"reads"}, nil, nil},
		{judge, newRequest("POST", "/x", "192.0.2.1:1", "X-HTTP-Method-Override", "get"), []string{"reads", "writes"}, nil, []string{"X-Http-Method-Override"}},
		{judge, newRequest("PUT", "/x", "192.0.2.1:1", "X-HTTP-Method", "PURGE, delete", "X-Method-Override", "GET", "X-Method-Override", "HEAD"), []string{"reads", "writes"}, nil, nil},
		{judge, newRequest("POST", "/x", "192.0.2.1:1", "X_HTTP_Method_Override", "GET"), []string{"writes"}, []string{"X_http_method_override"}, nil},
		{strip, newRequest("POST", "/x", "192.0.2.1:1", "X-HTTP-Method-Override", "GET", "X-Http-Method", "GET", "x-method-override", "GET"), []string{"writes"},
			[]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}, nil},
	}
	for i, tt := range tests {
		var p Plan
		if err := tt.set.Plan(tt.r, &p); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, pol := range p.Policies {
			got = append(got, pol.Name)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%d: %s %s %v: got policies %v, want %v", i, tt.r.Method, tt.r.URL.Path, tt.r.Header, got, tt.want)
		}
		p.StripUnjudged(tt.r.Header)
		for _, k := range tt.strip {
			if _, ok := tt.r.Header[k]; ok {
				t.Errorf("%d: %s still in the forwarded headers", i, k)
			}
		}
		for _, k := range tt.remain {
			if _, ok := tt.r.Header[k]; !ok {
				t.Errorf("%d: %s removed, want it forwarded (judged)", i, k)
			}
		}
	}
}

// TestPlanUntrustedUserHeaderStripped: the user header of an untrusted peer is not judged and
// StripUnjudged removes it, and its underscore spelling from every peer; a trusted peer's stays.
func TestPlanUntrustedUserHeaderStripped(t *testing.T) {
	set := mustCompile(t, "upstream: http://h\ntrusted_proxies: [10.0.0.0/8]\nidentity: {user_header: X-User-Id}\npolicies:\n"+
		"  - {name: per-user, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n")
	for _, tc := range []struct {
		remote string
		keep   bool
	}{{"192.0.2.1:1", false}, {"10.0.0.1:1", true}} {
		r := newRequest("GET", "/", tc.remote, "X-User-Id", "alice", "X_User_Id", "bob")
		var p Plan
		if err := set.Plan(r, &p); err != nil {
			t.Fatal(err)
		}
		p.StripUnjudged(r.Header)
		if got := r.Header.Get("X-User-Id"); (got == "alice") != tc.keep {
			t.Errorf("from %s: forwarded X-User-Id %q, want kept %v", tc.remote, got, tc.keep)
		}
		if len(r.Header) != map[bool]int{false: 0, true: 1}[tc.keep] {
			t.Errorf("from %s: forwarded headers %v", tc.remote, r.Header)
		}
	}
}

// TestValidatePathPrefixCanonical: a path_prefix that is not canonical but for case is an
// error naming its canonical form; method_override takes judge or strip.
func TestValidatePathPrefixCanonical(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"match: {path_prefix: '/api;x/'}", `policies[0].match.path_prefix: "/api;x/": must be a canonical path ("/api/")`},
		{"match: {path_prefix: '/a//b'}", `policies[0].match.path_prefix: "/a//b": must be a canonical path ("/a/b")`},
		{"match: {path_prefix: '/a/../b'}", `policies[0].match.path_prefix: "/a/../b": must be a canonical path ("/b")`},
		{"costs: [{path_prefix: '/a\\x', cost: 1}]", `policies[0].costs[0].path_prefix: "/a\\x": must be a canonical path ("/a/x")`},
	} {
		_, err := Parse([]byte("upstream: http://h\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, "+tc.yaml+"}\n"), LoadOptions{Getenv: noEnv})
		if err == nil {
			_, err = Compile(mustParse(t, "upstream: http://h\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, "+tc.yaml+"}\n", noEnv), CompileOptions{Getenv: noEnv})
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %s", tc.yaml, err, tc.want)
		}
	}
	if _, err := Compile(mustParse(t, "upstream: http://h\nmethod_override: drop\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", noEnv), CompileOptions{Getenv: noEnv}); err == nil ||
		!strings.Contains(err.Error(), `method_override: "drop": must be judge or strip`) {
		t.Errorf("method_override drop: got %v", err)
	}
	// Case is folded, not refused.
	mustCompile(t, "upstream: http://h\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, match: {path_prefix: /API/}}\n")
}

// upstreamFolds are foldings of a decoded path that upstreams of docs/algorithms.md make
// before they route it (dot segments aside, which the gateway refuses): none may change the
// canonical form. Those that turn '\' into '/' or back only hold for paths without ';' (a
// parameter runs to the next '/', so it swallows backslashes); upstreamViews covers those.
var upstreamFolds = map[string]func(string) string{
	"lower (Express, ASP.NET)": func(p string) string { return mapValidRunes(p, unicode.ToLower) },
	"upper":                    func(p string) string { return mapValidRunes(p, unicode.ToUpper) },
	"ToUpper per rune (.NET OrdinalIgnoreCase)": func(p string) string { return mapValidRunes(p, unicode.ToUpper) },
	"SimpleFold per rune (EqualFold)":           func(p string) string { return mapValidRunes(p, unicode.SimpleFold) },
	"strip ;params (Tomcat, Spring)":            tomcatParams,
	"add ;params":                               func(p string) string { return strings.ReplaceAll(p, "/", ";x/") },
	"merge slashes (nginx, Werkzeug)":           mergeSlashes,
	"double slashes":                            func(p string) string { return strings.ReplaceAll(p, "/", "//") },
	"backslash is slash (IIS)": func(p string) string {
		if strings.Contains(p, ";") {
			return p
		}
		return strings.ReplaceAll(p, `\`, "/")
	},
	"slash is backslash": func(p string) string {
		if strings.Contains(p, ";") {
			return p
		}
		return strings.ReplaceAll(p, "/", `\`)
	},
}

func tomcatParams(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	return strings.Join(segs, "/")
}

func mergeSlashes(p string) string {
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	return p
}

// upstreamViews are the routes upstreams see in a decoded path, in the case they compare it:
// a policy whose prefix the view has (or, for a prefix ending in '/', is without it) is a
// route the upstream may serve, and the gateway must charge it.
var upstreamViews = map[string]func(string) string{
	"as sent (Go, Flask)":   func(p string) string { return p },
	"Tomcat, Spring":        func(p string) string { return mergeSlashes(tomcatParams(p)) },
	"nginx":                 mergeSlashes,
	"Express (insensitive)": func(p string) string { return mapValidRunes(p, unicode.ToLower) },
	"IIS, ASP.NET (insensitive)": func(p string) string {
		return mapValidRunes(strings.ReplaceAll(p, `\`, "/"), unicode.ToUpper)
	},
}

// mapValidRunes applies f to every valid rune of s, keeping bytes that are not UTF-8.
func mapValidRunes(s string, f func(rune) rune) string {
	var b []byte
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[i])
		} else {
			b = utf8.AppendRune(b, f(r))
		}
		i += size
	}
	return string(b)
}

// fuzzSet has case-insensitive and case-sensitive policies on overlapping routes, method lists
// and costs: the matcher as Plan runs it.
const fuzzSet = `upstream: http://h
policies:
  - {name: login, key: global, algorithm: token_bucket, rate: 1/s, burst: 9, match: {methods: [POST], path_prefix: /api/login}}
  - {name: reports, key: global, algorithm: token_bucket, rate: 1/s, burst: 9, match: {methods: [GET], path_prefix: /api/reports/}}
  - {name: files, key: global, algorithm: token_bucket, rate: 1/s, burst: 9, match: {path_prefix: /Files/, path_case_sensitive: true}}
  - {name: strasse, key: global, algorithm: token_bucket, rate: 1/s, burst: 9, match: {path_prefix: /straße/}}
  - name: weighted
    key: global
    algorithm: token_bucket
    rate: 1/s
    burst: 9
    costs:
      - {methods: [DELETE], path_prefix: /api/, cost: 7}
      - {path_prefix: /api/k, cost: 3}
`

// FuzzCanonicalRoute: canonicalization is idempotent and stable under every upstream folding;
// a request is matched (policies and costs) exactly as its canonical method and path are; and
// no path whose raw form has a policy's prefix escapes that policy.
func FuzzCanonicalRoute(f *testing.F) {
	for _, s := range []struct{ method, path, override string }{
		{"POST", "/api/login", ""}, {"post", "/API/LOGIN", ""}, {"GET", "/api;x/reports", ""},
		{"GET", "//api//reports;a=b/", ""}, {"POST", `\api\login`, "GET"}, {"DELETE", "/Files/a", ""},
		{"GET", "/files;/A", "delete, put"}, {"GET", "/STRASSE/x", ""}, {"GET", "/ſtraße/", ""},
		{"PUT", "/a/../b", ""}, {"GET", "/.well-known/..x", ""}, {"PURGE", "/api/k\xff", "post"},
		{"GET", "", ""}, {"OPTIONS", "*", ""}, {"GET", "/\u212Aey/\u0130", ""},
	} {
		f.Add(s.method, s.path, s.override)
	}
	set := mustCompile(f, fuzzSet)
	planOf := func(t *testing.T, method, p, override string) (names []string, costs []int64, err error) {
		r := &http.Request{Method: method, URL: &url.URL{Path: p}, Header: http.Header{}, RemoteAddr: "192.0.2.1:1"}
		if override != "" {
			r.Header["X-Http-Method-Override"] = []string{override}
		}
		var pl Plan
		err = set.Plan(r, &pl)
		for i, pol := range pl.Policies {
			names = append(names, pol.Name)
			costs = append(costs, pl.Charges[i].Cost)
		}
		return names, costs, err
	}
	f.Fuzz(func(t *testing.T, method, p, override string) {
		for _, fold := range []bool{true, false} {
			c, _ := CanonicalPath(p, fold)
			if c2, dots := CanonicalPath(c, fold); c2 != c || dots {
				t.Fatalf("CanonicalPath(%q, %v) = %q, whose canonical form is %q (dots %v): not idempotent", p, fold, c, c2, dots)
			}
			if c == "" || c[0] != '/' {
				t.Fatalf("CanonicalPath(%q, %v) = %q: want a path from the root", p, fold, c)
			}
		}
		if m := CanonicalMethod(method); CanonicalMethod(m) != m || methodBit(m) != methodBit(method) {
			t.Fatalf("CanonicalMethod(%q) = %q: not idempotent or judged differently", method, m)
		}
		canon, dots := CanonicalPath(p, true)
		exact, _ := CanonicalPath(p, false)
		if folded, _ := CanonicalPath(exact, true); folded != canon {
			t.Fatalf("folding %q after canonicalizing gives %q, before %q", p, folded, canon)
		}
		if dots || authorityPath(p) || authorityPath(canon) {
			if _, _, err := planOf(t, method, p, override); err == nil {
				t.Fatalf("%s %q has a dot segment or starts with //: Plan accepted it", method, p)
			}
			return
		}
		for name, u := range upstreamFolds {
			if got, d := CanonicalPath(u(p), true); got != canon && !d {
				t.Errorf("%s: CanonicalPath(%q) = %q, but of %q (as the upstream folds it) %q", name, p, canon, u(p), got)
			}
		}
		names, costs, err := planOf(t, method, p, override)
		if err != nil {
			t.Fatalf("Plan(%s %q): %v", method, p, err)
		}
		cn, cc, _ := planOf(t, CanonicalMethod(method), exact, override)
		if !slices.Equal(names, cn) || !slices.Equal(costs, cc) {
			t.Errorf("%s %q matched %v costs %v; its canonical form %s %q matched %v costs %v",
				method, p, names, costs, CanonicalMethod(method), exact, cn, cc)
		}
		// No escape: for every route an upstream may see in p, every canonical prefix of that
		// route (a path_prefix a policy could have) matches p.
		var rt route
		var buf []byte
		rt.folded, _ = canonInto(&buf, p, true)
		rt.exact, _ = canonInto(&buf, p, false)
		for name, view := range upstreamViews {
			v := view(p)
			if _, d := CanonicalPath(v, false); d || len(v) > 256 {
				continue // quadratic below: long paths are covered by the checks above
			}
			// Express, Rails, ASP.NET, Spring serve /x as /x/: a policy on /x/ holds it.
			candidates := []string{v + "/"}
			for k := 1; k <= len(v); k++ {
				candidates = append(candidates, v[:k])
			}
			for _, pfx := range candidates {
				if pfx[0] != '/' || !utf8.ValidString(pfx) {
					continue
				}
				if c, _ := CanonicalPath(pfx, false); c != pfx {
					continue
				}
				for _, sensitive := range []bool{false, true} {
					if sensitive && strings.Contains(name, "insensitive") {
						continue
					}
					m := newPathMatcher(pfx, sensitive)
					if !m.match(&rt) {
						t.Errorf("%s sees %q in %q; a policy with path_prefix %q (case-sensitive %v) does not match it", name, v, p, pfx, sensitive)
					}
				}
			}
		}
		if override == "" && methodBit(method) == methodPost && len(p) >= len("/api/login") && strings.EqualFold(p[:len("/api/login")], "/api/login") && !slices.Contains(names, "login") {
			t.Errorf("POST %q escaped the login policy (path_prefix /api/login)", p)
		}
		if strings.HasPrefix(p, "/Files/") && !slices.Contains(names, "files") {
			t.Errorf("%s %q escaped the files policy (path_prefix /Files/)", method, p)
		}
	})
}

// BenchmarkPlanRoute is BenchmarkPlan's request spelled in ways the canonical route folds: the
// fast path (already canonical) against the folding one, and a method override.
func BenchmarkPlanRoute(b *testing.B) {
	set := mustCompile(b, planConfig)
	for _, bc := range []struct{ name, method, target, override string }{
		{"canonical", "POST", "/api/orders", ""},
		{"folded", "post", "/API//Orders;jsessionid=1", ""},
		{"override", "POST", "/api/orders", "GET"},
	} {
		r := newRequest(bc.method, bc.target, "10.0.0.1:1234", "X-Forwarded-For", "203.0.113.7, 10.0.0.2",
			"X-Api-Key", "premium", "X-User-Id", "alice", "X-Tenant", "acme")
		if bc.override != "" {
			r.Header.Set("X-HTTP-Method-Override", bc.override)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var p Plan
				for pb.Next() {
					if err := set.Plan(r, &p); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
