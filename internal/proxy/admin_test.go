package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestAdminHandler(t *testing.T) {
	reg := NewRegistry()
	m := NewMetrics(reg)
	m.decision[decLimited].Inc()
	var notReady atomic.Pointer[error]
	srv := httptest.NewServer(AdminHandler(reg, func(ctx context.Context) error {
		if p := notReady.Load(); p != nil {
			return *p
		}
		return ctx.Err()
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	get := func(path string) (int, string) {
		t.Helper()
		res, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	if code, body := get("/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get("/readyz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/readyz = %d %q, want 200 ok", code, body)
	}
	err := errors.New("dynamodb: table ratelimit not found")
	notReady.Store(&err)
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != err.Error() {
		t.Errorf("/readyz not ready = %d %q, want 503 %q", code, body, err.Error())
	}
	code, body := get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d, want 200", code)
	}
	for _, want := range []string{
		`ratelimit_decisions_total{result="limited"} 1`,
		"ratelimit_upstream_duration_seconds_bucket",
		`ratelimit_upstream_errors_total{reason="refused"} 0`,
		"go_goroutines",
		"process_",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, p := range []string{"/", "/metricsx", "/healthz/x", "/debug/pprof/"} {
		if code, _ := get(p); code != http.StatusNotFound {
			t.Errorf("%s = %d, want 404", p, code)
		}
	}
}

func TestAdminHandler_NilReadyIsReady(t *testing.T) {
	rec := httptest.NewRecorder()
	AdminHandler(NewRegistry(), nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("/readyz with nil ready = %d, want 200", rec.Code)
	}
}

func TestNewMetrics_TwiceOnOneRegistryShares(t *testing.T) {
	reg := NewRegistry()
	a, b := NewMetrics(reg), NewMetrics(reg)
	a.decision[decAllowed].Inc()
	b.decision[decAllowed].Inc()
	wantCounter(t, reg, 2, mDecisions, "result", "allowed")
}

func TestMetrics_NoClientLabels(t *testing.T) {
	reg := NewRegistry()
	NewMetrics(reg).policyCounters("per-ip").Allowed.Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	allowed := map[string]bool{"policy": true, "result": true, "backend": true, "reason": true, "stage": true, "protocol": true}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "ratelimit_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if !allowed[l.GetName()] {
					t.Errorf("%s has label %q, want only %v", mf.GetName(), l.GetName(), allowed)
				}
			}
		}
	}
}
