package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// TestGiveBackIssueExample is issue 17's example on the memory store: burst 2 at 1/s; A at 0 s
// (later given back), B at 0.5 s, A given back at 0.501 s, then C at 0.501 s and E at 1.0 s. A
// bucket that never saw A admits two of B, C and E (B leaves tat 1.5 s; C at 0.501 s makes it
// 2.5 s; E at 1 s would make it 3.5 s, 2.5 s ahead of a 2 s tolerance). Giving A's whole second
// back after B was decided hands back the half second of refill that B's write had already lost
// to the cap (A's write left tat 1 s, B found it there and not at 0.5 s).
func TestGiveBackIssueExample(t *testing.T) {
	ctx := context.Background()
	m := memstore.New(memstore.Options{})
	c := bucket.Charge{Key: bucket.Key{1}, Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 2}, MayGiveBack: true}
	take := func(at time.Duration) (bool, bucket.Taken) {
		t.Helper()
		var r [1]bucket.Result
		ok, err := m.Take(ctx, t0.Add(at), []bucket.Charge{c}, r[:])
		if err != nil {
			t.Fatal(err)
		}
		return ok, bucket.Taken{Charge: c, At: t0.Add(at), Token: r[0].Token}
	}
	okA, a := take(0)
	if !okA {
		t.Fatalf("A at 0 s: rejected, want admitted")
	}
	okB, _ := take(ms(500))
	if err := m.Release(ctx, t0.Add(ms(501)), []bucket.Taken{a}); err != nil {
		t.Fatal(err)
	}
	okC, _ := take(ms(501))
	okE, _ := take(sec(1))
	admitted := 0
	for _, ok := range []bool{okB, okC, okE} {
		if ok {
			admitted++
		}
	}
	if admitted > 2 {
		t.Errorf("B, C, E admitted: got %v %v %v (%d), want at most 2: a bucket that never saw A admits two", okB, okC, okE, admitted)
	}
	// B wrote after A, so A's give-back gives nothing (stricter): C does not fit.
	if !okB || okC || !okE {
		t.Errorf("B, C, E: got %v %v %v, want true false true (A is not given back once B wrote)", okB, okC, okE)
	}
}

// TestMemoryGiveBackAdversary runs the give-back adversary of the conformance suite on the
// memory store: thousands of random histories of takes and give-backs on every algorithm, each
// verdict checked against the history without the given-back charges.
func TestMemoryGiveBackAdversary(t *testing.T) {
	histories := 4000
	if testing.Short() {
		histories = 500
	}
	for _, seed := range []uint64{1, 2} {
		buckettest.RunGiveBack(t, func(*testing.T) bucket.Releaser { return memstore.New(memstore.Options{}) },
			buckettest.GiveBackOptions{Seed: seed, Histories: histories})
	}
}

// TestMemoryGivesBackWeightedQuota: the memory store gives a weighted quota charge back whole.
func TestMemoryGivesBackWeightedQuota(t *testing.T) {
	m := memstore.New(memstore.Options{})
	c := bucket.Charge{Key: keyN(7), Limit: bucket.Limit{Algorithm: bucket.Quota, Count: 10, Period: bucket.Month}, Cost: 4}
	ok, r := takeAt(t, m, t0, c)
	if !ok || r[0].Remaining != 6 {
		t.Fatalf("take: got %v %+v, want admitted with 6 left", ok, r[0])
	}
	if err := m.Release(context.Background(), t0, []bucket.Taken{{Charge: c, At: t0, Token: r[0].Token}}); err != nil {
		t.Fatal(err)
	}
	if ok, r := takeAt(t, m, t0, c); !ok || r[0].Remaining != 6 {
		t.Errorf("take after the release: got %v %+v, want admitted with 6 left (the 4 came back)", ok, r[0])
	}
}
