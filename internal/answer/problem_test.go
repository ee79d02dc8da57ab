package answer

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "per-ip", `a"b\c`, "tab\tnl\n\x00", "ünï", "\xff\xfe", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := AppendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("AppendJSONString(%q) = %s: not JSON: %v", s, b, err)
		}
		if !utf8.ValidString(s) {
			// Invalid bytes become U+FFFD (one per byte, where ToValidUTF8 would merge runs).
			if !utf8.ValidString(got) || strings.ReplaceAll(got, "\ufffd", "") != strings.ReplaceAll(strings.ToValidUTF8(s, ""), "\ufffd", "") {
				t.Errorf("round trip of %q = %q, want the valid runes kept and the rest replaced", s, got)
			}
			return
		}
		if got != s {
			t.Errorf("round trip of %q = %q, want it unchanged", s, got)
		}
	})
}

func TestWriteProblem_RateLimitedBody(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteProblem(rec, nil, Problem{Type: ProblemRateLimited, Status: 429, Policy: `we"ird`, RetryAfter: 12})
	var p map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %s: %v", rec.Body.Bytes(), err)
	}
	want := map[string]any{
		"type": ProblemRateLimited, "title": "Too Many Requests", "status": 429.0,
		"detail": `Rate limit of policy "we"ird" exceeded; retry after 12 seconds.`,
		"policy": `we"ird`, "retry_after_seconds": 12.0,
	}
	for k, v := range want {
		if p[k] != v {
			t.Errorf("%s = %v, want %v", k, p[k], v)
		}
	}
	if len(p) != len(want) {
		t.Errorf("body has %d members, want %d: %v", len(p), len(want), p)
	}
	for h, v := range map[string]string{"Retry-After": "12", "Content-Type": ContentTypeProblem, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
		if got := rec.Header().Get(h); got != v {
			t.Errorf("%s = %q, want %q", h, got, v)
		}
	}
}

// The problem types table of docs/algorithms.md lists every Problem* constant of problem.go
// with the status its comment gives: clients switch on these types.
func TestProblemTypesDocumented(t *testing.T) {
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "problem.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	code := map[string]string{} // type suffix -> status from the constant's comment
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || !strings.HasPrefix(vs.Names[0].Name, "Problem") || vs.Names[0].Name == "ProblemBase" {
			return true
		}
		bin, ok := vs.Values[0].(*ast.BinaryExpr)
		if !ok {
			return true
		}
		lit := bin.Y.(*ast.BasicLit)
		suffix, _ := strconv.Unquote(lit.Value)
		status := ""
		if vs.Comment != nil {
			status = strings.Fields(vs.Comment.Text())[0]
		}
		code[suffix] = strings.TrimSuffix(status, ":")
		return true
	})
	if len(code) < 10 {
		t.Fatalf("found %d problem types in problem.go: the parse is broken", len(code))
	}
	doc, err := os.ReadFile("../../docs/algorithms.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if _, known := code[name]; known {
			documented[name] = strings.Fields(strings.TrimSpace(cells[2]) + " x")[0]
		}
	}
	for name, status := range code {
		if got, ok := documented[name]; !ok {
			t.Errorf("problem type %q (%s) is not in docs/algorithms.md's problem table", name, status)
		} else if got != status {
			t.Errorf("docs/algorithms.md gives %q status %s, the code %s", name, got, status)
		}
	}
}
