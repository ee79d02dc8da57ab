package redisstore_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
)

// TestScriptReloadedAfterFlush: Redis forgets its scripts (SCRIPT FLUSH, a restart, a failover);
// the next decision sends the source again and decides.
func TestScriptReloadedAfterFlush(t *testing.T) {
	c, _ := newClient(t, &single)
	s := redisstore.New(c, redisstore.Options{KeyPrefix: "flush:"})
	defer s.Close()
	ctx := context.Background()
	ch := []bucket.Charge{{Key: buckettest.NewKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 5, Window: time.Minute}}}
	r := make([]bucket.Result, 1)
	now := time.Now()
	for i := range 3 {
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		ok, err := s.Take(ctx, now, ch, r)
		if err != nil || !ok || r[0].Remaining != int64(4-i) {
			t.Fatalf("take %d after SCRIPT FLUSH: admitted=%v %+v %v, want remaining %d", i, ok, r[0], err, 4-i)
		}
	}
}

// TestKeysAreDigestsWithExpiry: every key the store writes is prefix{32 hex}:kind and expires.
func TestKeysAreDigestsWithExpiry(t *testing.T) {
	c, _ := newClient(t, &single)
	prefix := "keys" + buckettest.NewKey(t).String()[:8] + ":"
	s := redisstore.New(c, redisstore.Options{KeyPrefix: prefix})
	defer s.Close()
	ctx := context.Background()
	now := time.Now()
	var cs []bucket.Charge
	for _, l := range []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}, {Algorithm: bucket.LeakyBucket, Rate: 1, Burst: 2},
		{Algorithm: bucket.FixedWindow, Count: 2, Window: time.Hour}, {Algorithm: bucket.SlidingWindow, Count: 2, Window: time.Hour},
		{Algorithm: bucket.Quota, Count: 2, Period: bucket.Month}, {Algorithm: bucket.Concurrency, Count: 2},
	} {
		cs = append(cs, bucket.Charge{Key: buckettest.NewKey(t), Limit: l})
	}
	r := make([]bucket.Result, len(cs))
	if ok, err := s.Take(ctx, now, cs, r); err != nil || !ok {
		t.Fatalf("take: %v %v", ok, err)
	}
	if _, err := s.PutExemption(ctx, "ex1", []byte(`{"id":"ex1"}`), now.Add(time.Hour), 10); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Do(ctx, c.B().Keys().Pattern(prefix+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `(\{[0-9a-f]{32}\}:[bfsc]|\{admin\}:(exemptions|expiry))$`)
	if len(keys) != len(cs)+2 {
		t.Errorf("got keys %v, want %d", keys, len(cs)+2)
	}
	for _, k := range keys {
		if !re.MatchString(k) {
			t.Errorf("key %q does not match %s", k, re)
		}
		if ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64(); err != nil || ttl <= 0 {
			t.Errorf("key %q: PTTL %d %v, want an expiry", k, ttl, err)
		}
	}
}

func TestPeekResetAndExemptions(t *testing.T) {
	s := newStore(t, &single)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	c := bucket.Charge{Key: buckettest.NewKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 3}}
	r := make([]bucket.Result, 1)
	for range 3 {
		if _, err := s.Take(ctx, now, []bucket.Charge{c}, r); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.Peek(ctx, now, c)
	if err != nil || p.Allowed || p.Remaining != 0 || p.Reset != 3*time.Second || p.RetryAfter != time.Second {
		t.Errorf("peek of a spent bucket: %+v %v, want not allowed, 0 left, reset 3s, retry 1s", p, err)
	}
	if err := s.Reset(ctx, now, c); err != nil {
		t.Fatal(err)
	}
	if p, err = s.Peek(ctx, now, c); err != nil || !p.Allowed || p.Remaining != 3 || p.Reset != 0 {
		t.Errorf("peek after reset: %+v %v, want 3 left", p, err)
	}

	exp := time.Now().Add(time.Hour)
	for i, id := range []string{"a", "b", "c"} {
		stored, err := s.PutExemption(ctx, id, []byte(`{"id":"`+id+`"}`), exp, 2)
		if err != nil || stored != (i < 2) {
			t.Errorf("put %s: stored=%v %v, want %v (at most 2)", id, stored, err, i < 2)
		}
	}
	if _, err := s.PutExemption(ctx, "old", []byte(`{}`), time.Now().Add(-time.Second), 5); err != nil {
		t.Fatal(err)
	}
	got, err := s.Exemptions(ctx)
	if err != nil || len(got) != 2 {
		t.Errorf("exemptions: %q %v, want a and b (the expired one gone)", got, err)
	}
	if found, err := s.DeleteExemption(ctx, "a"); err != nil || !found {
		t.Errorf("delete a: %v %v, want found", found, err)
	}
	if found, err := s.DeleteExemption(ctx, "a"); err != nil || found {
		t.Errorf("delete a again: %v %v, want not found", found, err)
	}
	if got, _ := s.Exemptions(ctx); len(got) != 1 || string(got[0]) != `{"id":"b"}` {
		t.Errorf("exemptions after delete: %q, want b", got)
	}
}
