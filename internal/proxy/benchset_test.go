package proxy

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// benchSetConfig is the configuration of loads (c) and (d) of scripts/bench/bench.sh: its policy
// set is read from the one file the end-to-end loads append to their configs, so the in-process
// benchmark charges exactly what the end-to-end load charges.
func benchSetConfig(b *testing.B) string {
	b.Helper()
	set, err := os.ReadFile(filepath.Join("..", "..", "scripts", "bench", "policyset.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	return "upstream: http://upstream.invalid\n" + string(set)
}

// benchSetHandler is the gateway's handler of loads (c) and (d) in process: the real policy set
// and memory store, an in-memory upstream.
func benchSetHandler(b *testing.B) *Handler {
	b.Helper()
	cfg, err := policy.Parse([]byte(benchSetConfig(b)), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		b.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	h, err := New(Options{
		Upstream:  &url.URL{Scheme: "http", Host: "upstream.invalid"},
		Policies:  func() Policies { return set },
		Limiter:   memstore.New(memstore.Options{}),
		Transport: staticUpstream{},
	})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// BenchmarkHandlerSetOwn_RejectedHot is load (d) in process: the real plan (three policies, the
// hot key's override), the memory store and the 429, into a writer that keeps nothing.
func BenchmarkHandlerSetOwn_RejectedHot(b *testing.B) {
	h := benchSetHandler(b)
	req := httptest.NewRequest(http.MethodGet, "http://proxy.local/", nil)
	req.RemoteAddr = "127.0.0.1:1234"
	req.Header.Set("X-Api-Key", "hot-key")
	w := &discardWriter{h: make(http.Header)}
	h.ServeHTTP(w, req) // the override's one request an hour
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusTooManyRequests {
			b.Fatalf("status = %d, want 429", w.code)
		}
	}
}

// BenchmarkHandlerSet_Admitted is load (c) in process: 10k rotating keys, nothing rejected,
// forwarded to the in-memory upstream.
func BenchmarkHandlerSet_Admitted(b *testing.B) {
	h := benchSetHandler(b)
	reqs := make([]*http.Request, 10000)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "http://proxy.local/", nil)
		reqs[i].RemoteAddr = "127.0.0.1:1234"
		reqs[i].Header.Set("X-Api-Key", "key-"+strconv.Itoa(i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, reqs[i%len(reqs)])
		i++
		if rec.Code != http.StatusOK {
			b.Fatalf("status = %d, want 200", rec.Code)
		}
	}
}
