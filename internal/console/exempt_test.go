package console

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// boundedConsole is newTestConsole's console with at most three live exemptions, its audit
// lines recorded, on this replica alone (shared false) or on a shared store.
func boundedConsole(t *testing.T, shared bool) (*Console, http.Handler, *observer.ObservedLogs) {
	t.Helper()
	c, _, _, _ := newTestConsole(t, "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", "")
	core, logs := observer.New(zap.InfoLevel)
	c.o.Logger, c.o.MaxExemptions = zap.New(core), 3
	if shared {
		c.o.Shared = &memShared{}
	}
	return c, c.Handler(), logs
}

func exemptBody(key string) map[string]any {
	return map[string]any{"policy": "p", "key": key, "unlimited": true, "expires_in": "1h"}
}

// The console bounds what an exemption may hold on every store: admin.max_exemptions live
// exemptions (past it a 409 naming the bound), a reason of 1 KB (past it a 400 naming the
// bound), and a delete of an id that does not exist answers 404 and writes no audit line.
func TestExemptionBounds(t *testing.T) {
	for _, shared := range []bool{false, true} {
		name := "this replica"
		if shared {
			name = "shared"
		}
		t.Run(name, func(t *testing.T) {
			_, h, logs := boundedConsole(t, shared)
			for i, key := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"} {
				if code, body := call(t, h, http.MethodPost, "/v1/exemptions", testToken, exemptBody(key)); code != http.StatusCreated {
					t.Fatalf("exemption %d of 3: %d %s, want 201", i+1, code, body)
				}
			}
			code, body := call(t, h, http.MethodPost, "/v1/exemptions", testToken, exemptBody("192.0.2.4"))
			if code != http.StatusConflict || !strings.Contains(body, "admin.max_exemptions") || !strings.Contains(body, `"status":409`) {
				t.Fatalf("the 4th exemption at max 3: %d %s, want 409 naming admin.max_exemptions", code, body)
			}
			big := exemptBody("192.0.2.5")
			big["reason"] = strings.Repeat("x", 2048)
			if code, body := call(t, h, http.MethodPost, "/v1/exemptions", testToken, big); code != http.StatusBadRequest || !strings.Contains(body, "1024 bytes") {
				t.Fatalf("a 2 KB reason: %d %s, want 400 naming the 1024-byte bound", code, body)
			}
			if code, body := call(t, h, http.MethodPost, "/v1/keys/p/reset", testToken, map[string]any{"key": "192.0.2.1", "reason": big["reason"]}); code != http.StatusBadRequest || !strings.Contains(body, "1024 bytes") {
				t.Fatalf("a reset with a 2 KB reason: %d %s, want 400 naming the 1024-byte bound", code, body)
			}
			before := logs.FilterField(zap.Bool("audit", true)).Len()
			if code, body := call(t, h, http.MethodDelete, "/v1/exemptions/ex_0123456789abcdef", testToken, nil); code != http.StatusNotFound {
				t.Fatalf("delete of an unknown id: %d %s, want 404", code, body)
			}
			if after := logs.FilterField(zap.Bool("audit", true)).Len(); after != before {
				t.Fatalf("delete of an unknown id wrote %d audit lines, want none", after-before)
			}
		})
	}
}

// An exemption's limit obeys a policy's bounds, with the message a policy gets: a burst of
// 2^63-1 (which acted as unlimited) and a burst that takes longer than a policy may to refill
// are refused.
func TestExemptionLimitBoundsAreAPolicys(t *testing.T) {
	_, h, _ := boundedConsole(t, false)
	for _, tc := range []struct{ rate, burst string }{
		{"10/s", "9223372036854775807"},
		{"1/h", "100000000"},
	} {
		yaml := "upstream: http://127.0.0.1:1\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: " + tc.rate + ", burst: " + tc.burst + "}\n"
		noEnv := func(string) string { return "" }
		cfg, err := policy.Parse([]byte(yaml), policy.LoadOptions{Getenv: noEnv})
		if err == nil {
			err = cfg.Validate(noEnv)
		}
		if err == nil {
			t.Fatalf("a policy with rate %s, burst %s is valid", tc.rate, tc.burst)
		}
		msg := err.Error()
		want := msg[strings.Index(msg, ".burst")+1:] // `burst: "...": must be ...`, less the path
		burst, _ := strconv.ParseInt(tc.burst, 10, 64)
		body := map[string]any{"policy": "p", "key": "192.0.2.9", "limit": map[string]any{"rate": tc.rate, "burst": burst}, "expires_in": "1h"}
		code, got := call(t, h, http.MethodPost, "/v1/exemptions", testToken, body)
		var p struct{ Detail string }
		_ = json.Unmarshal([]byte(got), &p)
		if code != http.StatusBadRequest || !strings.Contains(p.Detail, want) {
			t.Errorf("exemption with rate %s, burst %s: %d %s, want 400 with the policy's %q", tc.rate, tc.burst, code, got, want)
		}
	}
}
