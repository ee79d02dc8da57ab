package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// syncBuffer is a log sink safe for the handler's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// accessLine is the access log line as replay and operators read it.
type accessLine struct {
	Logger   string            `json:"logger"`
	Msg      string            `json:"msg"`
	Time     string            `json:"time"`
	Method   string            `json:"method"`
	Path     string            `json:"path"`
	Status   int               `json:"status"`
	Duration *float64          `json:"duration_seconds"`
	Decision string            `json:"decision"`
	Policy   string            `json:"policy"`
	Keys     map[string]string `json:"keys"`
}

const accessConfig = `upstream: http://h
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 1/h, burst: 1}
  - {name: per-key, key: api_key, algorithm: token_bucket, rate: 1/h, burst: 5, match: {path_prefix: /api/}}
`

// accessServer serves a Handler with the real policy set of accessConfig and a memory store,
// logging JSON lines to the returned buffer.
func accessServer(t *testing.T, access bool, ps *policy.Pseudonyms) (*httptest.Server, *syncBuffer) {
	t.Helper()
	cfg, err := policy.Parse([]byte(accessConfig), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	var logs syncBuffer
	enc := zap.NewProductionEncoderConfig()
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&logs), zapcore.DebugLevel))
	tr := NewTransport(0)
	t.Cleanup(tr.CloseIdleConnections)
	h, err := New(Options{
		Upstream:   mustURL(t, up.URL),
		Policies:   func() Policies { return set },
		Limiter:    memstore.New(memstore.Options{}),
		Logger:     log,
		AccessLog:  access,
		Pseudonyms: ps,
		Transport:  tr,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, &logs
}

func accessLines(t *testing.T, logs string) (access []accessLine, other []map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var l accessLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if l.Logger == "access" {
			access = append(access, l)
			continue
		}
		var m map[string]any
		_ = json.Unmarshal(sc.Bytes(), &m)
		other = append(other, m)
	}
	return access, other
}

func TestAccessLog(t *testing.T) {
	ps := policy.NewPseudonyms([]byte(strings.Repeat("p", 32)))
	srv, logs := accessServer(t, true, ps)
	client := srv.Client()
	const rawKey = "sk_live_must_not_appear"
	get := func(path string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("X-Api-Key", rawKey)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	before := time.Now()
	// per-key does not match /public, yet the line carries the api key's pseudonym.
	if code := get("/public?api_key=" + rawKey); code != http.StatusOK {
		t.Fatalf("first request: status %d, want 200", code)
	}
	if code := get("/public"); code != http.StatusTooManyRequests {
		t.Fatalf("second request: status %d, want 429 (per-ip burst 1)", code)
	}
	after := time.Now()

	text := logs.String()
	if strings.Contains(text, rawKey) || strings.Contains(text, "127.0.0.1") {
		t.Errorf("the logs carry a raw key or the client address:\n%s", text)
	}
	access, other := accessLines(t, text)
	if len(access) != 2 {
		t.Fatalf("got %d access lines, want 2:\n%s", len(access), text)
	}
	wantKeys := map[string]string{"ip": ps.Of("ip", "127.0.0.1"), "api_key": ps.Of("api_key", rawKey)}
	for i, want := range []struct {
		status           int
		decision, policy string
	}{{200, "allowed", ""}, {429, "limited", "per-ip"}} {
		l := access[i]
		if l.Msg != AccessMessage || l.Method != "GET" || l.Path != "/public" || l.Status != want.status ||
			l.Decision != want.decision || l.Policy != want.policy {
			t.Errorf("line %d = %+v, want GET /public (no query) status %d decision %s policy %q",
				i, l, want.status, want.decision, want.policy)
		}
		ts, err := time.Parse(time.RFC3339Nano, l.Time)
		if err != nil || ts.Before(before.Add(-time.Microsecond)) || ts.After(after) {
			t.Errorf("line %d time %q (%v): want RFC 3339 between %v and %v", i, l.Time, err, before, after)
		}
		if l.Duration == nil || *l.Duration < 0 || *l.Duration > after.Sub(before).Seconds() {
			t.Errorf("line %d duration_seconds %v: want between 0 and %v", i, l.Duration, after.Sub(before).Seconds())
		}
		if len(l.Keys) != 2 || l.Keys["ip"] != wantKeys["ip"] || l.Keys["api_key"] != wantKeys["api_key"] {
			t.Errorf("line %d keys = %v, want %v", i, l.Keys, wantKeys)
		}
	}
	// The sampled "rate limited" line names the client by the same pseudonym.
	found := false
	for _, m := range other {
		if m["msg"] == "rate limited" {
			found = true
			if m["key"] != wantKeys["ip"] {
				t.Errorf("rate limited line key = %v, want the access line's ip pseudonym %s", m["key"], wantKeys["ip"])
			}
		}
	}
	if !found {
		t.Errorf("no rate limited line:\n%s", text)
	}
}

func TestAccessLogOff(t *testing.T) {
	srv, logs := accessServer(t, false, nil)
	res, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if access, _ := accessLines(t, logs.String()); len(access) != 0 {
		t.Errorf("got %d access lines without log.access, want 0", len(access))
	}
}

func TestStatusWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	sw := &forwardWriter{ResponseWriter: rec}
	sw.WriteHeader(http.StatusEarlyHints) // informational: not the final status
	sw.WriteHeader(http.StatusTeapot)
	sw.WriteHeader(http.StatusOK) // superfluous; net/http ignores it too
	if sw.status != http.StatusTeapot {
		t.Errorf("status = %d, want 418", sw.status)
	}
	sw2 := &forwardWriter{ResponseWriter: httptest.NewRecorder()}
	_, _ = sw2.Write([]byte("x"))
	if sw2.status != http.StatusOK {
		t.Errorf("status after a bare Write = %d, want 200", sw2.status)
	}
	if http.NewResponseController(sw).Flush() != nil {
		t.Error("Flush does not reach the recorder through Unwrap")
	}
}
