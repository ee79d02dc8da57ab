package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestMemoryPeekMatchesRemaining takes requests one by one and checks, after each, that a peek at
// the same instant says what the request's Remaining said, that the peek charged nothing, and
// that Reset makes the key full again.
func TestMemoryPeekMatchesRemaining(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	limits := map[string]bucket.Limit{
		"token":       {Algorithm: bucket.TokenBucket, Rate: 1, Burst: 5},
		"leaky":       {Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 5},
		"fixed":       {Algorithm: bucket.FixedWindow, Count: 5, Window: time.Minute},
		"sliding":     {Algorithm: bucket.SlidingWindow, Count: 5, Window: time.Minute},
		"concurrency": {Algorithm: bucket.Concurrency, Count: 5},
		"quota":       {Algorithm: bucket.Quota, Count: 5, Period: bucket.Day},
	}
	ctx := context.Background()
	for name, l := range limits {
		t.Run(name, func(t *testing.T) {
			m := New(Options{})
			c := bucket.Charge{Key: bucket.Key{1, 2, 3}, Limit: l}
			admits := int64(5)
			if l.Algorithm == bucket.LeakyBucket {
				admits = 6 // the request served and the 5 queue places behind it
			}
			p, err := m.Peek(ctx, t0, c)
			if err != nil || !p.Allowed || p.Remaining != admits || p.Limit != 5 {
				t.Fatalf("fresh key: got %+v, %v; want allowed, remaining %d, limit 5", p, err, admits)
			}
			res := make([]bucket.Result, 1)
			for i := range admits + 2 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				if _, err := m.Take(ctx, now, []bucket.Charge{c}, res); err != nil {
					t.Fatal(err)
				}
				p, err := m.Peek(ctx, now, c)
				if err != nil {
					t.Fatal(err)
				}
				if p.Remaining != res[0].Remaining {
					t.Fatalf("request %d: peek remaining %d, want the header's %d", i, p.Remaining, res[0].Remaining)
				}
				if wantLimited := i >= admits-1; p.Allowed == wantLimited {
					t.Fatalf("request %d: peek allowed %v, want %v", i, p.Allowed, !wantLimited)
				}
				if !p.Allowed && l.Algorithm != bucket.LeakyBucket && p.RetryAfter <= 0 {
					t.Fatalf("request %d: limited without a retry-after: %+v", i, p)
				}
			}
			// The peeks charged nothing: exactly 5 (the limit) were admitted above, so a sixth
			// is still refused; after a reset the next is admitted and the key is full less one.
			now := t0.Add(10 * time.Millisecond)
			if ok, _ := m.Take(ctx, now, []bucket.Charge{c}, res); ok {
				t.Fatalf("admitted past the limit before the reset: %+v", res[0])
			}
			if err := m.Reset(ctx, now, c); err != nil {
				t.Fatal(err)
			}
			if ok, _ := m.Take(ctx, now, []bucket.Charge{c}, res); !ok || res[0].Remaining != admits-1 {
				t.Fatalf("after reset: admitted %v remaining %d, want true %d", ok, res[0].Remaining, admits-1)
			}
		})
	}
}

// TestMemoryPeekGCRAReset checks a token bucket's Reset: the time until the bucket is full.
func TestMemoryPeekGCRAReset(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	m := New(Options{})
	c := bucket.Charge{Key: bucket.Key{9}, Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 10}}
	res := make([]bucket.Result, 1)
	for range 3 {
		_, _ = m.Take(context.Background(), t0, []bucket.Charge{c}, res)
	}
	p, _ := m.Peek(context.Background(), t0, c)
	if p.Reset != res[0].Reset || p.Reset != 300*time.Millisecond {
		t.Fatalf("reset %v, want the last request's %v (300ms)", p.Reset, res[0].Reset)
	}
	p, _ = m.Peek(context.Background(), t0.Add(time.Second), c)
	if p.Reset != 0 || p.Remaining != 10 {
		t.Fatalf("a second later: %+v, want full (reset 0, remaining 10)", p)
	}
}
