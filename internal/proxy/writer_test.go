package proxy

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/protect"
)

// depthWriter is the writer the handler is given: it counts the proxy package's writers its
// WriteHeader was called through, and whether deadlines and flushes reached it.
type depthWriter struct {
	*httptest.ResponseRecorder
	wrappers  int
	deadlines int
}

func (d *depthWriter) WriteHeader(code int) {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "internal/proxy.(*") && strings.HasSuffix(f.Function, "Writer).WriteHeader") {
			d.wrappers++
		}
		if !more {
			break
		}
	}
	d.ResponseRecorder.WriteHeader(code)
}

func (d *depthWriter) SetWriteDeadline(time.Time) error { d.deadlines++; return nil }

// TestForwardCrossesOneWriter: with everything that needs to know about the answer at once (the
// access log, a concurrency slot to give back, the upstream protection's latency sample, the
// write stall bound), the upstream's answer passes through one of the handler's writers, and
// http.ResponseController (write deadlines) still reaches the server's writer through it.
func TestForwardCrossesOneWriter(t *testing.T) {
	pol := (&fakePolicies{}).add("slots", false, 1)
	pol.charges[0].Limit = bucket.Limit{Algorithm: bucket.Concurrency, Count: 10}
	pol.policies[0].Limit = pol.charges[0].Limit
	slots, err := protect.New(protect.Options{Limit: 4, Adaptive: true, MinLimit: 1, MaxLimit: 8})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{
		Upstream:          mustURL(t, "http://upstream.invalid"),
		Policies:          func() Policies { return pol },
		Limiter:           memstore.New(memstore.Options{}),
		Transport:         staticUpstream{},
		Logger:            zap.NewNop(),
		AccessLog:         true,
		Protect:           &Protection{Slots: slots},
		WriteStallTimeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		w := &depthWriter{ResponseRecorder: httptest.NewRecorder()}
		r := httptest.NewRequest(http.MethodGet, "http://proxy.local/x", nil)
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("status = %d, want 200", w.Code)
		}
		if w.wrappers != 1 {
			t.Errorf("the upstream's answer crossed %d of the handler's writers, want 1", w.wrappers)
		}
		if w.deadlines == 0 {
			t.Error("no write deadline reached the server's writer through the handler's writer")
		}
	}
}
