package replay

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
)

func noEnv(string) string { return "" }

func compile(t testing.TB, yaml string) *policy.Set {
	t.Helper()
	cfg, err := policy.Parse([]byte(yaml), policy.LoadOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func replayText(t *testing.T, o Options, logs ...string) *Report {
	t.Helper()
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range logs {
		if err := r.Read(context.Background(), fmt.Sprintf("log%d", i+1), strings.NewReader(l)); err != nil {
			t.Fatal(err)
		}
	}
	return r.Report()
}

func clf(ip, at, path, key string) string {
	return fmt.Sprintf("%s - - [%s +0000] \"GET %s HTTP/1.1\" 200 1 \"-\" \"t\" \"%s\"\n", ip, at, path, key)
}

func TestReplayCountsAndSpreadsSeconds(t *testing.T) {
	set := compile(t, `upstream: http://h
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 2/s, burst: 1}
  - {name: per-key, key: api_key, algorithm: fixed_window, limit: 100, window: 1m, mode: shadow}
`)
	ps := policy.NewPseudonyms([]byte(strings.Repeat("s", 32)))
	log := clf("192.0.2.1", "24/Nov/2026:09:00:00", "/", "k1") + // three in one second: spread to
		clf("192.0.2.1", "24/Nov/2026:09:00:00", "/", "k1") + // +0, +1/3 and +2/3 s, the
		clf("192.0.2.1", "24/Nov/2026:09:00:00", "/", "k1") + // second is limited (T = tau = 0.5s)
		"garbage line\n" +
		clf("192.0.2.2", "24/Nov/2026:09:00:05", "/", "-") +
		clf("192.0.2.2", "24/Nov/2026:09:00:01", "/", "-") + // out of order: decided at :05
		"\n"
	rep := replayText(t, Options{Set: set, Pseudonyms: ps, KeyFields: []string{"api_key"}}, log)
	if rep.Lines != 7 || rep.Requests != 5 || rep.Unparseable != 1 || rep.Skipped != 1 || rep.OutOfOrder != 1 {
		t.Errorf("totals = %d lines %d requests %d unparseable %d skipped %d out of order; want 7 5 1 1 1",
			rep.Lines, rep.Requests, rep.Unparseable, rep.Skipped, rep.OutOfOrder)
	}
	if rep.Admitted != 3 || rep.Limited != 2 {
		t.Errorf("admitted %d limited %d, want 3 and 2 (the second of each pair, 0.33s after the first)", rep.Admitted, rep.Limited)
	}
	ip := rep.Policies[0]
	if ip.Matched != 5 || ip.Admitted != 3 || ip.Limited != 2 || ip.PeakPerSecond != 3 || ip.DistinctLimitedKeys != 2 ||
		!ip.DistinctLimitedKeysExact {
		t.Errorf("per-ip = %+v; want matched 5, admitted 3, limited 2, peak 3/s, 2 distinct limited keys", ip)
	}
	want1, want2 := "ip:"+ps.Of("ip", "192.0.2.1"), "ip:"+ps.Of("ip", "192.0.2.2")
	if len(ip.TopLimitedKeys) != 2 || ip.TopLimitedKeys[0].Limited != 1 ||
		!(ip.TopLimitedKeys[0].Key == want1 || ip.TopLimitedKeys[0].Key == want2) {
		t.Errorf("per-ip top keys = %+v, want %s and %s once each", ip.TopLimitedKeys, want1, want2)
	}
	key := rep.Policies[1]
	if key.Matched != 3 || key.Admitted != 2 || key.LimitedElsewhere != 1 || key.ShadowLimited != 0 {
		t.Errorf("per-key = %+v; want matched 3, admitted 2, limited elsewhere 1", key)
	}
	if len(rep.Errors) != 1 || rep.Errors[0].Line != 4 || rep.Errors[0].File != "log1" {
		t.Errorf("errors = %+v, want log1 line 4", rep.Errors)
	}
	if !rep.From.Equal(time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)) || !rep.To.Equal(time.Date(2026, 11, 24, 9, 0, 5, 0, time.UTC)) {
		t.Errorf("from %v to %v, want 09:00:00 to 09:00:05", rep.From, rep.To)
	}
	for _, raw := range []string{"192.0.2.1", "k1"} {
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(b.String(), raw) {
			t.Errorf("the report shows the raw key %q", raw)
		}
	}
}

func TestReplayShadowAndTopKeys(t *testing.T) {
	set := compile(t, `upstream: http://h
policies:
  - {name: per-key, key: api_key, algorithm: fixed_window, limit: 2, window: 1m, mode: shadow}
`)
	var b strings.Builder
	// key-a sends 10, key-b 5, key-c 1 within one minute: all past 2 are shadow-limited.
	for i := range 10 {
		at := fmt.Sprintf("24/Nov/2026:09:00:%02d", i)
		b.WriteString(clf("192.0.2.1", at, "/", "key-a"))
		if i < 5 {
			b.WriteString(clf("192.0.2.1", at, "/", "key-b"))
		}
		if i < 1 {
			b.WriteString(clf("192.0.2.1", at, "/", "key-c"))
		}
	}
	ps := policy.NewPseudonyms(nil)
	rep := replayText(t, Options{Set: set, Pseudonyms: ps, KeyFields: []string{"api_key"}, Top: 1}, b.String())
	p := rep.Policies[0]
	if p.Matched != 16 || p.Admitted != 5 || p.ShadowLimited != 11 || p.Limited != 0 || rep.Limited != 0 {
		t.Errorf("per-key = %+v, report limited %d; want 16 matched, 5 admitted, 11 shadow-limited, nothing limited", p, rep.Limited)
	}
	if len(p.TopLimitedKeys) != 1 || p.TopLimitedKeys[0] != (KeyCount{Key: "api_key:" + ps.Of("api_key", "key-a"), Limited: 8}) {
		t.Errorf("top keys = %+v, want key-a's pseudonym with 8", p.TopLimitedKeys)
	}
	if p.DistinctLimitedKeys != 2 {
		t.Errorf("distinct limited keys = %d, want 2", p.DistinctLimitedKeys)
	}
}

func TestTopKeysSpaceSaving(t *testing.T) {
	// 130 counts in a summary of 8: every key counted more than 130/8 times is guaranteed in it.
	top := topKeys{capacity: 8, idx: map[bucket.Key]int{}}
	key := func(i int) bucket.Key { return bucket.Key{byte(i)} }
	counts := map[int]int{1: 50, 2: 30, 3: 20}
	rng := rand.New(rand.NewPCG(1, 2))
	var stream []int
	for k, n := range counts {
		for range n {
			stream = append(stream, k)
		}
	}
	for i := 10; i < 40; i++ { // 30 keys seen once, more than the capacity
		stream = append(stream, i)
	}
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	for _, k := range stream {
		top.add(key(k), func() string { return fmt.Sprint(k) })
	}
	got := top.most(3)
	for i, want := range []int{1, 2, 3} {
		e := got[i]
		if e.label != fmt.Sprint(want) || e.count < int64(counts[want]) || e.count-e.over > int64(counts[want]) {
			t.Errorf("top[%d] = %+v, want key %d with a count bounding %d", i, e, want, counts[want])
		}
	}
}

func TestSeriesMergesBuckets(t *testing.T) {
	s := newSeries(1)
	s.start = 0
	sec := int64(time.Second)
	s.add(0, 0, false)
	s.add(maxBuckets*sec-1, 0, true) // last bucket at width 1s
	if s.width != sec || s.n != maxBuckets {
		t.Fatalf("width %d n %d, want 1s and %d", s.width, s.n, maxBuckets)
	}
	s.add(maxBuckets*sec, 0, false) // forces a merge
	if s.width != 2*sec || s.n != maxBuckets/2+1 {
		t.Errorf("after merge: width %v n %d, want 2s and %d", time.Duration(s.width), s.n, maxBuckets/2+1)
	}
	if s.admitted[0][0] != 1 || s.limited[0][maxBuckets/2-1] != 1 || s.admitted[0][maxBuckets/2] != 1 {
		t.Error("counts not kept across the merge")
	}
}

// TestReplayDecidesAsTheGateway runs requests through the real handler with log.access on and a
// simulated clock, then replays its access log with the same policies: every policy's counts
// must equal the gateway's metrics.
func TestReplayDecidesAsTheGateway(t *testing.T) {
	const cfg = `upstream: http://h
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 5/s, burst: 3}
  - {name: per-key, key: api_key, algorithm: fixed_window, limit: 10, window: 2s, match: {path_prefix: /api/}}
  - {name: writes, key: ip, algorithm: leaky_bucket, rate: 2/s, burst: 1, match: {methods: [POST]}}
  - {name: account, key: global, algorithm: sliding_window, limit: 20, window: 1s, mode: shadow}
`
	set := compile(t, cfg)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(up.Close)
	upURL, _ := url.Parse(up.URL)
	var logs bytes.Buffer
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&logs), zapcore.InfoLevel))
	reg := prometheus.NewRegistry()
	now := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	h, err := proxy.New(proxy.Options{
		Upstream: upURL, Policies: func() proxy.Policies { return set }, Limiter: memstore.New(memstore.Options{}),
		Logger: log, AccessLog: true, Metrics: proxy.NewMetrics(reg),
		Now:  func() time.Time { return now },
		Wait: func(context.Context, time.Duration) error { return nil }, // leaky holds are not waited out
	})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 600 {
		now = now.Add(time.Duration(rng.IntN(60)) * time.Millisecond)
		method, path := "GET", []string{"/api/a", "/static"}[rng.IntN(2)]
		if rng.IntN(5) == 0 {
			method = "POST"
		}
		req := httptest.NewRequest(method, path, nil)
		req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", 1+rng.IntN(3))
		if rng.IntN(4) != 0 {
			req.Header.Set("X-Api-Key", fmt.Sprintf("key-%d", rng.IntN(2)))
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
	}

	rep := replayText(t, Options{Set: set, Format: Gateway}, logs.String())
	if rep.Requests != 600 || rep.Unparseable != 0 {
		t.Fatalf("replayed %d requests (%d unparseable: %v), want 600", rep.Requests, rep.Unparseable, rep.Errors)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gateway := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := f.GetName()
			for _, l := range m.GetLabel() {
				labels += " " + l.GetValue()
			}
			gateway[labels] = m.GetCounter().GetValue()
		}
	}
	limitedAny := false
	for _, p := range rep.Policies {
		for result, got := range map[string]int64{"allowed": p.Admitted, "limited": p.Limited, "shadow_limited": p.ShadowLimited} {
			want := gateway["ratelimit_requests_total "+p.Name+" "+result]
			if float64(got) != want {
				t.Errorf("%s %s: replay %d, gateway %v", p.Name, result, got, want)
			}
			if result != "allowed" && got > 0 {
				limitedAny = true
			}
		}
	}
	if got, want := float64(rep.Limited), gateway["ratelimit_decisions_total limited"]; got != want {
		t.Errorf("limited requests: replay %v, gateway %v", got, want)
	}
	if !limitedAny {
		t.Error("nothing was limited: the test does not exercise the limits")
	}
}

func gatewayLine(at time.Time, path string, status int, dur time.Duration, ip string) string {
	return fmt.Sprintf(`{"logger":"access","msg":"request","time":%q,"method":"GET","path":%q,"status":%d,"duration_seconds":%g,"keys":{"ip":%q}}`+"\n",
		at.Format(time.RFC3339Nano), path, status, dur.Seconds(), ip)
}

// TestReplayGivesBackAsTheGateway: concurrency slots are held for the logged duration, and a
// charge_on policy keeps only the answers it lists.
func TestReplayGivesBackAsTheGateway(t *testing.T) {
	set := compile(t, `upstream: http://h
policies:
  - {name: slots, key: ip, algorithm: concurrency, limit: 2, match: {path_prefix: /slow}}
  - {name: errors, key: ip, algorithm: fixed_window, limit: 1, window: 1m, charge_on: [5xx], match: {path_prefix: /err}}
`)
	t0 := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	log := gatewayLine(t0, "/slow", 200, time.Second, "a") +
		gatewayLine(t0.Add(100*ms), "/slow", 200, time.Second, "a") +
		gatewayLine(t0.Add(200*ms), "/slow", 200, time.Second, "a") + // both slots held: limited
		gatewayLine(t0.Add(1050*ms), "/slow", 200, time.Second, "a") + // the first is back
		gatewayLine(t0.Add(1060*ms), "/slow", 200, time.Second, "a") + // limited: the second ends at 1.1s
		gatewayLine(t0.Add(2*time.Second), "/err", 200, ms, "a") + // not a 5xx: refunded
		gatewayLine(t0.Add(3*time.Second), "/err", 503, ms, "a") + // kept
		gatewayLine(t0.Add(4*time.Second), "/err", 200, ms, "a") + // limited
		gatewayLine(t0.Add(61*time.Second), "/err", 0, ms, "a") + // the client hung up: kept
		gatewayLine(t0.Add(62*time.Second), "/err", 200, ms, "a") // limited
	rep := replayText(t, Options{Set: set}, log)
	slots, errs := rep.Policies[0], rep.Policies[1]
	if slots.Admitted != 3 || slots.Limited != 2 {
		t.Errorf("slots: admitted %d limited %d, want 3 and 2", slots.Admitted, slots.Limited)
	}
	if errs.Admitted != 3 || errs.Limited != 2 {
		t.Errorf("errors: admitted %d limited %d, want 3 and 2", errs.Admitted, errs.Limited)
	}
}
