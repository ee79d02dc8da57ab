package main

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// record is one request as the generator and the upstream saw it, on the one recording clock
// (this process's monotonic clock).
type record struct {
	id      int64
	policy  string // the policy under test (its path)
	gate    string // the X-Gate value, "" without
	replica int
	cost    int64
	sent    time.Time
	recv    time.Time
	status  int    // 0: no answer (a connection error, a timeout)
	by      string // the policy that rejected it (429), from the problem body
	// upstream: when the request reached the upstream and left it; zero when it never did.
	enter, exit time.Time
}

// upstream records each request it serves, by the X-Check-Id the generator put on it.
type upstream struct {
	ps    []policy // the concurrency policies' holds
	mu    sync.Mutex
	seen  map[int64][2]time.Time
	extra int64 // requests without a known id: must stay 0
}

func newUpstream(ps []policy) *upstream {
	return &upstream{ps: ps, seen: make(map[int64][2]time.Time)}
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	enter := time.Now()
	id, err := strconv.ParseInt(r.Header.Get("X-Check-Id"), 10, 64)
	if hold := holdOf(u.ps, r.URL.Path); hold > 0 {
		// A concurrency policy's request holds its slot this long. The upstream's own timing,
		// not a test's wait.
		t := time.NewTimer(hold)
		<-t.C
	}
	w.Header().Set("Content-Type", "text/plain")
	if strings.HasPrefix(r.URL.Path, "/co/") && err == nil && charged(id) {
		w.WriteHeader(http.StatusUnauthorized) // the answer a charge_on policy keeps charged
	}
	_, _ = io.WriteString(w, "ok\n")
	exit := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil {
		u.extra++
		return
	}
	if _, dup := u.seen[id]; dup {
		u.extra++ // the same request forwarded twice would be an admission the client cannot see
		return
	}
	u.seen[id] = [2]time.Time{enter, exit}
}

// generator sends the load: open loop per policy, each request to a replica chosen by the
// seeded RNG.
type generator struct {
	reps    []*replica
	ps      []policy
	gate    bool // some requests carry X-Gate
	load    float64
	nextID  atomic.Int64
	mu      sync.Mutex
	records []*record
	rng     *rand.Rand
	rngMu   sync.Mutex
}

func (g *generator) rand() (float64, int) {
	g.rngMu.Lock()
	defer g.rngMu.Unlock()
	return g.rng.Float64(), g.rng.IntN(len(g.reps))
}

// run sends load until ctx ends, then waits for the requests in flight.
func (g *generator) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, p := range g.ps {
		rate := p.offered * g.load
		if rate <= 0 {
			continue
		}
		if p.pulse {
			rate *= float64(pulseCycle) / float64(pulseTo-pulseFrom) // the same average
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var inflight sync.WaitGroup
			defer inflight.Wait()
			// Open loop that keeps count: each tick sends what is due since the origin (the start,
			// or the pulse's start), so a tick the scheduler of a loaded machine delays or drops
			// delays requests but never loses them.
			tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer tick.Stop()
			origin, sent := time.Now(), int64(0)
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-tick.C:
					if p.pulse {
						if !inPulse(now) {
							continue
						}
						if ps := pulseStart(now); !ps.Equal(origin) {
							origin, sent = ps, 0
						}
					}
					for due := int64(now.Sub(origin).Seconds()*rate) + 1 - sent; due > 0; due-- {
						sent++
						inflight.Add(1)
						go func() { defer inflight.Done(); g.send(p) }()
					}
				}
			}
		}()
	}
	wg.Wait()
}

func (g *generator) send(p policy) {
	x, ri := g.rand()
	r := g.reps[ri]
	rec := &record{id: g.nextID.Add(1), policy: p.name, replica: ri, cost: 1}
	method := http.MethodGet
	if p.postCost > 0 && x < 0.25 {
		method, rec.cost = http.MethodPost, p.postCost
	}
	if g.gate && x >= 1-gateShare {
		rec.gate = "g" + strconv.Itoa(int((1-x)/gateShare*gateValues)%gateValues)
	}
	req := loadRequest(method, r.url()+"/"+p.name+"/x")
	req.Header.Set("X-Check-Id", strconv.FormatInt(rec.id, 10))
	if rec.gate != "" {
		req.Header.Set("X-Gate", rec.gate)
	}
	rec.sent = time.Now()
	res, err := r.client.Do(req)
	if err == nil {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		res.Body.Close()
		rec.status = res.StatusCode
		if res.StatusCode == http.StatusTooManyRequests {
			var pb struct{ Policy string }
			_ = json.Unmarshal(body, &pb)
			rec.by = pb.Policy
		}
	}
	rec.recv = time.Now()
	g.mu.Lock()
	g.records = append(g.records, rec)
	g.mu.Unlock()
}

// newClient is one replica's client: keep-alive, bounded, loopback only.
// loadRequest is a request of the load that Go's transport never sends twice. It re-sends a
// replayable request (a GET without a body) whose reused connection broke after it was written
// (a replica SIGKILLed with it in flight; a restarted memory-store replica is up before the
// retry), and the upstream would see one id twice: an admission the generator never records.
// A GET's body that is not http.NoBody, without GetBody, makes it not replayable; an empty
// one is probed and sent as none.
func loadRequest(method, url string) *http.Request {
	req, _ := http.NewRequest(method, url, nil)
	if method == http.MethodGet {
		req.Body = io.NopCloser(strings.NewReader(""))
	}
	return req
}

func newClient() *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
			MaxIdleConns:        512, // cr keeps about 120 requests in flight to each replica
			MaxIdleConnsPerHost: 512,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}
}
