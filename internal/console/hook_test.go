package console

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// newHookConsole is a console without a policy set, for the hooks alone.
func newHookConsole(t *testing.T, topK int) *Console {
	t.Helper()
	c, err := New(Options{Policies: func() *policy.Set { return nil }, Pseudonyms: policy.NewPseudonyms(nil), TopK: topK})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// observeKey feeds one request of key (a digest, as bucket keys are) to policy pol through
// Observe at now.
func observeKey(c *Console, pol *policy.Policy, key bucket.Key, limited bool, now time.Time) {
	p := &policy.Plan{Charges: []bucket.Charge{{Key: key, Limit: pol.Limit}}, Policies: []*policy.Policy{pol},
		Values: []string{key.String()}}
	c.Observe(now, p, []bucket.Result{{Allowed: !limited}})
}

func digestKey(i int) bucket.Key {
	r := rand.New(rand.NewPCG(uint64(i), 99))
	var k bucket.Key
	for j := range k {
		k[j] = byte(r.Uint32())
	}
	return k
}

// TestObserveExactThenSampled checks the two regimes of the sketch: within a second's first
// exactPerSecond charges every charge counts once (exact counts), past them one in sampleEvery
// counts sampleEvery times; the per-second series count every charge in both.
func TestObserveExactThenSampled(t *testing.T) {
	c := newHookConsole(t, 10)
	pol := &policy.Policy{Name: "p", KeyKind: "header:x-client"}
	now := time.Unix(1_700_000_000, 0)
	for i := range exactPerSecond {
		observeKey(c, pol, digestKey(i%3), i%2 == 0, now)
	}
	exact := map[string]uint64{}
	for _, k := range c.top("p", 3, now) {
		exact[k.Key] = k.Requests
		if k.Requests != exactPerSecond/3 && k.Requests != exactPerSecond/3+1 || k.Error != 0 {
			t.Fatalf("exact regime: %+v, want each of 3 keys counted exactly (333 or 334)", k)
		}
	}
	const more = 80000
	for i := range more {
		observeKey(c, pol, digestKey(i%3), false, now)
	}
	pts := c.series("p", now)
	if last := pts[len(pts)-1]; last.Allowed+last.Limited != exactPerSecond+more || last.Limited != exactPerSecond/2 {
		t.Fatalf("series of the second: %+v, want every one of %d charges, %d limited", last, exactPerSecond+more, exactPerSecond/2)
	}
	// Past the first 1,000, a key's count grows by sampleEvery at a time (26,667 more charges
	// each would leave a remainder).
	for _, k := range c.top("p", 3, now) {
		if grew := k.Requests - exact[k.Key]; grew%sampleEvery != 0 || grew < more/3-more/30 || grew > more/3+more/30 {
			t.Errorf("sampled regime: %s grew by %d, want a multiple of %d near %d", k.Key, grew, sampleEvery, more/3)
		}
	}
}

// TestSampledCountsWithinBound feeds, in one second, a stream far past exactPerSecond in which
// clients repeat with a period (the pattern a sampler keyed on n mod 8 would be blind to: a key
// sent every 8th request would be counted all or never), and checks that each heavy key's count
// lies within the documented bound of its true count: error + 4 sqrt(sampleEvery * count).
func TestSampledCountsWithinBound(t *testing.T) {
	c := newHookConsole(t, 50)
	pol := &policy.Policy{Name: "p", KeyKind: "header:x-client"}
	now := time.Unix(1_700_000_000, 0)
	truth := map[bucket.Key]uint64{}
	r := rand.New(rand.NewPCG(5, 6))
	const n = 400000
	for i := range n {
		var k bucket.Key
		switch {
		case i%8 == 3: // one key, every 8th request
			k = digestKey(-1)
		case i%16 == 6: // another, every 16th
			k = digestKey(-2)
		case i%4 == 1: // five keys taking turns on every 4th request
			k = digestKey(-10 - (i/4)%5)
		default:
			k = digestKey(r.IntN(30000))
		}
		truth[k]++
		observeKey(c, pol, k, false, now)
	}
	listed := map[string]TopKey{}
	for _, tk := range c.top("p", 0, now) {
		listed[tk.Key] = tk
	}
	st := c.state("p")
	byKey := map[bucket.Key]topEntry{}
	for _, e := range st.cur.entries {
		byKey[e.key] = e
	}
	for _, id := range []int{-1, -2, -10, -11, -12, -13, -14} {
		k := digestKey(id)
		e, ok := byKey[k]
		f := float64(truth[k])
		if !ok {
			t.Errorf("key %d (true count %.0f) is not listed", id, f)
			continue
		}
		slack := float64(e.err) + 4*math.Sqrt(sampleEvery*f)
		if got := float64(e.requests); got < f-4*math.Sqrt(sampleEvery*f) || got > f+slack {
			t.Errorf("key %d: count %.0f (error %d), true %.0f: outside the bound", id, got, e.err, f)
		}
	}
	if len(listed) == 0 {
		t.Fatal("nothing listed")
	}
}

// BenchmarkObserveRLS is the rate limit service's hooks for one descriptor, under load (the
// clock stands still, so past the first exactPerSecond calls the sketch samples).
func BenchmarkObserveRLS(b *testing.B) {
	c, _, set, _ := newTestConsole(b, "admin_listen: 127.0.0.1:9090\n", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	es := []envoyrules.Entry{{Key: "k", Value: "v"}}
	var m envoyrules.Match
	if set.RLS().Domain("d").Match(es, &m) == nil {
		b.Fatal("no rule")
	}
	ch := &bucket.Charge{Key: m.Key(es), Limit: m.Rule.Limit}
	now := time.Unix(1_700_000_000, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := c.ExemptRLS(now, m.Rule, ch.Key); ok {
			b.Fatal("exempt")
		}
		c.ObserveRLS(now, "d", &m, es, ch, false)
	}
}

// TestObserveConcurrentSeries counts from several goroutines that reach each new second
// together, while the series and top lists are read: no charge may be lost to a slot's reset
// for a new second.
func TestObserveConcurrentSeries(t *testing.T) {
	c := newHookConsole(t, 20)
	pol := &policy.Policy{Name: "p", KeyKind: "header:x-client"}
	base := time.Unix(1_700_000_000, 0)
	const workers, per, perSecond = 4, 2400, 3 // 800 seconds, within the series' 900
	done := make(chan struct{})
	go func() { // a reader, as the page and the API are
		for {
			select {
			case <-done:
				return
			default:
				c.series("p", base.Add(time.Second*per/perSecond))
				c.top("p", 5, base)
			}
		}
	}()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range per {
				observeKey(c, pol, digestKey(w*per+i%50), i%5 == 0, base.Add(time.Duration(i/perSecond)*time.Second))
			}
		}()
	}
	close(start)
	wg.Wait()
	close(done)
	var allowed, limited uint32
	for _, pt := range c.series("p", base.Add(time.Second*per/perSecond)) {
		allowed += pt.Allowed
		limited += pt.Limited
	}
	if allowed+limited != workers*per || limited != workers*per/5 {
		t.Fatalf("series counted %d allowed + %d limited, want %d charges, %d limited", allowed, limited, workers*per, workers*per/5)
	}
}
