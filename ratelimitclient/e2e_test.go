package ratelimitclient_test

// End to end: the real gateway (internal/server.Run, the wiring the binary runs, with a config
// file) over real sockets, in front of a real upstream, and real clients using the Transport.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/server"
	"github.com/ratelimit-proxy/ratelimit-proxy/ratelimitclient"
)

// startGateway runs the gateway with the given policies in front of upstream and returns its
// proxy URL; it is stopped when the test ends.
func startGateway(t *testing.T, upstream, policies string) string {
	t.Helper()
	cfg := fmt.Sprintf("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nupstream: %s\nheaders:\n  ietf_draft: true\n%s", upstream, policies)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- server.Run(ctx, server.Options{
			ConfigPath: path,
			Getenv:     func(string) string { return "" },
			Log:        io.Discard,
			Ready:      func(p, _ net.Addr) { ready <- "http://" + p.String() },
		})
	}()
	select {
	case u := <-ready:
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("gateway: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("gateway did not stop within 10s")
			}
		})
		return u
	case err := <-errc:
		cancel()
		t.Fatalf("gateway stopped before it was ready: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("gateway not ready after 20s")
	}
	return ""
}

// attempt is one request a client sent, as seen on the wire below the retrying transport.
type attempt struct {
	client     int
	sent, recv time.Time
	status     int
	retryAfter string
	rateLimit  string
}

// recorder is the Base of the Transport: it records every attempt of every client.
type recorder struct {
	base http.RoundTripper
	mu   sync.Mutex
	all  []attempt
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	a := attempt{sent: time.Now()}
	a.client, _ = strconv.Atoi(req.Header.Get("X-Client"))
	resp, err := r.base.RoundTrip(req)
	a.recv = time.Now()
	if err == nil {
		a.status, a.retryAfter, a.rateLimit = resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit")
	}
	r.mu.Lock()
	r.all = append(r.all, a)
	r.mu.Unlock()
	return resp, err
}

// byClient returns each client's attempts in the order they were sent.
func (r *recorder) byClient(n int) [][]attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([][]attempt, n)
	for _, a := range r.all {
		out[a.client] = append(out[a.client], a)
	}
	return out
}

// TestHerdReleasedAtOnceComesBackSpreadOut: 20 clients rejected by the gateway at the same
// instant, all told "Retry-After: 1", wait at least that long and then come back spread over
// the jitter window instead of in one synchronised wave.
func TestHerdReleasedAtOnceComesBackSpreadOut(t *testing.T) {
	const clients = 20
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer up.Close()
	gw := startGateway(t, up.URL, `policies:
  - name: everyone
    key: global
    algorithm: token_bucket
    rate: 1/s
    burst: 1
`)

	rec := &recorder{base: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer rec.base.(*http.Transport).CloseIdleConnections()
	// Defaults but for the attempts: each client comes back once, so the retry instants are
	// those of one wave.
	rt, err := ratelimitclient.New(ratelimitclient.Options{Base: rec, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: rt}

	// Open a connection per client first (the answers do not matter: a rejected request takes
	// nothing from the bucket), so the herd's requests leave together instead of each waiting
	// for a new connection.
	var warm sync.WaitGroup
	for range clients {
		warm.Go(func() {
			req, err := http.NewRequest(http.MethodGet, gw+"/warm", nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := rec.base.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	warm.Wait()

	// The one request the bucket holds (if the warm-up did not take it).
	if resp, err := http.Get(gw + "/"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, gw+"/items", nil)
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set("X-Client", strconv.Itoa(i))
			<-release
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	close(release)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("clients not done within 20s")
	}

	var firsts, retries []time.Time
	var waits []time.Duration
	for i, as := range rec.byClient(clients) {
		if len(as) == 0 {
			t.Fatalf("client %d sent nothing", i)
		}
		first := as[0]
		if first.status != http.StatusTooManyRequests {
			// The bucket refills one token a second: a client that is late by that much may be
			// admitted at once, and then it does not belong to the herd.
			if len(as) != 1 || first.status != http.StatusOK {
				t.Errorf("client %d: attempts %+v, want 429 then a retry, or one 200", i, as)
			}
			continue
		}
		if len(as) != 2 {
			t.Errorf("client %d: %d attempts after a 429, want 2", i, len(as))
			continue
		}
		secs, err := strconv.Atoi(first.retryAfter)
		if err != nil || secs < 1 {
			t.Fatalf("client %d: the gateway's 429 has Retry-After %q, want whole seconds >= 1", i, first.retryAfter)
		}
		if first.rateLimit == "" {
			t.Errorf("client %d: the gateway's 429 has no RateLimit header", i)
		}
		waited, floor := as[1].sent.Sub(first.recv), time.Duration(secs)*time.Second
		if waited < floor {
			t.Errorf("client %d came back %v after its 429, before the Retry-After of %v", i, waited, floor)
		}
		waits = append(waits, waited)
		firsts = append(firsts, first.recv)
		retries = append(retries, as[1].sent)
	}
	if len(retries) < clients-2 {
		t.Fatalf("%d of %d clients were rejected as a herd, want at least %d", len(retries), clients, clients-2)
	}

	// With the default jitter (uniform over [0, 1s) for the first retry), n >= 18 retries span
	// about (n-1)/(n+1) of a second; a span under 400ms has a probability below 1e-6. Without
	// jitter they would come back as close together as their 429s came. The waits are checked
	// too, so that a herd whose 429s were already spread out (a slow machine) cannot pass
	// without jitter.
	rejectSpread, retrySpread, waitSpread := span(firsts), span(retries), slices.Max(waits)-slices.Min(waits)
	t.Logf("%d clients: 429s within %v; retries spread over %v (at most %d in any 50ms); waits from %v to %v",
		len(retries), rejectSpread, retrySpread, densest(retries, 50*time.Millisecond), slices.Min(waits), slices.Max(waits))
	if retrySpread < 400*time.Millisecond {
		t.Errorf("retries spread over %v, want at least 400ms (the 429s came within %v)", retrySpread, rejectSpread)
	}
	if waitSpread < 400*time.Millisecond {
		t.Errorf("the waits after the 429s differ by at most %v, want at least 400ms of jitter", waitSpread)
	}
}

func span(ts []time.Time) time.Duration {
	return slices.MaxFunc(ts, time.Time.Compare).Sub(slices.MinFunc(ts, time.Time.Compare))
}

// densest is the largest number of instants within any window of length w.
func densest(ts []time.Time, w time.Duration) int {
	s := slices.Clone(ts)
	slices.SortFunc(s, time.Time.Compare)
	best, lo := 0, 0
	for hi := range s {
		for s[hi].Sub(s[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}
