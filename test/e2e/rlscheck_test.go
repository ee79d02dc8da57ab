package e2e

import (
	"strings"
	"testing"
)

// TestRLSCheckCommand calls a running RLS-only gateway with `rls check`: an answer OK with the
// rule's limit and what remains; a peek that consumes nothing; OVER_LIMIT once the rule's one
// request a minute is spent; bad arguments and an address nothing listens on exit 1 naming
// what is wrong.
func TestRLSCheckCommand(t *testing.T) {
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, "", "")
	check := func(args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, append([]string{"rls", "check", "--addr", g.addr, "--domain", "e2e"}, args...)...)
	}

	// The rule counts per minute: a minute's end between the first call and the third starts a
	// new window (its X-Ratelimit-Reset names another instant), and the sequence runs again on
	// a fresh value in the new minute.
	for _, v := range []string{"a", "b"} {
		code, out, errOut := check("per_minute=" + v)
		if code != 0 || !strings.HasPrefix(out, "OK\n") || !strings.Contains(out, "per_minute="+v+": OK, limit 5 per minute, remaining 4, reset in") {
			t.Errorf("a first call: exit %d, printed\n%s%s\nwant OK with limit 5 per minute, remaining 4", code, out, errOut)
		}
		first := resetHeader(out)
		code, peek, _ := check("--peek", "per_minute="+v)
		code2, third, _ := check("per_minute=" + v)
		if resetHeader(third) != first && v == "a" {
			t.Logf("a minute ended during the sequence (reset %s, then %s): again in the new one", first, resetHeader(third))
			continue
		}
		if code != 0 || !strings.Contains(peek, "remaining 4") {
			t.Errorf("a peek: exit %d, printed\n%s\nwant remaining 4 (the peek consumes nothing)", code, peek)
		}
		if code2 != 0 || !strings.Contains(third, "remaining 3") {
			t.Errorf("after the peek: exit %d, printed\n%s\nwant remaining 3", code2, third)
		}
		break
	}
	// A known domain: no warning. An unknown one: answered OK as Envoy's are, and a warning
	// that names it on stderr (stdout stays the answer).
	if _, _, errOut := check("vip=x"); strings.Contains(errOut, "unknown") {
		t.Errorf("a known domain warned: %q", errOut)
	}
	if code, out, errOut := runCLI(t, "rls", "check", "--addr", g.addr, "--domain", "e2e-misspelt", "per_minute=a"); code != 0 ||
		!strings.HasPrefix(out, "OK\n") || !strings.Contains(errOut, `warning: domain "e2e-misspelt" is unknown`) {
		t.Errorf("an unknown domain: exit %d, printed\n%s%s\nwant OK and a warning naming the domain", code, out, errOut)
	}
	var code int
	var out string
	code, out, _ = check("vip=x")
	if code != 0 || !strings.Contains(out, "vip=x: OK, no limit") {
		t.Errorf("an unlimited descriptor: exit %d, printed\n%s", code, out)
	}
	// wild: 1 a minute; the second or (across a minute's end) the third call is over.
	over := false
	for range 3 {
		_, out, _ = check("wild=foo1", "per_hour=b")
		over = over || (strings.HasPrefix(out, "OVER_LIMIT\n") && strings.Contains(out, "wild=foo1: OVER_LIMIT, limit 1 per minute, remaining 0"))
	}
	if !over {
		t.Errorf("three calls of a rule of 1 a minute: none answered OVER_LIMIT; the last printed\n%s", out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"per_minute"}, `entry "per_minute" is not KEY=VALUE`},
		{[]string{"--peek", "--hits", "2", "a=b"}, "--peek with --hits 2"},
	} {
		if code, _, errOut := check(c.args...); code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("rls check %v: exit %d, stderr %q, want 1 and %q", c.args, code, errOut, c.want)
		}
	}
	if code, _, errOut := runCLI(t, "rls", "check", "a=b"); code != 1 || !strings.Contains(errOut, "--domain is required") {
		t.Errorf("no --domain: exit %d, stderr %q", code, errOut)
	}
	free := freePort(t)
	if code, _, errOut := runCLI(t, "rls", "check", "--addr", free, "--domain", "e2e", "--timeout", "2s", "a=b"); code != 1 || !strings.Contains(errOut, "ShouldRateLimit on "+free) {
		t.Errorf("nothing listening: exit %d, stderr %q", code, errOut)
	}
}

// resetHeader is the X-Ratelimit-Reset value that rls check printed ("" when none).
func resetHeader(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "header X-Ratelimit-Reset: "); ok {
			return v
		}
	}
	return ""
}
