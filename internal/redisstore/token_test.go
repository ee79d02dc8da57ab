package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/fallback"
)

// TestGiveBacksThroughFallbackReachRedis: the gateway wraps the store in package fallback,
// which tags the tokens of its local store's decisions with the top bit. A Redis token with
// that bit set was handed to the local store, and the give-back (charge_on, an RLS hits_addend 0
// check) never reached Redis: the RLS's check consumed what it should not have. 64 take and
// give-back rounds through the fallback must leave the window as full as before (random tokens
// with the top bit free in all 64 rounds: 1 in 2^64).
func TestGiveBacksThroughFallbackReachRedis(t *testing.T) {
	rs := newStore(t, &single)
	fs, err := fallback.New(rs, fallback.Options{OnError: bucket.Local, Replicas: 1, MaxKeys: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Now()
	c := bucket.Charge{Key: buckettest.NewKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Hour}, MayGiveBack: true}
	r := make([]bucket.Result, 1)
	for i := range 64 {
		ok, err := fs.Take(ctx, now, []bucket.Charge{c}, r)
		if err != nil || !ok {
			t.Fatalf("round %d: take %v %v", i, ok, err)
		}
		if r[0].Token >= 1<<62 {
			t.Errorf("round %d: token %#x uses the top bits that wrapping stores tag theirs with", i, r[0].Token)
		}
		if err := fs.Release(ctx, now, []bucket.Taken{{Charge: c, At: now, Token: r[0].Token}}); err != nil {
			t.Fatal(err)
		}
		p, err := rs.Peek(ctx, now, c)
		if err != nil {
			t.Fatal(err)
		}
		if p.Remaining != 5 {
			t.Fatalf("round %d: %d remaining after the give-back, want 5 (token %#x)", i, p.Remaining, r[0].Token)
		}
	}
}
