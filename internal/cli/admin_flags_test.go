package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeAdmin answers the admin API's policies, top and exemption calls as the console does
// (the console's own handlers are tested in internal/console): enough to see what the CLI sends.
type fakeAdmin struct {
	topCalls, writes atomic.Int32
	token            string
}

func (f *fakeAdmin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/v1/policies":
		_ = json.NewEncoder(w).Encode(map[string]any{"policies": []map[string]any{
			{"name": "per-ip", "algorithm": "token_bucket"}, {"name": "per-api-key", "algorithm": "fixed_window"}}})
	case strings.HasPrefix(r.URL.Path, "/v1/top/"):
		f.topCalls.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]any{{"key": "ip:127.0.0.1", "requests": 7, "limited": 2}}})
	case r.URL.Path == "/v1/exemptions" && r.Method == http.MethodPost:
		f.writes.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"detail":"a write needs the admin token"}`))
			return
		}
		_, _ = w.Write([]byte(`{"id":"x1"}`))
	default:
		http.NotFound(w, r)
	}
}

func runCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errs bytes.Buffer
	code := Run(context.Background(), args, &out, &errs, func(k string) string { return env[k] }, Options{Version: "test"})
	return code, out.String(), errs.String()
}

// TestAdminTopReplicaOnce: the same replica named twice (or with a trailing slash, or another
// case of host) is asked, and counted, once.
func TestAdminTopReplicaOnce(t *testing.T) {
	f := &fakeAdmin{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	code, out, errs := runCLI(t, nil, "admin", "top", "per-ip", "--json", "--replica", srv.URL, "--replica", srv.URL+"/", "--replica", strings.ToUpper(srv.URL[:4])+srv.URL[4:])
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if n := f.topCalls.Load(); n != 1 {
		t.Errorf("asked the replica %d times, want once", n)
	}
	var v struct {
		Replicas int
		Keys     []struct{ Requests int }
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Replicas != 1 || len(v.Keys) != 1 || v.Keys[0].Requests != 7 {
		t.Errorf("got %s, want one replica and its 7 requests", out)
	}
}

// TestAdminExemptNamesMissingFlag: `admin exempt` without a replacement limit says which flag
// the policy needs, and sends nothing.
func TestAdminExemptNamesMissingFlag(t *testing.T) {
	f := &fakeAdmin{token: "t"}
	srv := httptest.NewServer(f)
	defer srv.Close()
	env := map[string]string{"RATELIMIT_ADMIN_TOKEN": "t"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"per-ip", "k"}, "--rate and --burst are missing"},
		{[]string{"per-ip", "k", "--rate", "5/s"}, "--burst is missing"},
		{[]string{"per-api-key", "k"}, "--limit is missing"},
		{[]string{"unknown", "k"}, "give --rate and --burst"},
	} {
		code, _, errs := runCLI(t, env, append([]string{"admin", "exempt", "--admin", srv.URL}, tc.args...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("admin exempt %v: exit %d, %q; want an error with %q", tc.args, code, errs, tc.want)
		}
	}
	if n := f.writes.Load(); n != 0 {
		t.Errorf("%d exemptions sent without a limit", n)
	}
	if code, _, errs := runCLI(t, env, "admin", "exempt", "--admin", srv.URL, "per-ip", "k", "--rate", "5/s", "--burst", "10"); code != 0 || f.writes.Load() != 1 {
		t.Errorf("a complete exemption: exit %d, %s", code, errs)
	}
}

// TestAdmin401NamesTheVariable: a 401 says which variable the token was read from, and that it
// was empty.
func TestAdmin401NamesTheVariable(t *testing.T) {
	f := &fakeAdmin{token: "right"}
	srv := httptest.NewServer(f)
	defer srv.Close()
	args := []string{"admin", "exempt", "--admin", srv.URL, "per-ip", "k", "--unlimited"}
	_, _, errs := runCLI(t, nil, args...)
	if !strings.Contains(errs, "401") || !strings.Contains(errs, "RATELIMIT_ADMIN_TOKEN, which is empty") {
		t.Errorf("with no token: %q; want the 401 to name RATELIMIT_ADMIN_TOKEN and say it is empty", errs)
	}
	_, _, errs = runCLI(t, map[string]string{"OPS_TOKEN": "wrong"}, append(args, "--token-env", "OPS_TOKEN")...)
	if !strings.Contains(errs, "sent the token held by OPS_TOKEN") || strings.Contains(errs, "wrong") {
		t.Errorf("with a wrong token: %q; want the variable named and its value never printed", errs)
	}
}

// TestRoundedSeconds: durations print as a person reads them.
func TestRoundedSeconds(t *testing.T) {
	for in, want := range map[float64]string{1.812345678: "1.8s", 59.96: "1m0s", 0.25: "250ms", 0.0004: "0s", 3: "3s", 1.2000000000000002: "1.2s"} {
		if got := roundedSeconds(in); got != want {
			t.Errorf("roundedSeconds(%v) = %q, want %q", in, got, want)
		}
	}
}
