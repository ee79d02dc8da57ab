package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// slotStores returns n Stores on one table (replicas), each closed at the end of the test.
func slotStores(t *testing.T, n int, o dynamo.Options) []*dynamo.Store {
	t.Helper()
	api, table := localTable(t)
	o.Table = table
	var ss []*dynamo.Store
	for range n {
		s := dynamo.New(api, o)
		t.Cleanup(func() { s.Close() })
		ss = append(ss, s)
	}
	return ss
}

func takeSlot(t *testing.T, s bucket.Store, now time.Time, c bucket.Charge) (bool, bucket.Result) {
	t.Helper()
	var r [1]bucket.Result
	ok, err := s.Take(context.Background(), now, []bucket.Charge{c}, r[:])
	if err != nil {
		t.Fatalf("Take at %v: %v", now, err)
	}
	return ok, r[0]
}

// A replica that crashes (stops renewing) while holding slots loses them SlotLease after its
// last renewal: the first take that finds the key full then reaps them.
func TestSlotLeaseExpiresAfterCrash(t *testing.T) {
	const lease = 10 * time.Second
	reg := prometheus.NewRegistry()
	ss := slotStores(t, 2, dynamo.Options{SlotLease: lease, Registerer: reg})
	a, b := ss[0], ss[1]
	c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 2}}
	for i := range 2 {
		if ok, _ := takeSlot(t, a, t0, c); !ok {
			t.Fatalf("replica A, slot %d: refused, want admitted", i+1)
		}
	}
	a.Close() // A crashes: its slots are never released nor renewed
	if ok, r := takeSlot(t, b, t0.Add(lease-time.Millisecond), c); ok || r.RetryAfter != time.Second {
		t.Errorf("replica B just before the leases expire: got admitted=%v %+v, want refused with RetryAfter 1s", ok, r)
	}
	ok, r := takeSlot(t, b, t0.Add(lease+time.Millisecond), c)
	if !ok || r.Remaining != 1 {
		t.Errorf("replica B after the leases expired: got admitted=%v %+v, want admitted with Remaining 1 (both reaped)", ok, r)
	}
	if got := metricValue(t, reg, "ratelimit_store_requests_total", "reap"); got != 1 {
		t.Errorf("reap writes: got %v, want 1 (both slots in one write)", got)
	}
}

// A live replica renews its leases, so its slots do not expire; a slot reaped anyway (the
// replica stalled past its lease) is gone for good: its late release frees nobody else's slot.
func TestSlotLeaseRenewedAndReleaseOnlyOwnSlot(t *testing.T) {
	const lease = 10 * time.Second
	ss := slotStores(t, 3, dynamo.Options{SlotLease: lease})
	a, b, c3 := ss[0], ss[1], ss[2]
	c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 1}}
	ok, ra := takeSlot(t, a, t0, c)
	if !ok {
		t.Fatal("replica A: refused, want admitted")
	}
	if err := a.RenewLeases(context.Background(), t0.Add(8*time.Second)); err != nil {
		t.Fatalf("RenewLeases: %v", err)
	}
	if ok, _ := takeSlot(t, b, t0.Add(12*time.Second), c); ok {
		t.Errorf("replica B after A renewed: admitted, want refused (A's lease runs to t0+18s)")
	}
	if ok, _ := takeSlot(t, b, t0.Add(18*time.Second+time.Millisecond), c); !ok {
		t.Fatalf("replica B after A's renewed lease expired: refused, want admitted")
	}
	// A's request ends now, long after its slot was reaped and given to B.
	if err := a.Release(context.Background(), t0.Add(19*time.Second), []bucket.Taken{{Charge: c, At: t0, Token: ra.Token}}); err != nil {
		t.Fatalf("late release of the reaped slot: %v", err)
	}
	if ok, _ := takeSlot(t, c3, t0.Add(19*time.Second), c); ok {
		t.Errorf("replica C after A's late release: admitted, want refused (B's slot is still taken)")
	}
	// And A's renewals forget the slot it lost.
	if err := a.RenewLeases(context.Background(), t0.Add(20*time.Second)); err != nil {
		t.Fatalf("RenewLeases after losing the slot: %v", err)
	}
}

// Several replicas, many goroutines each: take, hold, release. Never more than the limit are
// held at once, counted by the test, and every slot comes back.
func TestSlotsNeverOverAdmitAcrossReplicas(t *testing.T) {
	var rs []bucket.Releaser
	for _, s := range slotStores(t, 3, dynamo.Options{}) {
		rs = append(rs, s)
	}
	buckettest.ConcurrencyInFlight(t, rs, time.Now, 5)
}
