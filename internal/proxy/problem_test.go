package proxy

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "per-ip", `a"b\c`, "tab\tnl\n\x00", "ünï", "\xff\xfe", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSONString(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("appendJSONString(%q) = %s: not JSON: %v", s, b, err)
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
	writeProblem(rec, nil, problem{Type: problemRateLimited, Status: 429, Policy: `we"ird`, RetryAfter: 12})
	var p map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %s: %v", rec.Body.Bytes(), err)
	}
	want := map[string]any{
		"type": problemRateLimited, "title": "Too Many Requests", "status": 429.0,
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
	if got := rec.Header().Get("Retry-After"); got != "12" {
		t.Errorf("Retry-After = %q, want 12", got)
	}
}
