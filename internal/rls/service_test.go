package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

const testRules = `domain: d
descriptors:
  - key: fw
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
  - key: sw
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
  - key: q
    rate_limit: {unit: day, requests_per_unit: 2, algorithm: quota, time_zone: Asia/Tokyo}
  - key: five
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5}
  - key: secret
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: leased
    rate_limit: {unit: minute, requests_per_unit: 100, lease: {enabled: true}}
`

// t0 is 10 s into a minute (and a Tokyo day), so minute windows have 50 s left.
var t0 = time.Date(2026, 3, 4, 5, 6, 10, 0, time.UTC)

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func compileRules(t *testing.T, content string) *envoyrules.Rules {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := policy.Parse([]byte("rls:\n  listen: 127.0.0.1:8081\n  config_dir: "+dir+"\n"), policy.LoadOptions{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Compile(cfg, policy.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return set.RLS()
}

func newTestService(t *testing.T, st bucket.Store, mod func(*Options)) (*Service, *clock, *prometheus.Registry) {
	t.Helper()
	rules := compileRules(t, testRules)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: t0}
	o := Options{Rules: func() *envoyrules.Rules { return rules }, Store: st, Backend: "memory", StoreTimeout: 50 * time.Millisecond,
		Headers: ParseHeaders("all", true), Metrics: m, Now: clk.Now}
	if mod != nil {
		mod(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk, reg
}

func d(kv ...string) *rlext.RateLimitDescriptor {
	x := &rlext.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		x.Entries = append(x.Entries, &rlext.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return x
}

func ask(t *testing.T, s *Service, ds ...*rlext.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// step is one call at an instant: the descriptor's code and remaining.
type step struct {
	at        time.Duration // since t0
	code      pb.RateLimitResponse_Code
	remaining uint32
	reset     time.Duration
}

func runSteps(t *testing.T, s *Service, clk *clock, desc *rlext.RateLimitDescriptor, steps []step) {
	t.Helper()
	for i, st := range steps {
		clk.now = t0.Add(st.at)
		got := ask(t, s, desc).Statuses[0]
		if got.GetCode() != st.code || got.GetLimitRemaining() != st.remaining || got.GetDurationUntilReset().AsDuration() != st.reset {
			t.Errorf("step %d at t0+%v: got %v remaining %d reset %v, want %v remaining %d reset %v", i, st.at,
				got.GetCode(), got.GetLimitRemaining(), got.GetDurationUntilReset().AsDuration(), st.code, st.remaining, st.reset)
		}
	}
}

func TestAlgorithmsThroughRLS(t *testing.T) {
	ok, over := pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT
	t.Run("fixed window aligned to the minute", func(t *testing.T) {
		s, clk, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
		runSteps(t, s, clk, d("fw", "a"), []step{
			{0, ok, 2, 50 * time.Second},
			{time.Second, ok, 1, 49 * time.Second},
			{2 * time.Second, ok, 0, 48 * time.Second},
			{3 * time.Second, over, 0, 47 * time.Second},
			{50 * time.Second, ok, 2, time.Minute}, // the next minute
		})
	})
	t.Run("token bucket: burst 4 refilled at 2/s", func(t *testing.T) {
		s, clk, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
		runSteps(t, s, clk, d("tb", "a"), []step{
			{0, ok, 3, 500 * time.Millisecond},
			{0, ok, 2, time.Second},
			{0, ok, 1, 1500 * time.Millisecond},
			{0, ok, 0, 2 * time.Second},
			{0, over, 0, 500 * time.Millisecond}, // over: until one more fits
			{500 * time.Millisecond, ok, 0, 2 * time.Second},
		})
	})
	t.Run("five minutes", func(t *testing.T) {
		s, clk, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
		// t0 is 05:06:10: the 5-minute window started at 05:05 and ends at 05:10.
		runSteps(t, s, clk, d("five", "a"), []step{
			{0, ok, 1, 3*time.Minute + 50*time.Second},
			{time.Minute, ok, 0, 2*time.Minute + 50*time.Second},
			{2 * time.Minute, over, 0, time.Minute + 50*time.Second},
			{3*time.Minute + 50*time.Second, ok, 1, 5 * time.Minute},
		})
	})
	t.Run("quota of a Tokyo day", func(t *testing.T) {
		s, clk, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
		// 05:06:10 UTC is 14:06:10 in Tokyo: the day ends at 15:00 UTC.
		left := 9*time.Hour + 53*time.Minute + 50*time.Second
		runSteps(t, s, clk, d("q", "a"), []step{
			{0, ok, 1, left},
			{0, ok, 0, left},
			{time.Hour, over, 0, left - time.Hour},
			{left, ok, 1, 24 * time.Hour},
		})
	})
}

func TestHitsAddendZeroConsumesNothing(t *testing.T) {
	s, _, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
	check := d("fw", "a")
	check.HitsAddend = wrapperspb.UInt64(0)
	for i := range 5 {
		st := ask(t, s, check).Statuses[0]
		if st.GetCode() != pb.RateLimitResponse_OK || st.GetLimitRemaining() != 3 {
			t.Fatalf("check %d: got %v remaining %d, want OK 3", i, st.GetCode(), st.GetLimitRemaining())
		}
	}
	for range 3 {
		ask(t, s, d("fw", "a"))
	}
	if st := ask(t, s, check).Statuses[0]; st.GetCode() != pb.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 {
		t.Errorf("check when spent: got %v remaining %d, want OVER_LIMIT 0", st.GetCode(), st.GetLimitRemaining())
	}
}

// errStore fails every Take, optionally after recording the deadline it was given.
type errStore struct {
	err      error
	deadline time.Duration // time left on the context Take got
}

func (e *errStore) Take(ctx context.Context, _ time.Time, _ []bucket.Charge, _ []bucket.Result) (bool, error) {
	if dl, ok := ctx.Deadline(); ok {
		e.deadline = time.Until(dl)
	}
	return false, e.err
}

func TestStoreErrorsFollowOnError(t *testing.T) {
	st := &errStore{err: errors.New("store down")}
	s, _, reg := newTestService(t, st, nil)
	resp := ask(t, s, d("fw", "a"))
	if resp.GetOverallCode() != pb.RateLimitResponse_OK || resp.Statuses[0].GetCurrentLimit() != nil {
		t.Errorf("on_error allow: got %v, want OK without a limit", resp)
	}
	if got := testutil.ToFloat64(s.o.Metrics.calls.WithLabelValues("d", "store_error_allowed")); got != 1 {
		t.Errorf("store_error_allowed calls: got %v, want 1", got)
	}
	_ = reg

	// The fallback store decides on_error; the call renders the rule its error carries.
	st = &errStore{err: &bucket.UndecidedError{Rule: bucket.Deny, Err: errors.New("store down")}}
	s, _, _ = newTestService(t, st, nil)
	_, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{d("fw", "a")}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("on_error deny: got %v, want UNAVAILABLE (Envoy's failure_mode_deny applies)", err)
	}
}

// TestStoreBudgetFitsTheCallDeadline: when the call's deadline is nearer than store.timeout, the
// store gets at most nine tenths of what is left of it, not store.timeout, so that the on_error
// answer arrives in time. Scaled up (store.timeout an hour, the call ten seconds, as Envoy's 20ms
// against our 50ms) so that a loaded machine cannot spend the whole budget before the store is
// asked: with 20ms, the call had sometimes expired by then and the store was never called.
func TestStoreBudgetFitsTheCallDeadline(t *testing.T) {
	st := &errStore{err: context.DeadlineExceeded}
	s, _, _ := newTestService(t, st, func(o *Options) { o.StoreTimeout = time.Hour })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{d("fw", "a")}}); err != nil {
		t.Fatal(err)
	}
	if st.deadline <= 0 || st.deadline > 9*time.Second {
		t.Errorf("the store got %v, want at most 9s of a 10s call", st.deadline)
	}
	if got := testutil.ToFloat64(s.store.Timeout); got != 1 {
		t.Errorf("store timeouts: got %v, want 1", got)
	}
}

func TestHeadersAndLabels(t *testing.T) {
	s, _, reg := newTestService(t, memstore.New(memstore.Options{}), nil)
	resp := ask(t, s, d("fw", "a"), d("tb", "a"), d("secret", "alice"))
	want := map[string]string{
		"RateLimit-Policy":      `"d.fw";q=3;w=60, "d.tb";q=4;w=2, "d.secret";q=1;w=60`,
		"RateLimit":             `"d.secret";r=0;t=50`,
		"X-RateLimit-Limit":     "1",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "50",
	}
	for k, v := range want {
		// Envoy, like HTTP, compares header names without case (and sends them lower-cased).
		got := ""
		for _, h := range resp.GetResponseHeadersToAdd() {
			if strings.EqualFold(h.GetKey(), k) {
				got = h.GetValue()
			}
		}
		if got != v {
			t.Errorf("%s: got %q, want %q", k, got, v)
		}
	}
	// detailed_metric asks for the value in the metric; the headers never carry it.
	if got := testutil.ToFloat64(s.o.Metrics.rule("d.secret_alice").Allowed); got != 1 {
		t.Errorf("detailed metric: got %v, want 1", got)
	}
	n, err := testutil.GatherAndCount(reg, "ratelimit_requests_total")
	if err != nil {
		t.Fatal(err)
	}
	if n != 9 { // three rules × allowed, limited, shadow_limited
		t.Errorf("got %d ratelimit_requests_total series, want 9", n)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.Contains(h.GetValue(), "alice") {
			t.Errorf("header %s carries a descriptor value: %q", h.GetKey(), h.GetValue())
		}
	}
}

func TestUnlimitedAndUnmatchedNeedNoStore(t *testing.T) {
	rules := compileRules(t, "domain: d\ndescriptors:\n  - key: vip\n    rate_limit: {unlimited: true}\n")
	st := &errStore{err: errors.New("must not be called")}
	st.err = &bucket.UndecidedError{Rule: bucket.Deny, Err: st.err}
	s, _, _ := newTestService(t, st, func(o *Options) { o.Rules = func() *envoyrules.Rules { return rules } })
	resp := ask(t, s, d("vip", "x"), d("other", "y"))
	if resp.GetOverallCode() != pb.RateLimitResponse_OK || resp.Statuses[0].GetLimitRemaining() != math.MaxUint32 {
		t.Errorf("got %v, want OK with vip unlimited", resp)
	}
	ask(t, s, d("other", "y"))
	// An unlimited descriptor matched a rule: it is counted apart from a call that matched none.
	for result, want := range map[string]float64{"unlimited": 1, "unmatched": 1, "ok": 0} {
		c, err := s.o.Metrics.calls.GetMetricWithLabelValues("d", result)
		if err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(c); got != want {
			t.Errorf("ratelimit_rls_calls_total{domain=\"d\",result=%q}: got %v, want %v", result, got, want)
		}
	}
}

func TestInvalidCalls(t *testing.T) {
	s, _, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
	neg := d("fw", "a")
	neg.IsNegativeHits = true
	bad := d("fw", "a")
	bad.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	leasedCheck := d("leased", "a")
	leasedCheck.HitsAddend = wrapperspb.UInt64(0)
	for name, req := range map[string]*pb.RateLimitRequest{
		"no domain":        {Descriptors: []*rlext.RateLimitDescriptor{d("fw", "a")}},
		"no descriptors":   {Domain: "d"},
		"negative hits":    {Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{neg}},
		"override UNKNOWN": {Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{bad}},
		"check on a lease": {Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{leasedCheck}},
	} {
		if _, err := s.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
}

func BenchmarkShouldRateLimit(b *testing.B) { benchShouldRateLimit(b, nil) }

// benchShouldRateLimit runs calls of three descriptors, with console c (nil: none).
func benchShouldRateLimit(b *testing.B, c Console) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(testRules), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, _ := policy.Parse([]byte("rls:\n  listen: 127.0.0.1:8081\n  config_dir: "+dir+"\n"), policy.LoadOptions{Getenv: func(string) string { return "" }})
	set, err := policy.Compile(cfg, policy.CompileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	m, _ := NewMetrics(nil)
	s, _ := New(Options{Rules: set.RLS, Store: memstore.New(memstore.Options{}), StoreTimeout: time.Second, Metrics: m, Headers: ParseHeaders("ietf", false),
		Console: c})
	req := &pb.RateLimitRequest{Domain: "d", Descriptors: []*rlext.RateLimitDescriptor{d("fw", "a"), d("tb", "b"), d("sw", "c")}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOverrideLabelsBounded is issue 26 item 8: limit overrides labelled their series with the
// caller's entry keys, so 50 calls of 64 entries with 16 kB keys each added three series with a
// 1 MB label, kept forever. The label of an override is now the domain's alone: the series count
// after a flood of distinct keys equals the count after one override call, and no label carries
// a byte of a caller's key.
func TestOverrideLabelsBounded(t *testing.T) {
	s, _, reg := newTestService(t, memstore.New(memstore.Options{}), nil)
	override := func(call int) *rlext.RateLimitDescriptor {
		x := &rlext.RateLimitDescriptor{Limit: &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: 2}}
		for e := range 64 {
			key := fmt.Sprintf("k%d.%d.", call, e) + strings.Repeat("x", 16<<10)
			x.Entries = append(x.Entries, &rlext.RateLimitDescriptor_Entry{Key: key, Value: "v"})
		}
		return x
	}
	series := func() (n, labelBytes int) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				n++
				for _, lp := range m.GetLabel() {
					labelBytes += len(lp.GetValue())
					if strings.Contains(lp.GetValue(), "xxxx") {
						t.Fatalf("%s: a label carries a caller's entry key (%d bytes)", mf.GetName(), len(lp.GetValue()))
					}
				}
			}
		}
		return n, labelBytes
	}
	ask(t, s, override(0))
	n0, b0 := series()
	for call := 1; call <= 50; call++ {
		ask(t, s, override(call))
	}
	if n, b := series(); n != n0 || b != b0 {
		t.Errorf("after 50 override calls of distinct keys: %d series (%d label bytes), want %d (%d), as after one", n, b, n0, b0)
	}
	if got := testutil.ToFloat64(s.o.Metrics.rule("d.override").Allowed); got != 51 {
		t.Errorf(`ratelimit_requests_total{policy="d.override",result="allowed"}: got %v, want 51`, got)
	}
}

// TestValueLabelsBounded: detailed_metric and value_to_metric put descriptor values in the
// label, as envoyproxy/ratelimit does, but the caller chooses those values: a flood of distinct
// (and long) values must not grow the series past a bound set by the configuration. Each such
// rule labels at most maxValueLabels distinct values of at most maxValueLabelBytes; the rest
// count under the rule's overflow label.
func TestValueLabelsBounded(t *testing.T) {
	s, _, reg := newTestService(t, memstore.New(memstore.Options{}), nil)
	count := func() int {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, "ratelimit_requests_total")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ask(t, s, d("secret", "alice"))
	if got := testutil.ToFloat64(s.o.Metrics.rule("d.secret_alice").Allowed); got != 1 {
		t.Fatalf("a few values are labelled as configured: d.secret_alice allowed %v, want 1", got)
	}
	for i := range 3 * maxValueLabels {
		ask(t, s, d("secret", fmt.Sprintf("v%d", i)))
	}
	ask(t, s, d("secret", strings.Repeat("x", 1<<16)))
	if n, most := count(), 3*(maxValueLabels+1); n > most {
		t.Errorf("after %d distinct values: %d ratelimit_requests_total series, want at most %d", 3*maxValueLabels+2, n, most)
	}
	overflow := testutil.ToFloat64(s.o.Metrics.rule("d.secret" + overflowSuffix).Allowed)
	if want := float64(2*maxValueLabels + 2); overflow != want {
		t.Errorf("overflow label counted %v calls, want %v", overflow, want)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if len(lp.GetValue()) > maxValueLabelBytes+len("d.secret"+overflowSuffix) {
					t.Errorf("%s: a label of %d bytes", mf.GetName(), len(lp.GetValue()))
				}
			}
		}
	}
}

// TestHeadersDescribeTheLongestWait: when several descriptors are over their limits, the headers
// describe the one the client must wait for longest (as the proxy's 429 does), not the first
// one over: here the minute window (50 s left), not the token bucket (half a second).
func TestHeadersDescribeTheLongestWait(t *testing.T) {
	s, _, _ := newTestService(t, memstore.New(memstore.Options{}), nil)
	for range 4 {
		ask(t, s, d("tb", "a"))
	}
	for range 3 {
		ask(t, s, d("fw", "a"))
	}
	resp := ask(t, s, d("tb", "a"), d("fw", "a"))
	if resp.GetOverallCode() != pb.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[0].GetCode() != pb.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].GetCode() != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("got %v, want both descriptors over their limits", resp)
	}
	want := map[string]string{"X-RateLimit-Limit": "3", "X-RateLimit-Reset": "50", "RateLimit": `"d.fw";r=0;t=50`}
	for _, h := range resp.GetResponseHeadersToAdd() {
		for k, w := range want {
			// Envoy, like HTTP, compares header names without case.
			if strings.EqualFold(h.GetKey(), k) {
				if h.GetValue() != w {
					t.Errorf("%s: got %q, want %q (the longest wait: fw)", k, h.GetValue(), w)
				}
				delete(want, k)
			}
		}
	}
	for k := range want {
		t.Errorf("header %s missing", k)
	}
}
