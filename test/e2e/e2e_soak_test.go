package e2e

// The soak: minutes of load against a flapping upstream and a configuration that keeps being
// reloaded. It runs only with RATELIMIT_SOAK=1 (`make soak`); RATELIMIT_SOAK_DURATION sets its
// length (default 2m).

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/faultnet"
)

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	if os.Getenv("RATELIMIT_SOAK") != "1" {
		t.Skip("soak test: set RATELIMIT_SOAK=1 (make soak)")
	}
	d := 2 * time.Minute
	if s := os.Getenv("RATELIMIT_SOAK_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("RATELIMIT_SOAK_DURATION: %v", err)
		}
	}
	return d
}

// useReleaseBuild points the gateway helpers at a binary built without the race detector for the
// rest of the test: the race runtime's own memory grows with every goroutine ever started, which
// would hide (or fake) a leak of the gateway's. RATELIMIT_SOAK_RACE=1 keeps the race build.
func useReleaseBuild(t *testing.T) {
	t.Helper()
	if os.Getenv("RATELIMIT_SOAK_RACE") == "1" {
		return
	}
	out := filepath.Join(t.TempDir(), "ratelimit-proxy")
	build := exec.Command("go", "build", "-trimpath", "-o", out, "../../cmd/ratelimit-proxy")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, msg)
	}
	raceBinary := binary
	binary = out
	t.Cleanup(func() { binary = raceBinary })
}

// TestSoakFlappingUpstream keeps 16 clients busy while the upstream cycles through healthy,
// refusing, resetting, slow and stalled every two seconds and the policies are reloaded every
// three. It samples the gateway's goroutines and resident memory and checks that neither grows,
// that every answer is one the fault in force explains, and that the count stays exact.
func TestSoakFlappingUpstream(t *testing.T) {
	d := soakDuration(t)
	useReleaseBuild(t)
	const limit = 1_000_000_000
	policy := func(ietf bool) string {
		return fmt.Sprintf("headers:\n  ietf_draft: %v\npolicies:\n  - name: count\n    key: global\n    algorithm: fixed_window\n    limit: %d\n    window: 168h\n", ietf, limit)
	}
	up := newUpstream(t, nil)
	fn, via := faultProxy(t, up.URL)
	g := startGateway(t, via, policy(false))
	c := newClient(t, 500*time.Millisecond) // a stalled upstream is abandoned after 500ms

	var (
		sent, ok, bad502, timeouts atomic.Int64
		stop                       = make(chan struct{})
		wg                         sync.WaitGroup
		errMu                      sync.Mutex
		unexplained                []string
	)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				a := fetch(c, g.proxy+"/")
				sent.Add(1)
				switch {
				case a.err == nil && a.status == 200:
					ok.Add(1)
				case a.err == nil && a.status == http.StatusBadGateway:
					bad502.Add(1)
				case a.err != nil && strings.Contains(a.err.Error(), "Client.Timeout"):
					timeouts.Add(1)
				default:
					errMu.Lock()
					if len(unexplained) < 20 {
						unexplained = append(unexplained, fmt.Sprintf("%d %v", a.status, a.err))
					}
					errMu.Unlock()
				}
			}
		}()
	}

	faults := []func(){
		func() { fn.Set(faultnet.Fault{}) },
		func() { fn.Refuse() },
		func() { _ = fn.Listen(); fn.Set(faultnet.Fault{Mode: faultnet.Reset}) },
		func() { fn.Set(faultnet.Fault{Delay: 50 * time.Millisecond}) },
		func() { fn.Set(faultnet.Fault{Mode: faultnet.Stall}) },
	}
	type sample struct {
		at         time.Duration
		goroutines float64
		rss        float64
		heap       float64
	}
	var samples []sample
	start := time.Now()
	faultTick := time.NewTicker(2 * time.Second)
	reloadTick := time.NewTicker(3 * time.Second)
	sampleTick := time.NewTicker(10 * time.Second)
	end := time.NewTimer(d)
	defer faultTick.Stop()
	defer reloadTick.Stop()
	defer sampleTick.Stop()
	for i, r := 0, 0; ; {
		select {
		case <-faultTick.C:
			i++
			faults[i%len(faults)]()
			continue
		case <-reloadTick.C:
			r++
			g.rewrite(t, via, policy(r%2 == 1))
			continue
		case <-sampleTick.C:
			samples = append(samples, sample{time.Since(start).Round(time.Second),
				metric(t, g.admin, "go_goroutines"), metric(t, g.admin, "process_resident_memory_bytes"),
				metric(t, g.admin, "go_memstats_heap_inuse_bytes")})
			continue
		case <-end.C:
		}
		break
	}
	close(stop)
	wg.Wait()
	if err := fn.Listen(); err != nil {
		t.Fatal(err)
	}
	fn.Set(faultnet.Fault{})
	c.CloseIdleConnections()

	for _, s := range samples {
		t.Logf("t=%v goroutines %v RSS %.1f MiB heap in use %.1f MiB", s.at, s.goroutines, s.rss/(1<<20), s.heap/(1<<20))
	}
	t.Logf("%v: %d requests, %d answered 200, %d answered 502, %d abandoned on a stalled upstream; %v reloads",
		d, sent.Load(), ok.Load(), bad502.Load(), timeouts.Load(), metric(t, g.admin, `ratelimit_config_reloads_total{result="success"}`))
	for _, u := range unexplained {
		t.Errorf("answer no fault explains: %s", u)
	}
	if len(samples) >= 3 {
		// The first sample is the warm-up; after it the process must not keep growing.
		first, last := samples[1], samples[len(samples)-1]
		if growth := last.heap - first.heap; growth > 16<<20 {
			t.Errorf("heap in use grew by %.1f MiB from %v to %v, want under 16 MiB", growth/(1<<20), first.at, last.at)
		}
		if growth := last.rss - first.rss; growth > 32<<20 {
			t.Errorf("RSS grew by %.1f MiB from %v to %v, want under 32 MiB", growth/(1<<20), first.at, last.at)
		}
	}
	eventually(t, "goroutines back to an idle level", func() bool { return metric(t, g.admin, "go_goroutines") < 40 })
	// The store's count equals the admitted decisions exactly; the only requests sent but not
	// counted are ones whose client gave up before the decision (a done context is not charged).
	a := fetch(newClient(t, 5*time.Second), g.proxy+"/")
	allowed := int64(metric(t, g.admin, `ratelimit_requests_total{policy="count",result="allowed"}`))
	if got, want := remaining(t, a), limit-allowed; got != want {
		t.Errorf("after %d admitted requests X-RateLimit-Remaining got %d, want %d", allowed, got, want)
	}
	canceled := int64(metric(t, g.admin, `ratelimit_client_canceled_total{stage="store"}`))
	if uncounted := sent.Load() + 1 - allowed; uncounted < 0 || uncounted > timeouts.Load() {
		t.Errorf("%d requests sent, %d counted: %d uncounted, want between 0 and the %d the clients abandoned", sent.Load()+1, allowed, uncounted, timeouts.Load())
	} else {
		t.Logf("%d requests not counted, all abandoned by their client (%d noticed while the store decided)", uncounted, canceled)
	}
}
