package dynamo_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// adminTable is a table of one console test alone, deleted when it ends: the console's shared
// items (resets, exemptions) must not meet the tests that scan the suite's table for digests only.
func adminTable(t *testing.T) (*dynamodb.Client, string) {
	t.Helper()
	api, _ := localTable(t)
	name := randomName("ratelimit-admin-test")
	if err := createTableWithoutTTL(context.Background(), api, name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = api.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: &name})
	})
	return api, name
}

// TestAdminPeekResetTwoReplicas checks, per algorithm, on two Stores of one table with deny
// caches: a peek says what the last request's Remaining said and charges nothing; a reset made
// through one replica admits the next request on it at once and on the other once it has read
// the shared resets (its deny cache, hints and slot cache dropped).
func TestAdminPeekResetTwoReplicas(t *testing.T) {
	api, table := adminTable(t)
	limits := map[string]bucket.Limit{
		"token":       {Algorithm: bucket.TokenBucket, Rate: 1.0 / 3600, Burst: 3},
		"fixed":       {Algorithm: bucket.FixedWindow, Count: 3, Window: time.Hour},
		"sliding":     {Algorithm: bucket.SlidingWindow, Count: 3, Window: time.Hour},
		"quota":       {Algorithm: bucket.Quota, Count: 3, Period: bucket.Day},
		"concurrency": {Algorithm: bucket.Concurrency, Count: 3},
	}
	for name, l := range limits {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a := dynamo.New(api, dynamo.Options{Table: table, DenyCache: true})
			b := dynamo.New(api, dynamo.Options{Table: table, DenyCache: true})
			t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
			var key bucket.Key
			_, _ = rand.Read(key[:])
			c := bucket.Charge{Key: key, Limit: l}
			now := time.Now()
			res := make([]bucket.Result, 1)
			for i := range 3 {
				if ok, err := a.Take(ctx, now, []bucket.Charge{c}, res); err != nil || !ok {
					t.Fatalf("take %d: %v %v", i, ok, err)
				}
				p, err := a.Peek(ctx, now, c)
				if err != nil {
					t.Fatal(err)
				}
				if p.Remaining != res[0].Remaining || p.Allowed != (i < 2) || p.Limit != 3 {
					t.Fatalf("after take %d: peek %+v, want remaining %d (the take's), allowed %v", i, p, res[0].Remaining, i < 2)
				}
			}
			for _, s := range []*dynamo.Store{a, b, b} { // b twice: its second answer may come from its deny cache
				if ok, _ := s.Take(ctx, now, []bucket.Charge{c}, res); ok {
					t.Fatalf("admitted past the limit: %+v", res[0])
				}
			}
			if err := a.Reset(ctx, now, c); err != nil {
				t.Fatal(err)
			}
			if p, _ := a.Peek(ctx, now, c); !p.Allowed || p.Remaining != 3 {
				t.Fatalf("peek after reset: %+v, want full", p)
			}
			if _, err := b.Exemptions(ctx); err != nil { // what each replica does every second
				t.Fatal(err)
			}
			for _, s := range []*dynamo.Store{b, a} {
				if ok, err := s.Take(ctx, now, []bucket.Charge{c}, res); err != nil || !ok {
					t.Fatalf("after reset: admitted %v (%v), want admitted: %+v", ok, err, res[0])
				}
			}
		})
	}
}

// TestAdminExemptionsShared checks that an exemption stored through one Store is read by another
// and removed for both.
func TestAdminExemptionsShared(t *testing.T) {
	api, table := adminTable(t)
	ctx := context.Background()
	a := dynamo.New(api, dynamo.Options{Table: table})
	b := dynamo.New(api, dynamo.Options{Table: table})
	var id [8]byte
	_, _ = rand.Read(id[:])
	name := "ex_test" + string('a'+id[0]%26) + time.Now().Format("150405.000000")
	if ok, err := a.PutExemption(ctx, name, []byte(`{"id":"`+name+`"}`), time.Now().Add(time.Hour), 10); err != nil || !ok {
		t.Fatal(ok, err)
	}
	has := func(s *dynamo.Store) bool {
		all, err := s.Exemptions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range all {
			if string(e) == `{"id":"`+name+`"}` {
				return true
			}
		}
		return false
	}
	if !has(b) {
		t.Fatal("the other replica does not see the exemption")
	}
	if found, err := b.DeleteExemption(ctx, name); err != nil || !found {
		t.Fatal(found, err)
	}
	if has(a) {
		t.Fatal("the exemption is still there after its deletion")
	}
}
