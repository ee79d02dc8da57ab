package rls

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// fakeConsole records what the service tells the console and grants the exemptions it holds.
type fakeConsole struct {
	mu       sync.Mutex
	observed []observation
	exempt   map[string]exemption // by rule label
}

type observation struct {
	domain, rule string
	entries      []envoyrules.Entry
	key          bucket.Key
	limit        bucket.Limit
	limited      bool
}

type exemption struct {
	limit     bucket.Limit
	unlimited bool
}

func (f *fakeConsole) ExemptRLS(_ time.Time, r *envoyrules.Rule, _ bucket.Key) (bucket.Limit, bool, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.exempt[r.Label]
	return e.limit, e.unlimited, ok
}

func (f *fakeConsole) ObserveRLS(_ time.Time, domain string, m *envoyrules.Match, entries []envoyrules.Entry, ch *bucket.Charge, limited bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.observed = append(f.observed, observation{domain: domain, rule: m.Rule.Label, entries: append([]envoyrules.Entry(nil), entries...),
		key: ch.Key, limit: ch.Limit, limited: limited})
}

func (f *fakeConsole) take() []observation {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.observed
	f.observed = nil
	return o
}

// TestConsoleObservesCharges checks that every descriptor a rule charged is told to the
// console, with its rule, entries, bucket key and verdict, and nothing else: not an override
// (it belongs to no rule), not an unlimited or unmatched descriptor, not a call the store could
// not decide.
func TestConsoleObservesCharges(t *testing.T) {
	fc := &fakeConsole{}
	s, _, _ := newTestService(t, memstore.New(memstore.Options{}), func(o *Options) { o.Console = fc })
	override := d("fw", "o")
	override.Limit = &rlext.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: 2}
	for i := range 4 {
		ask(t, s, d("fw", "a"), d("nope", "x"), override)
		obs := fc.take()
		if len(obs) != 1 {
			t.Fatalf("call %d: %d observations %+v, want the fw descriptor's alone", i+1, len(obs), obs)
		}
		o := obs[0]
		if o.domain != "d" || o.rule != "d.fw" || len(o.entries) != 1 || o.entries[0] != (envoyrules.Entry{Key: "fw", Value: "a"}) ||
			o.limit.Count != 3 || o.key == (bucket.Key{}) {
			t.Fatalf("call %d: observed %+v, want domain d, rule d.fw, entry fw=a, limit 3", i+1, o)
		}
		if want := i == 3; o.limited != want { // 3 per minute: the 4th is over
			t.Fatalf("call %d: limited %v, want %v", i+1, o.limited, want)
		}
	}
	s2, _, _ := newTestService(t, &errStore{err: errors.New("store down")}, func(o *Options) { o.Console = fc })
	ask(t, s2, d("fw", "a"))
	if obs := fc.take(); len(obs) != 0 {
		t.Fatalf("a call the store could not decide was observed: %+v", obs)
	}
}

// TestConsoleIgnoresChecks: a check (hits_addend 0, what `rls check --peek` sends) consumes
// nothing, so the console does not see it either: a key an operator only looked at must not rise
// in `admin top`. The same call with hits charges the key and is observed.
func TestConsoleIgnoresChecks(t *testing.T) {
	fc := &fakeConsole{}
	s, _, _ := newTestService(t, memstore.New(memstore.Options{}), func(o *Options) { o.Console = fc })
	peek := d("fw", "a")
	peek.HitsAddend = wrapperspb.UInt64(0)
	for range 5 {
		ask(t, s, peek)
	}
	if obs := fc.take(); len(obs) != 0 {
		t.Fatalf("checks (hits_addend 0) were observed: %+v, want none", obs)
	}
	resp := ask(t, s, peek)
	if got := resp.Statuses[0].GetLimitRemaining(); got != 3 {
		t.Errorf("after five checks: remaining %d, want 3 (a check consumes nothing)", got)
	}
	fc.take()
	ask(t, s, d("fw", "a"))
	if obs := fc.take(); len(obs) != 1 {
		t.Fatalf("a charged call: %d observations, want 1", len(obs))
	}
}

// TestConsoleExemptions checks that an exemption replaces a rule's limit for the call (the
// answer and headers follow it) and that an unlimited one answers OK without charging.
func TestConsoleExemptions(t *testing.T) {
	fc := &fakeConsole{exempt: map[string]exemption{}}
	m := memstore.New(memstore.Options{})
	s, _, _ := newTestService(t, m, func(o *Options) { o.Console = fc })
	for range 3 {
		ask(t, s, d("fw", "a"))
	}
	if got := ask(t, s, d("fw", "a")); got.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th call of 3 a minute: %v, want OVER_LIMIT", got.OverallCode)
	}
	fc.mu.Lock()
	fc.exempt["d.fw"] = exemption{limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Minute}}
	fc.mu.Unlock()
	got := ask(t, s, d("fw", "a"))
	if got.OverallCode != pb.RateLimitResponse_OK || got.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("exempt to 10 a minute after 3 counted: %v remaining %d, want OK and 6", got.OverallCode, got.Statuses[0].LimitRemaining)
	}
	if h := header(got, "X-RateLimit-Limit"); h != "10" {
		t.Errorf("X-RateLimit-Limit %q, want the exemption's 10", h)
	}
	if obs := fc.take(); len(obs) == 0 || obs[len(obs)-1].limit.Count != 10 {
		t.Errorf("observed %+v, want the charge under the exemption's limit", obs)
	}
	fc.mu.Lock()
	fc.exempt["d.fw"] = exemption{unlimited: true}
	fc.mu.Unlock()
	for range 20 {
		if got := ask(t, s, d("fw", "a")); got.OverallCode != pb.RateLimitResponse_OK || got.Statuses[0].LimitRemaining != 1<<32-1 {
			t.Fatalf("unlimited exemption: %v remaining %d, want OK, unlimited", got.OverallCode, got.Statuses[0].LimitRemaining)
		}
	}
	fc.mu.Lock()
	delete(fc.exempt, "d.fw")
	fc.mu.Unlock()
	// Nothing was charged while unlimited: the window still holds the 4 counted before.
	if got := ask(t, s, d("fw", "a")); got.Statuses[0].LimitRemaining != 0 || got.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the exemption: %v remaining %d, want OVER_LIMIT (the 3 counted before it)", got.OverallCode, got.Statuses[0].LimitRemaining)
	}
}

// header is the value of header name in resp's response_headers_to_add (names compared
// without case, as Envoy does).
func header(resp *pb.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

// BenchmarkShouldRateLimitConsole is BenchmarkShouldRateLimit with a console that exempts
// nothing and records nothing: the cost of the two hooks' calls on the call path.
func BenchmarkShouldRateLimitConsole(b *testing.B) {
	benchShouldRateLimit(b, nopConsole{})
}

type nopConsole struct{}

func (nopConsole) ExemptRLS(time.Time, *envoyrules.Rule, bucket.Key) (bucket.Limit, bool, bool) {
	return bucket.Limit{}, false, false
}

func (nopConsole) ObserveRLS(time.Time, string, *envoyrules.Match, []envoyrules.Entry, *bucket.Charge, bool) {
}
