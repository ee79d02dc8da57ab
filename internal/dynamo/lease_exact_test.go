package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// Adversarial tests of leases (issue 17): give-backs never leave the table roomier, a re-sent
// lease write or give-back is applied once, no capacity is stranded, and every leased unit is
// accounted for as spent, refunded or expired. They run against DynamoDB Local on simulated
// instants (the lease code's clock is the decisions' now; the sweeper's is frozen).

// errLost stands for an answer lost on the way back (a connection reset after the request was
// sent): not an answer of DynamoDB's, so the SDK would retry it when allowed.
var errLost = errors.New("connection reset by peer (answer lost)")

// lossyAPI forwards calls to a real table and loses the answers of the UpdateItems that lose
// picks, after they were applied. Where the call's options let the SDK retry (its standard
// retryer re-sends a call whose answer was lost), the write is sent again and the second
// answer returned: exactly what the SDK does. Where they do not (one attempt), the caller gets
// errLost.
type lossyAPI struct {
	dynamo.API
	lose func(in *dynamodb.UpdateItemInput) bool

	mu           sync.Mutex
	lost, resent int
}

// retried reports whether the SDK would re-send a call made with optFns on a client that
// retries (as NewClient's does).
func retried(optFns []func(*dynamodb.Options)) bool {
	o := dynamodb.Options{RetryMaxAttempts: 2}
	for _, f := range optFns {
		f(&o)
	}
	if _, nop := o.Retryer.(aws.NopRetryer); nop {
		return false
	}
	return o.RetryMaxAttempts != 1
}

// isLeaseWrite reports whether in is a lease write (not a give-back).
func isLeaseWrite(in *dynamodb.UpdateItemInput) bool {
	return strings.Contains(pkOfInput(in), "#l") && !isGiveBack(in)
}

// isGiveBack reports whether in gives a lease's units back.
func isGiveBack(in *dynamodb.UpdateItemInput) bool {
	e := aws.ToString(in.UpdateExpression)
	return strings.Contains(pkOfInput(in), "#l") && (strings.Contains(e, ":minus") || strings.HasPrefix(e, "SET #tat = :to"))
}

func pkOfInput(in *dynamodb.UpdateItemInput) string { return pkOf(in.Key) }

func (l *lossyAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if l.lose == nil || !l.lose(in) {
		return l.API.UpdateItem(ctx, in, o...)
	}
	_, err := l.API.UpdateItem(ctx, in, o...)
	if err != nil {
		return nil, err // not applied: nothing to lose
	}
	l.mu.Lock()
	l.lost++
	resend := retried(o)
	if resend {
		l.resent++
	}
	l.mu.Unlock()
	if !resend {
		return nil, errLost
	}
	return l.API.UpdateItem(ctx, in, o...)
}

// takeAt decides charges on s at at with a generous deadline, failing the test on an error.
func takeAt(t *testing.T, s *dynamo.Store, at time.Time, charges ...bucket.Charge) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := s.Take(ctx, at, charges, make([]bucket.Result, len(charges)))
	if err != nil {
		t.Fatalf("Take at +%v: %v", at.Sub(t0), err)
	}
	return ok
}

func closeLeases(t *testing.T, s *dynamo.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.CloseLeases(ctx); err != nil {
		t.Errorf("CloseLeases: %v", err)
	}
}

// units reads lease_units_total{outcome} from reg.
func units(t *testing.T, reg prometheus.Gatherer, outcome string) float64 {
	t.Helper()
	return testutil.ToFloat64(leaseUnits(t, reg, outcome))
}

// heldGauge reads ratelimit_dynamodb_lease_units_held from reg.
func heldGauge(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ratelimit_dynamodb_lease_units_held" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no ratelimit_dynamodb_lease_units_held")
	return 0
}

// TestLeaseGiveBackNeverRoomier is the example on a leased token bucket: A leases at 0
// and gives its unspent units back after B's lease landed at 0.5 s; then C takes what it can at
// 0.5 s and 1 s. A bucket that never saw A's units admits at most burst + rate x 0.5 s to B and C
// together; a give-back that moved tat back past B's lease would hand out more.
func TestLeaseGiveBackNeverRoomier(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 20}
	lease := bucket.Lease{Shards: 1, TTL: 200 * time.Millisecond}
	c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: lease}
	gate := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
	reg := prometheus.NewRegistry()
	var stores []*dynamo.Store
	for range 3 {
		s := dynamo.New(api, dynamo.Options{Table: table, Now: frozen, Registerer: reg})
		dynamo.SetLeaseShift(s, 0)
		stores = append(stores, s)
	}
	a, b, cc := stores[0], stores[1], stores[2]
	if !takeAt(t, a, t0, gate) {
		t.Fatal("the gate's only request was rejected")
	}
	// A leases 8 units at 0 for a group the gate rejects: all 8 stay unspent in A's grant.
	big := c
	big.Cost = 8
	if takeAt(t, a, t0, big, gate) {
		t.Fatal("the gated group was admitted")
	}
	dynamo.Settle(a)
	// B leases and spends at 0.5 s, after A.
	half := t0.Add(500 * time.Millisecond)
	admitted := 0
	for range 40 {
		if takeAt(t, b, half, c) {
			admitted++
		}
		dynamo.Settle(b)
	}
	// A's grant expires at 0.501 s: its units go back where that is exact.
	takeAt(t, a, half.Add(time.Millisecond), gate)
	closeLeases(t, a)
	for _, at := range []time.Time{half.Add(time.Millisecond), t0.Add(time.Second)} {
		for range 40 {
			if takeAt(t, cc, at, c) {
				admitted++
			}
			dynamo.Settle(cc)
		}
	}
	closeLeases(t, b)
	closeLeases(t, cc)
	// From 0.5 s to 1 s: at most the burst plus 0.5 s of refill.
	if most := int(limit.Burst) + 5; admitted > most {
		t.Errorf("B and C admitted %d in [0.5 s, 1 s], want at most %d (a bucket that never saw A's units)", admitted, most)
	}
	t.Logf("admitted %d; units leased %v refunded %v expired %v", admitted, units(t, reg, "leased"), units(t, reg, "refunded"), units(t, reg, "expired"))
}

// TestLeaseWritesSentOnce: a lease write whose answer is lost must not be applied twice by the
// SDK's retryer (a window's ADD n twice takes 2n and grants n: n units held by no one for the
// rest of the window). One replica with every lease write's first answer lost must still reach
// the window's whole limit once the lost units are... never taken twice.
func TestLeaseWritesSentOnce(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 20, Window: time.Hour}
	c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: bucket.Lease{Shards: 1, TTL: time.Second}}
	var dropped atomic.Int64
	lossy := &lossyAPI{API: api, lose: func(in *dynamodb.UpdateItemInput) bool {
		// The answer of every third lease write is lost.
		return isLeaseWrite(in) && dropped.Add(1)%3 == 0
	}}
	reg := prometheus.NewRegistry()
	s := dynamo.New(lossy, dynamo.Options{Table: table, Now: frozen, Registerer: reg})
	admitted, failed := 0, 0
	for i := range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := s.Take(ctx, t0.Add(time.Duration(i)*time.Millisecond), []bucket.Charge{c}, make([]bucket.Result, 1))
		cancel()
		switch {
		case err != nil:
			failed++
		case ok:
			admitted++
		}
		dynamo.Settle(s)
	}
	closeLeases(t, s)
	lossy.mu.Lock()
	lost, resent := lossy.lost, lossy.resent
	lossy.mu.Unlock()
	unanswered := units(t, reg, "unanswered")
	t.Logf("admitted %d, failed %d; answers lost %d, re-sent by the SDK %d; units unanswered %v", admitted, failed, lost, resent, unanswered)
	if resent > 0 {
		t.Errorf("%d lease writes re-sent after their answer was lost, want 0 (sent once)", resent)
	}
	if lost == 0 {
		t.Fatal("no answer lost: the test tested nothing")
	}
	// Sent once, a lease write whose answer was lost took its units all the same: they are
	// held by no one and counted, and everything else is admitted.
	if float64(admitted)+unanswered < float64(limit.Count) {
		t.Errorf("admitted %d + unanswered %v < the window's %d: capacity lost uncounted", admitted, unanswered, limit.Count)
	}
}

// TestLeaseGiveBackLandsOnce: a give-back whose answer is lost is re-sent, and applied once:
// the units it returned are counted refunded (not lost), and the table holds exactly what was
// never spent, for a window (ADD -n, not idempotent by itself) and a token bucket.
func TestLeaseGiveBackLandsOnce(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	for _, limit := range []bucket.Limit{
		{Algorithm: bucket.FixedWindow, Count: 30, Window: time.Hour},
		{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 30},
	} {
		t.Run(fmt.Sprint(limit.Algorithm), func(t *testing.T) {
			lease := bucket.Lease{Shards: 1, TTL: 10 * time.Second}
			c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: lease}
			gate := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
			lossy := &lossyAPI{API: api, lose: isGiveBack}
			reg := prometheus.NewRegistry()
			a := dynamo.New(lossy, dynamo.Options{Table: table, Now: frozen, Registerer: reg})
			dynamo.SetLeaseShift(a, 0)
			if !takeAt(t, a, t0, gate) {
				t.Fatal("the gate's only request was rejected")
			}
			// A leases 10 for a group the gate rejects, spends 4 of them, and gives 6 back.
			big := c
			big.Cost = 10
			if takeAt(t, a, t0, big, gate) {
				t.Fatal("the gated group was admitted")
			}
			for range 4 {
				if !takeAt(t, a, t0, c) {
					t.Fatal("a unit of the lease was rejected")
				}
			}
			closeLeases(t, a)
			lossy.mu.Lock()
			lost := lossy.lost
			lossy.mu.Unlock()
			leased, spent, refunded, expired := units(t, reg, "leased"), units(t, reg, "spent"), units(t, reg, "refunded"), units(t, reg, "expired")
			t.Logf("answers lost %d; units leased %v spent %v refunded %v expired %v", lost, leased, spent, refunded, expired)
			if lost == 0 {
				t.Fatal("no give-back's answer was lost: the test tested nothing")
			}
			// At least the 6 unspent units of the last grant go back (a token bucket's earlier
			// grants, behind a later one, cannot), and are counted refunded, not expired.
			if refunded < 6 || leased != spent+refunded+expired {
				t.Errorf("units leased %v, spent %v, refunded %v, expired %v: want at least 6 refunded and the sum to close",
					leased, spent, refunded, expired)
			}
			// What the table has left: the limit (the token bucket's leasable burst) less the
			// units leased and not refunded.
			capacity := float64(limit.Count)
			if limit.Algorithm == bucket.TokenBucket {
				tt, tau := bucket.ShardGCRA(limit, 1, 0)
				capacity = float64((tau - int64(lease.TTL)) / tt)
			}
			want := int(capacity - leased + refunded)
			breg := prometheus.NewRegistry()
			b := dynamo.New(api, dynamo.Options{Table: table, Now: frozen, Registerer: breg})
			dynamo.SetLeaseShift(b, 0)
			got := 0
			for range 60 {
				if takeAt(t, b, t0, c) {
					got++
				}
				dynamo.Settle(b)
			}
			closeLeases(t, b)
			if got != want {
				t.Errorf("after the give-back, another replica admitted %d, want %d (applied once)", got, want)
			}
		})
	}
}

// TestLeasedWindowRemainderIsLeased: units given back to a fixed window late, fewer than half of
// what a busy replica asks for, are still leased: nothing refills a window before it ends, so a
// remainder never leased is capacity lost for the rest of the window (the flake of
// TestTwoServicesShareOnePool: one unit of a week-long window).
func TestLeasedWindowRemainderIsLeased(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Hour}
	c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: bucket.Lease{Shards: 1, TTL: 10 * time.Second}}
	gate := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}}
	a := dynamo.New(api, dynamo.Options{Table: table, Now: frozen})
	b := dynamo.New(api, dynamo.Options{Table: table, Now: frozen})
	if !takeAt(t, a, t0, gate) {
		t.Fatal("the gate's only request was rejected")
	}
	// A holds 3 units unspent (its group was rejected by the gate).
	big := c
	big.Cost = 3
	if takeAt(t, a, t0, big, gate) {
		t.Fatal("the gated group was admitted")
	}
	admitted := 0
	at := t0
	step := func(d time.Duration) {
		for end := at.Add(d); at.Before(end); at = at.Add(5 * time.Millisecond) {
			if takeAt(t, b, at, c) {
				admitted++
			}
			dynamo.Settle(b)
		}
	}
	step(time.Second) // B, busy at 200/s, takes the other 7
	closeLeases(t, a) // A gives its 3 back
	step(3 * time.Second)
	closeLeases(t, b)
	if admitted != int(limit.Count) {
		t.Errorf("admitted %d in the window, want its whole limit %d (a remainder given back was never leased again)", admitted, limit.Count)
	}
}

// TestRefusedGroupReturnsLeasedUnits: a group refused by a concurrency slot gives back the units
// its leased charge took; otherwise every refusal costs the pool a unit.
func TestRefusedGroupReturnsLeasedUnits(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Hour}
	c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: bucket.Lease{Shards: 1, TTL: 10 * time.Second}}
	slot := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 1}}
	reg := prometheus.NewRegistry()
	s := dynamo.New(api, dynamo.Options{Table: table, Now: frozen, Registerer: reg})
	t.Cleanup(func() { _ = s.Close() })
	if !takeAt(t, s, t0, slot) {
		t.Fatal("the only concurrency slot was refused")
	}
	for range 5 {
		if takeAt(t, s, t0, c, slot) {
			t.Fatal("a group was admitted past a full concurrency slot")
		}
		dynamo.Settle(s)
	}
	admitted := 0
	for range 20 {
		if takeAt(t, s, t0, c) {
			admitted++
		}
		dynamo.Settle(s)
	}
	closeLeases(t, s)
	if admitted != int(limit.Count) {
		t.Errorf("after 5 groups refused by a slot, %d admitted, want the whole %d", admitted, limit.Count)
	}
	if l, sp, r, e := units(t, reg, "leased"), units(t, reg, "spent"), units(t, reg, "refunded"), units(t, reg, "expired"); l != sp+r+e {
		t.Errorf("units leased %v != spent %v + refunded %v + expired %v", l, sp, r, e)
	}
}

// flakyAPI fails a share of the calls it forwards: before sending (an error of the transport:
// not applied), or after (the answer lost: applied); lossyAPI's rule decides whether a lost
// answer is re-sent.
type flakyAPI struct {
	lossyAPI
	mu  sync.Mutex
	rng *rand.Rand
}

func (f *flakyAPI) roll() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64()
}

func (f *flakyAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if f.roll() < 0.05 {
		return nil, errLost // never sent
	}
	return f.lossyAPI.UpdateItem(ctx, in, o...)
}

func (f *flakyAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	if f.roll() < 0.05 {
		return nil, errLost
	}
	return f.lossyAPI.BatchGetItem(ctx, in, o...)
}

// TestLeaseUnitsAccountedUnderFaults: three replicas lease from one pool through a store that
// drops calls and loses answers, for every leased algorithm, with groups that a second policy
// rejects; every unit leased is, at the end, spent, refunded or expired (none held), and none
// was admitted past the bound.
func TestLeaseUnitsAccountedUnderFaults(t *testing.T) {
	api, table := localTable(t)
	leakCheck(t)
	for _, limit := range []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 40},
		{Algorithm: bucket.FixedWindow, Count: 60, Window: time.Second},
	} {
		t.Run(fmt.Sprint(limit.Algorithm), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(17, uint64(limit.Algorithm)))
			flaky := &flakyAPI{rng: rand.New(rand.NewPCG(3, 4))}
			flaky.API = api
			flaky.lose = func(*dynamodb.UpdateItemInput) bool { return flaky.roll() < 0.05 }
			reg := prometheus.NewRegistry()
			var stores []*dynamo.Store
			for range 3 {
				s := dynamo.New(flaky, dynamo.Options{Table: table, Now: frozen, Registerer: reg})
				dynamo.SetLeaseShift(s, 0)
				stores = append(stores, s)
			}
			c := bucket.Charge{Key: newKey(t), Limit: limit, Lease: bucket.Lease{Shards: 2, TTL: 100 * time.Millisecond}}
			gate := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 50, Burst: 5}}
			var admitted []int64
			at := t0
			for i := range 1500 {
				at = at.Add(time.Duration(rng.IntN(4)) * time.Millisecond) // ~670/s offered
				s := stores[rng.IntN(len(stores))]
				charges := []bucket.Charge{c}
				if i%4 == 0 {
					charges = append(charges, gate)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				ok, err := s.Take(ctx, at, charges, make([]bucket.Result, len(charges)))
				cancel()
				if err == nil && ok {
					admitted = append(admitted, at.UnixNano())
				}
				dynamo.Settle(s)
			}
			for _, s := range stores {
				closeLeases(t, s)
			}
			l, sp, r, e := units(t, reg, "leased"), units(t, reg, "spent"), units(t, reg, "refunded"), units(t, reg, "expired")
			t.Logf("admitted %d; units leased %v spent %v refunded %v expired %v unanswered %v", len(admitted), l, sp, r, e, units(t, reg, "unanswered"))
			if float64(len(admitted)) != sp {
				t.Errorf("admitted %d, units spent %v: want equal", len(admitted), sp)
			}
			if l != sp+r+e {
				t.Errorf("units leased %v != spent %v + refunded %v + expired %v: %v unaccounted", l, sp, r, e, l-sp-r-e)
			}
			if h := heldGauge(t, reg); h != 0 {
				t.Errorf("units held after every replica closed: %v, want 0", h)
			}
			if limit.Algorithm == bucket.TokenBucket {
				checkGCRABound(t, admitted, limit)
			} else {
				perWindow := map[int64]int{}
				for _, a := range admitted {
					perWindow[a/int64(limit.Window)]++
				}
				for w, n := range perWindow {
					if n > int(limit.Count) {
						t.Errorf("window %d: %d admitted, want at most %d", w, n, limit.Count)
					}
				}
			}
		})
	}
}
