package memstore_test

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// The benchmarks pass an advancing instant (now.Add(step) per operation, per goroutine) instead
// of reading the clock, for the memory store and for the x/time/rate baseline alike. At 10µs per operation
// a hot key is mostly over its limit, and each of 100k rotating keys has refilled by the time it
// comes round again.
const benchStep = 10 * time.Microsecond

var benchLimits = []struct {
	name  string
	limit bucket.Limit
}{
	{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1000, Burst: 100}},
	{"LeakyBucket", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1000, Burst: 100}},
	{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 100, Window: 100 * time.Millisecond}},
	{"SlidingWindow", bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 100, Window: 100 * time.Millisecond}},
	// A daily quota: every benchmark stays within one day, so this is the decision within a
	// period (the calendar is read once per key and period, when the key is first taken).
	{"Quota", bucket.Limit{Algorithm: bucket.Quota, Count: 100, Period: bucket.Day}},
	// A concurrency decision is a whole request's cost: the slot taken, then given back.
	{"Concurrency", bucket.Limit{Algorithm: bucket.Concurrency, Count: 100}},
}

var benchKeyCounts = []struct {
	name string
	n    int
}{{"HotKey", 1}, {"Keys100k", 100_000}}

// seq hands each parallel goroutine its own starting offset into the key list.
var seq atomic.Uint64

func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	for _, bl := range benchLimits {
		for _, kc := range benchKeyCounts {
			keys := randomKeys(kc.n)
			newStore := func(b *testing.B) *memstore.Store {
				m := memstore.New(memstore.Options{})
				var r [1]bucket.Result
				for _, k := range keys {
					if _, err := m.Take(ctx, t0, []bucket.Charge{{Key: k, Limit: bl.limit}}, r[:]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				return m
			}
			b.Run(bl.name+"/"+kc.name+"/Serial", func(b *testing.B) {
				m := newStore(b)
				charges := []bucket.Charge{{Limit: bl.limit}}
				var r [1]bucket.Result
				var taken [1]bucket.Taken
				now := t0
				for i := range b.N {
					charges[0].Key = keys[i%len(keys)]
					now = now.Add(benchStep)
					ok, err := m.Take(ctx, now, charges, r[:])
					if err != nil {
						b.Fatal(err)
					}
					if ok && bl.limit.Algorithm == bucket.Concurrency {
						taken[0] = bucket.Taken{Charge: charges[0], At: now}
						_ = m.Release(ctx, now, taken[:])
					}
				}
			})
			b.Run(bl.name+"/"+kc.name+"/Parallel", func(b *testing.B) {
				m := newStore(b)
				b.RunParallel(func(pb *testing.PB) {
					charges := []bucket.Charge{{Limit: bl.limit}}
					var r [1]bucket.Result
					var taken [1]bucket.Taken
					now := t0
					i := int(seq.Add(7919))
					for pb.Next() {
						i++
						charges[0].Key = keys[i%len(keys)]
						now = now.Add(benchStep)
						ok, err := m.Take(ctx, now, charges, r[:])
						if err != nil {
							b.Error(err)
							return
						}
						if ok && bl.limit.Algorithm == bucket.Concurrency {
							taken[0] = bucket.Taken{Charge: charges[0], At: now}
							_ = m.Release(ctx, now, taken[:])
						}
					}
				})
			})
		}
	}
}

// BenchmarkMemoryGroup3 takes groups of three charges (three policies) on 100k rotating keys.
func BenchmarkMemoryGroup3(b *testing.B) {
	ctx := context.Background()
	keys := randomKeys(100_000)
	m := memstore.New(memstore.Options{})
	charges := []bucket.Charge{{Limit: benchLimits[0].limit}, {Limit: benchLimits[2].limit}, {Limit: benchLimits[3].limit}}
	var r [3]bucket.Result
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		for j := range charges {
			charges[j].Key = keys[(i+j*33_331)%len(keys)]
		}
		now = now.Add(benchStep)
		if _, err := m.Take(ctx, now, charges, r[:]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryBytesPerKey(b *testing.B) { benchBytesPerKey(b, tokenTen) }

// BenchmarkMemorySlidingBytesPerKey is BenchmarkMemoryBytesPerKey for sliding-window keys, whose
// state the store keeps in 32 bytes (a SlidingState's compact form) against a token bucket's 8.
func BenchmarkMemorySlidingBytesPerKey(b *testing.B) { benchBytesPerKey(b, slidingTen) }

// benchBytesPerKey reports the heap per key of a memory store holding 1M live keys of l.
func benchBytesPerKey(b *testing.B, l bucket.Limit) {
	keys := randomKeys(1_000_000)
	var sum float64
	for range b.N {
		sum += heapBytesPerKey(b, keys, l)
	}
	b.ReportMetric(sum/float64(b.N), "B/key")
}

// xrateMap is the baseline: one x/time/rate Limiter per key in a map behind a mutex.
type xrateMap struct {
	mu    sync.Mutex
	m     map[bucket.Key]*rate.Limiter
	limit rate.Limit
	burst int
}

func newXrateMap(l bucket.Limit) *xrateMap {
	return &xrateMap{m: make(map[bucket.Key]*rate.Limiter), limit: rate.Limit(l.Rate), burst: int(l.Burst)}
}

func (x *xrateMap) allow(k bucket.Key, now time.Time) bool {
	x.mu.Lock()
	lim := x.m[k]
	if lim == nil {
		lim = rate.NewLimiter(x.limit, x.burst)
		x.m[k] = lim
	}
	x.mu.Unlock()
	return lim.AllowN(now, 1)
}

// xrateSharded is the baseline spread over 256 independently locked maps.
type xrateSharded [256]xrateMap

func newXrateSharded(l bucket.Limit) *xrateSharded {
	var s xrateSharded
	for i := range s {
		s[i] = *newXrateMap(l)
	}
	return &s
}

func (s *xrateSharded) allow(k bucket.Key, now time.Time) bool {
	return s[binary.LittleEndian.Uint64(k[:8])%uint64(len(s))].allow(k, now)
}

// BenchmarkXRate does the token-bucket job of BenchmarkMemory/TokenBucket with x/time/rate.
func BenchmarkXRate(b *testing.B) {
	l := benchLimits[0].limit
	for _, impl := range []struct {
		name string
		new  func() func(bucket.Key, time.Time) bool
	}{
		{"Mutex", func() func(bucket.Key, time.Time) bool { return newXrateMap(l).allow }},
		{"Sharded", func() func(bucket.Key, time.Time) bool { return newXrateSharded(l).allow }},
	} {
		for _, kc := range benchKeyCounts {
			keys := randomKeys(kc.n)
			newAllow := func(b *testing.B) func(bucket.Key, time.Time) bool {
				allow := impl.new()
				for _, k := range keys {
					allow(k, t0)
				}
				b.ReportAllocs()
				b.ResetTimer()
				return allow
			}
			b.Run(impl.name+"/"+kc.name+"/Serial", func(b *testing.B) {
				allow := newAllow(b)
				now := t0
				for i := range b.N {
					now = now.Add(benchStep)
					allow(keys[i%len(keys)], now)
				}
			})
			b.Run(impl.name+"/"+kc.name+"/Parallel", func(b *testing.B) {
				allow := newAllow(b)
				b.RunParallel(func(pb *testing.PB) {
					now := t0
					i := int(seq.Add(7919))
					for pb.Next() {
						i++
						now = now.Add(benchStep)
						allow(keys[i%len(keys)], now)
					}
				})
			})
		}
	}
}
