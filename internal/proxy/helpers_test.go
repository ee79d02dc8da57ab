package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// fakePolicies plans fixed charges (or fails with err). Like policy.Set.Plan, an err wrapping
// policy.ErrUnauthorized still leaves the charges in the plan (a test then configures the
// request's ip charges); any other err leaves the plan empty. Safe for concurrent use.
type fakePolicies struct {
	charges  []bucket.Charge
	policies []*policy.Policy
	values   []string // raw key values: fakeValue(key)
	err      error
	headers  policy.Headers
	trust    bool

	plans        atomic.Int64
	trustedCalls atomic.Int64
	mu           sync.Mutex
	peers        []netip.Addr
}

func (f *fakePolicies) Plan(_ *http.Request, p *policy.Plan) error {
	f.plans.Add(1)
	p.Reset()
	if f.err != nil && !errors.Is(f.err, policy.ErrUnauthorized) && !errors.Is(f.err, policy.ErrBadRequest) {
		return f.err
	}
	p.Charges = append(p.Charges, f.charges...)
	p.Policies = append(p.Policies, f.policies...)
	p.Values = append(p.Values, f.values...)
	return f.err
}

func (f *fakePolicies) Headers() policy.Headers { return f.headers }

func (f *fakePolicies) Trusted(peer netip.Addr) bool {
	f.trustedCalls.Add(1)
	f.mu.Lock()
	f.peers = append(f.peers, peer)
	f.mu.Unlock()
	return f.trust
}

// add appends one policy and its charge (with the policy's default limit).
func (f *fakePolicies) add(name string, shadow bool, key byte) *fakePolicies {
	l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 20}
	f.policies = append(f.policies, &policy.Policy{Name: name, Index: len(f.policies), Shadow: shadow, Limit: l,
		KeyKind: "header:x-client"})
	f.charges = append(f.charges, bucket.Charge{Key: testKey(key), Limit: l, Shadow: shadow})
	f.values = append(f.values, fakeValue(key))
	return f
}

// fakeValue is the raw key value that fakePolicies gives the charge of key.
func fakeValue(key byte) string { return fmt.Sprintf("client-%d", key) }

func testKey(b byte) bucket.Key {
	var k bucket.Key
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

// fakeLimiter returns fixed results, fails with err, or blocks until ctx ends. Safe for
// concurrent use.
type fakeLimiter struct {
	results  []bucket.Result
	admitted bool
	err      error
	block    bool
	rule     bucket.OnError // the on_error rule its errors carry, as the fallback store decides it

	calls       atomic.Int64
	sawDone     chan struct{} // closed when a blocking Take observed ctx.Done
	once        sync.Once
	mu          sync.Mutex
	lastNow     time.Time
	lastLen     int
	lastCharges []bucket.Charge // a copy of the last call's charges
}

func newFakeLimiter(admitted bool, results ...bucket.Result) *fakeLimiter {
	return &fakeLimiter{results: results, admitted: admitted, sawDone: make(chan struct{})}
}

func (f *fakeLimiter) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	f.calls.Add(1)
	f.mu.Lock()
	f.lastNow, f.lastLen = now, len(charges)
	f.lastCharges = append(f.lastCharges[:0], charges...)
	f.mu.Unlock()
	if f.block {
		<-ctx.Done()
		f.once.Do(func() { close(f.sawDone) })
		return false, &bucket.UndecidedError{Rule: f.rule, Err: fmt.Errorf("fake store: %w", ctx.Err())}
	}
	if f.err != nil {
		return false, &bucket.UndecidedError{Rule: f.rule, Err: f.err}
	}
	copy(results, f.results)
	return f.admitted, nil
}

// charges returns a copy of the charges of the last Take.
func (f *fakeLimiter) charges() []bucket.Charge {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bucket.Charge(nil), f.lastCharges...)
}

// countingUpstream is a real HTTP server that counts and records what reaches it.
type countingUpstream struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	last *http.Request
}

// newUpstream starts an upstream; a nil handler answers 200 "upstream <path>".
func newUpstream(t *testing.T, h http.HandlerFunc) *countingUpstream {
	t.Helper()
	u := &countingUpstream{}
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "upstream "+r.URL.Path)
		}
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		u.mu.Lock()
		u.last = r.Clone(context.Background())
		u.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *countingUpstream) lastRequest(t *testing.T) *http.Request {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.last == nil {
		t.Fatal("upstream saw no request")
	}
	return u.last
}

// harness is the handler under test served on a real socket, in front of a real upstream.
type harness struct {
	t      *testing.T
	h      *Handler
	srv    *httptest.Server
	up     *countingUpstream
	reg    *prometheus.Registry
	m      *Metrics
	pol    *fakePolicies
	lim    *fakeLimiter
	logs   *observer.ObservedLogs
	client *http.Client
	// done receives once every time ServeHTTP returns or panics, for asserting on what happens after the
	// client stopped listening.
	done chan struct{}
}

// logTime is the fixed clock of the test logger: the sampler counts per entry time, so a fixed
// clock makes the number of sampled lines exact.
var logTime = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                         { return c.t }
func (c fixedClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// newHarness serves a Handler with pol and lim. up may be nil (a default counting upstream).
// edit adjusts the options before New.
func newHarness(t *testing.T, pol *fakePolicies, lim *fakeLimiter, up *countingUpstream, edit func(*Options)) *harness {
	t.Helper()
	if up == nil {
		up = newUpstream(t, nil)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	tr := NewTransport(0)
	t.Cleanup(tr.CloseIdleConnections)
	o := Options{
		Upstream:     mustURL(t, up.URL),
		Policies:     func() Policies { return pol },
		Limiter:      lim,
		StoreTimeout: time.Second,
		Logger:       zap.New(core, zap.WithClock(fixedClock{logTime})),
		Metrics:      m,
		Now:          func() time.Time { return time.Unix(1_700_000_000, 250_000_000) },
		Transport:    tr,
	}
	if edit != nil {
		edit(&o)
	}
	h, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan struct{}, 1000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { // also when ServeHTTP panics with http.ErrAbortHandler
			select {
			case done <- struct{}{}:
			default:
			}
		}()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ct := &http.Transport{}
	t.Cleanup(ct.CloseIdleConnections)
	return &harness{t: t, h: h, srv: srv, up: up, reg: reg, m: m, pol: pol, lim: lim, logs: logs,
		client: &http.Client{Transport: ct}, done: done}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return u
}

// get sends a GET for path with the given header pairs and returns the response with its body read.
func (hs *harness) get(path string, kv ...string) (*http.Response, string) {
	hs.t.Helper()
	req, err := http.NewRequest(http.MethodGet, hs.srv.URL+path, nil)
	if err != nil {
		hs.t.Fatalf("new request: %v", err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Add(kv[i], kv[i+1])
	}
	return hs.do(req)
}

func (hs *harness) do(req *http.Request) (*http.Response, string) {
	hs.t.Helper()
	res, err := hs.client.Do(req)
	if err != nil {
		hs.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		hs.t.Fatalf("read body: %v", err)
	}
	return res, string(b)
}

// waitServed waits until ServeHTTP has returned n more times.
func (hs *harness) waitServed(n int) {
	hs.t.Helper()
	deadline := time.After(10 * time.Second)
	for range n {
		select {
		case <-hs.done:
		case <-deadline:
			hs.t.Fatal("handler did not return within 10s")
		}
	}
}

// counter reads one counter series from the registry; a series that does not exist reads 0.
func counter(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	m := find(t, g, name, labels...)
	if m == nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// histogram reads one histogram series' sample count and sum.
func histogram(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (uint64, float64) {
	t.Helper()
	m := find(t, g, name, labels...)
	if m == nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// find returns the series of name whose labels include the label=value pairs.
func find(t *testing.T, g prometheus.Gatherer, name string, labels ...string) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// wantCounter asserts one counter's value.
func wantCounter(t *testing.T, g prometheus.Gatherer, want float64, name string, labels ...string) {
	t.Helper()
	if got := counter(t, g, name, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// problemBody is the decoded problem+json body.
type problemBody struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Status     int    `json:"status"`
	Detail     string `json:"detail"`
	Policy     string `json:"policy"`
	RetryAfter int64  `json:"retry_after_seconds"`
}

func decodeProblem(t *testing.T, res *http.Response, body string) problemBody {
	t.Helper()
	if got := res.Header.Get("Content-Type"); got != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", got)
	}
	var p problemBody
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("decode problem %q: %v", body, err)
	}
	if p.Status != res.StatusCode {
		t.Errorf("problem status = %d, want the response status %d", p.Status, res.StatusCode)
	}
	if want := http.StatusText(res.StatusCode); p.Title != want {
		t.Errorf("problem title = %q, want %q", p.Title, want)
	}
	if !strings.HasPrefix(p.Type, answer.ProblemBase) {
		t.Errorf("problem type = %q, want a %s URI", p.Type, answer.ProblemBase)
	}
	if p.Detail == "" {
		t.Error("problem detail is empty")
	}
	return p
}

// wantHeader asserts a response header's value ("" means absent).
func wantHeader(t *testing.T, res *http.Response, name, want string) {
	t.Helper()
	vals := res.Header.Values(name)
	got := strings.Join(vals, "|")
	if got != want {
		t.Errorf("%s = %q, want %q", name, got, want)
	}
}

// cancelWhenEntered sends GET path, cancels it on the client side as soon as entered is closed
// (the request has reached the stage under test), checks the client saw the cancellation and
// waits until the handler has returned.
func (hs *harness) cancelWhenEntered(t *testing.T, path string, entered <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hs.srv.URL+path, nil)
	errc := make(chan error, 1)
	go func() {
		res, err := hs.client.Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error = %v, want context.Canceled", err)
	}
	hs.waitServed(1)
}
