package answer

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Both front ends of one process count into one series: the second NewCounters on a registry
// reuses the first's collectors.
func TestCountersShareSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewCounters(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCounters(reg)
	if err != nil {
		t.Fatal(err)
	}
	a.Policy("per-ip").Limited.Inc()
	b.Policy("per-ip").Limited.Inc()
	b.Store("memory").Timeout.Inc()
	if got := testutil.ToFloat64(a.requests.WithLabelValues("per-ip", "limited")); got != 2 {
		t.Errorf("limited = %v, want 2 (one series for both)", got)
	}
	if got := testutil.ToFloat64(a.storeErrors.WithLabelValues("memory", "timeout")); got != 1 {
		t.Errorf("store timeouts = %v, want 1", got)
	}
}

func TestCountersConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge( //nolint:promlinter // a gauge of the counter's name, on purpose
		prometheus.GaugeOpts{Name: "ratelimit_release_errors_total", Help: "something else"}))
	if _, err := NewCounters(reg); err == nil {
		t.Fatal("NewCounters over a different collector of the same name: no error")
	}
}

func TestChildrenOncePerLabel(t *testing.T) {
	var made sync.Map
	c := NewChildren(func(label string) *int {
		if _, dup := made.LoadOrStore(label, true); dup {
			t.Errorf("label %q made twice", label)
		}
		return new(int)
	})
	var wg sync.WaitGroup
	got := make([]*int, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = c.Get("x")
		}()
	}
	wg.Wait()
	for _, p := range got {
		if p != got[0] {
			t.Fatal("Get returned different values for one label")
		}
	}
}
