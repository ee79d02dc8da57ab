package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// frozen is a sweeper clock that never reaches the simulated instants of these tests (t0 and
// later), so the background sweeper neither expires nor gives back anything behind them: what
// happens is what the simulated requests make happen.
func frozen() time.Time { return t0.Add(-time.Hour) }

// leakCheck verifies, after every cleanup of t (the Stores' Close among them), that no goroutine
// of the test is left.
func leakCheck(t *testing.T) {
	ignore := append(ignoreNow(), ignorePools...)
	t.Cleanup(func() { goleak.VerifyNone(t, ignore...) })
}

// newLeaseStores returns n Stores sharing api (replicas), closed at the end of the test.
func newLeaseStores(t *testing.T, api dynamo.API, n int, reg prometheus.Registerer) []*dynamo.Store {
	t.Helper()
	stores := make([]*dynamo.Store, n)
	for i := range stores {
		stores[i] = dynamo.New(api, dynamo.Options{Table: "t", Now: frozen, Registerer: reg})
	}
	t.Cleanup(func() {
		for _, s := range stores {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.CloseLeases(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
			cancel()
		}
	})
	return stores
}

// arrival is one simulated request: its instant, the replica it reaches, and whether a second
// (gate) policy of its group rejects it, so that the leased unit must be given back.
type arrival struct {
	at      int64
	replica int
	gated   bool
	cost    int64 // weighted requests spend several units, all or none
}

// leasedArrivals makes a random day of traffic for replicas: bursts, quiet spells (leases expire
// and are given back), a load that moves from replica to replica, and groups a gate rejects.
func leasedArrivals(rng *rand.Rand, replicas int, span time.Duration, perSecond float64) []arrival {
	var out []arrival
	at := t0.UnixNano()
	end := at + int64(span)
	hot := 0
	for at < end {
		switch r := rng.Float64(); {
		case r < 0.002: // a quiet spell: every lease runs out
			at += int64(time.Duration(rng.IntN(800)) * time.Millisecond)
		case r < 0.01: // the load moves
			hot = rng.IntN(replicas)
		case r < 0.03: // a burst at one instant
			for range rng.IntN(40) {
				out = append(out, arrival{at, rng.IntN(replicas), rng.IntN(5) == 0, costOf(rng)})
			}
		}
		replica := hot
		if rng.IntN(3) == 0 {
			replica = rng.IntN(replicas)
		}
		out = append(out, arrival{at, replica, rng.IntN(7) == 0, costOf(rng)})
		at += int64(rng.ExpFloat64() / perSecond * 1e9)
	}
	return out
}

// costOf is a request's cost: mostly 1, sometimes 2 or 5.
func costOf(rng *rand.Rand) int64 {
	switch rng.IntN(10) {
	case 0:
		return 5
	case 1, 2:
		return 2
	}
	return 1
}

// checkGCRABound fails unless the admitted instants (sorted) satisfy a token bucket's exact
// bound: in every interval [a, b], at most burst + floor((b-a)/T) admitted.
func checkGCRABound(t *testing.T, admitted []int64, l bucket.Limit) {
	t.Helper()
	tt, _ := bucket.GCRAParams(l)
	// For each j, the tightest i is any earlier one; checking every i per j is quadratic but the
	// bound is monotone in i, so it is enough to slide: count(i..j) - floor((s_j-s_i)/T) <= burst.
	worst, worstI, worstJ := int64(0), 0, 0
	for j := range admitted {
		for i := max(0, j-int(l.Burst)*4-400); i <= j; i++ {
			excess := int64(j-i+1) - (admitted[j]-admitted[i])/tt
			if excess > worst {
				worst, worstI, worstJ = excess, i, j
			}
		}
	}
	if worst > l.Burst {
		t.Fatalf("over-admitted: %d admitted in [%d, %d] (%v), want at most burst %d + %d",
			worstJ-worstI+1, admitted[worstI], admitted[worstJ], time.Duration(admitted[worstJ]-admitted[worstI]),
			l.Burst, (admitted[worstJ]-admitted[worstI])/tt)
	}
}

// TestLeasesNeverOverAdmit replays random traffic (requests of cost 1, 2 and 5) through several replicas that lease from one
// token bucket (one and four shards) on a table that applies every write atomically, and checks
// the exact bound of a single token bucket over every interval of the admitted requests:
// leases, renewals racing each other, units given back by rejected groups, grants that expire
// and are refunded behind the requests' backs, and the load moving between replicas.
func TestLeasesNeverOverAdmit(t *testing.T) {
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 200, Burst: 100}
	gate := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
	for _, shards := range []int{1, 4} {
		for seed := uint64(1); seed <= 6; seed++ {
			// Seed 4's renewals place their units as a store with a 40 ms round trip does;
			// seeds 5 and 6 run the slow-store paths (several renewals in flight, placed a
			// round trip ahead, edge drains) as on a store that answers in 150 ms +- 60 ms.
			shift, slow := time.Duration(0), seed >= 5
			if seed == 4 {
				shift = 40 * time.Millisecond
			}
			t.Run(fmt.Sprintf("shards=%d/seed=%d/shift=%v/slow=%v", shards, seed, shift, slow), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				api := newMemAPI()
				reg := prometheus.NewRegistry()
				stores := newLeaseStores(t, api, 5, reg)
				for _, s := range stores {
					if slow {
						dynamo.SetLeaseSlow(s, 150*time.Millisecond, 60*time.Millisecond)
					} else {
						dynamo.SetLeaseShift(s, shift)
					}
				}
				key, gateKey := newKey(t), newKey(t)
				lease := bucket.Lease{Shards: shards, TTL: 100 * time.Millisecond}
				var admitted []int64
				for _, a := range leasedArrivals(rng, len(stores), 20*time.Second, 2*limit.Rate) {
					charges := []bucket.Charge{{Key: key, Limit: limit, Lease: lease, Cost: a.cost}}
					if a.gated {
						charges = append(charges, bucket.Charge{Key: gateKey, Limit: gate})
					}
					r := make([]bucket.Result, len(charges))
					ok, err := stores[a.replica].Take(context.Background(), time.Unix(0, a.at), charges, r)
					if err != nil {
						t.Fatalf("Take at %d: %v", a.at, err)
					}
					for range a.cost * b2i(ok) { // a unit per request's worth
						admitted = append(admitted, a.at)
					}
				}
				sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
				checkGCRABound(t, admitted, limit)
				spent := testutil.ToFloat64(leaseUnits(t, reg, "spent"))
				if int(spent) != len(admitted) {
					t.Errorf("spent units: got %v, want %d (its cost per admitted group)", spent, len(admitted))
				}
				span := float64(admitted[len(admitted)-1]-admitted[0]) / 1e9
				// Not much less than one exact bucket either: the burst less rate*ttl at each
				// quiet spell, units in other replicas' leases, polling under contention. Not
				// for the slow seeds: their renewals are made a simulated round trip ahead but
				// land in wall-clock time, racing the replay, so how much they bring depends on
				// the scheduler (58-88% measured, the lowest under CI's load); they are here for
				// the bound. Their efficiency is make bench-scale's, on real time.
				if exact := float64(limit.Burst) + span*limit.Rate; !slow && float64(len(admitted)) < 0.75*exact {
					t.Errorf("admitted %d in %.1fs, want at least 75%% of one exact bucket's %.0f", len(admitted), span, exact)
				}
				t.Logf("admitted %d in %.1fs (exact bucket at most %.0f), leased %v, refunded %v, expired %v, writes %d",
					len(admitted), span, float64(limit.Burst)+span*limit.Rate,
					testutil.ToFloat64(leaseUnits(t, reg, "leased")), testutil.ToFloat64(leaseUnits(t, reg, "refunded")),
					testutil.ToFloat64(leaseUnits(t, reg, "expired")), api.writes())
			})
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// leaseUnits is the counter of ratelimit_dynamodb_lease_units_total{outcome}.
func leaseUnits(t *testing.T, g prometheus.Gatherer, outcome string) prometheus.Collector {
	t.Helper()
	return counterOf(t, g, "ratelimit_dynamodb_lease_units_total", "outcome", outcome)
}

// counterOf finds one labelled counter's current value in g, as a Collector for testutil.
func counterOf(t *testing.T, g prometheus.Gatherer, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return nil
}

// TestLeasedFixedWindowExact: replicas leasing from a fixed window (sharded or not) admit at
// most the limit in every window, and a rejected group's unit goes back.
func TestLeasedFixedWindowExact(t *testing.T) {
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 60, Window: time.Second}
	gate := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(shards), 9))
			api := newMemAPI()
			stores := newLeaseStores(t, api, 4, nil)
			key, gateKey := newKey(t), newKey(t)
			perWindow := map[int64]int64{}
			for _, a := range leasedArrivals(rng, len(stores), 10*time.Second, 150) {
				charges := []bucket.Charge{{Key: key, Limit: limit, Lease: bucket.Lease{Shards: shards}, Cost: a.cost}}
				if a.gated {
					charges = append(charges, bucket.Charge{Key: gateKey, Limit: gate})
				}
				r := make([]bucket.Result, len(charges))
				ok, err := stores[a.replica].Take(context.Background(), time.Unix(0, a.at), charges, r)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					perWindow[a.at/int64(time.Second)] += a.cost
				}
			}
			full := 0
			for w, n := range perWindow {
				if n > limit.Count {
					t.Errorf("window %d: admitted %d, want at most %d", w, n, limit.Count)
				}
				if n == limit.Count {
					full++
				}
			}
			if full == 0 {
				t.Errorf("no window admitted its whole limit of %d: %v", limit.Count, perWindow)
			}
		})
	}
}

// TestLeaseBurstUsesEveryShard: one replica alone takes a sharded bucket's whole leasable burst
// at one instant, moving from shard to shard as each runs dry: exactly burst - rate*ttl
// (each shard's part less its rate times the TTL), and not one more.
func TestLeaseBurstUsesEveryShard(t *testing.T) {
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 103}
	lease := bucket.Lease{Shards: 4, TTL: 200 * time.Millisecond}
	// A renewal's shift (its store's round trip) skips that much of each idle shard's places.
	for _, shift := range []time.Duration{0, 30 * time.Millisecond} {
		var want int64
		for i := range lease.Shards {
			tt, tau := bucket.ShardGCRA(limit, lease.Shards, i)
			want += (tau - int64(lease.TTL) - int64(shift)) / tt
		}
		api := newMemAPI()
		s := newLeaseStores(t, api, 1, nil)[0]
		dynamo.SetLeaseShift(s, shift)
		key := newKey(t)
		var got int64
		for range 2 * limit.Burst {
			r := make([]bucket.Result, 1)
			ok, err := s.Take(context.Background(), t0, []bucket.Charge{{Key: key, Limit: limit, Lease: lease}}, r)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				got++
			} else if r[0].RetryAfter <= 0 {
				t.Fatalf("rejected with RetryAfter %v, want > 0", r[0].RetryAfter)
			}
		}
		if got != want {
			t.Errorf("shift %v: admitted at one instant: got %d, want %d (burst %d less rate*(ttl+shift) over %d shards)", shift, got, want, limit.Burst, lease.Shards)
		}
		for i := range lease.Shards {
			if !api.has(key.String() + "#g#l" + fmt.Sprint(i)) {
				t.Errorf("shift %v: shard %d's item was never written", shift, i)
			}
		}
	}
}

// TestLeaseSizeFollowsDemand: a replica that sees 10 requests a second leases a few units at a
// time, not the burst, while one that sees 1,000 leases dozens per write.
func TestLeaseSizeFollowsDemand(t *testing.T) {
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 2000, Burst: 1000}
	lease := bucket.Lease{Shards: 1}
	for _, tc := range []struct {
		perSecond     int
		maxPerLease   float64
		minPerLease   float64
		name          string
		writesAtMost  int
		requestsTotal int
	}{
		{perSecond: 10, minPerLease: 1, maxPerLease: 5, name: "slow"},
		{perSecond: 1000, minPerLease: 40, maxPerLease: 400, name: "fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newMemAPI()
			reg := prometheus.NewRegistry()
			s := newLeaseStores(t, api, 1, reg)[0]
			key := newKey(t)
			step := int64(time.Second) / int64(tc.perSecond)
			for i := range 5 * tc.perSecond {
				r := make([]bucket.Result, 1)
				if _, err := s.Take(context.Background(), time.Unix(0, t0.UnixNano()+int64(i)*step), []bucket.Charge{{Key: key, Limit: limit, Lease: lease}}, r); err != nil {
					t.Fatal(err)
				}
			}
			leased := testutil.ToFloat64(leaseUnits(t, reg, "leased"))
			grants := testutil.ToFloat64(counterOf(t, reg, "ratelimit_dynamodb_leases_total", "result", "granted"))
			per := leased / grants
			if per < tc.minPerLease || per > tc.maxPerLease {
				t.Errorf("%d req/s: %.1f units per lease (%v units in %v leases), want %v to %v", tc.perSecond, per, leased, grants, tc.minPerLease, tc.maxPerLease)
			}
		})
	}
}

// TestCloseGivesLeasesBack: Close returns every unspent unit to the table, so the next replica
// finds the bucket as if they had never been leased.
func TestCloseGivesLeasesBack(t *testing.T) {
	leakCheck(t)
	for _, limit := range []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 50},
		{Algorithm: bucket.FixedWindow, Count: 50, Window: time.Hour},
	} {
		t.Run(fmt.Sprint(limit.Algorithm), func(t *testing.T) {
			api := newMemAPI()
			key := newKey(t)
			lease := bucket.Lease{Shards: 1, TTL: 10 * time.Second}
			if limit.Algorithm == bucket.FixedWindow {
				lease.TTL = time.Minute
			}
			take := func(s *dynamo.Store, n int) int {
				admitted := 0
				for range n {
					r := make([]bucket.Result, 1)
					ok, err := s.Take(context.Background(), t0, []bucket.Charge{{Key: key, Limit: limit, Lease: lease}}, r)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						admitted++
					}
				}
				return admitted
			}
			first := dynamo.New(api, dynamo.Options{Table: "t", Now: frozen})
			// A burst of 10 at one instant leases in growing batches; some units stay unspent.
			if got := take(first, 10); got != 10 {
				t.Fatalf("first replica admitted %d of 10", got)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := first.CloseLeases(ctx); err != nil {
				t.Fatal(err)
			}
			second := newLeaseStores(t, api, 1, nil)[0]
			capacity := int64(50)
			if limit.Algorithm == bucket.TokenBucket {
				tt, tau := bucket.ShardGCRA(limit, 1, 0)
				capacity = (tau - int64(lease.TTL)) / tt
			}
			if got, want := take(second, 100), int(capacity)-10; got != want {
				t.Errorf("after the first replica closed, the second admitted %d, want %d (capacity %d less the 10 spent)", got, want, capacity)
			}
		})
	}
}

// TestKilledReplicaCapacityComesBack: a replica that dies holding a lease cannot give it back;
// its units are lost only until the lease's TTL has passed (a token bucket: the units' places
// pass; a fixed window: the window ends), after which the other replicas get the whole bucket.
func TestKilledReplicaCapacityComesBack(t *testing.T) {
	leakCheck(t)
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 100}
	lease := bucket.Lease{Shards: 1, TTL: 200 * time.Millisecond}
	api := newMemAPI()
	dead := &killable{API: api}
	victim := dynamo.New(dead, dynamo.Options{Table: "t", Now: frozen})
	survivor := newLeaseStores(t, api, 1, nil)[0]
	key := newKey(t)
	charge := []bucket.Charge{{Key: key, Limit: limit, Lease: lease}}
	take := func(s *dynamo.Store, at time.Time, n int) int {
		admitted := 0
		for range n {
			r := make([]bucket.Result, 1)
			ok, err := s.Take(context.Background(), at, charge, r)
			if err == nil && ok {
				admitted++
			}
		}
		return admitted
	}
	// The victim sees a steady 400/s for a while (its leases grow), then dies at once.
	at := t0
	for range 100 {
		take(victim, at, 1)
		at = at.Add(2500 * time.Microsecond)
	}
	dead.kill()
	// Until its last lease's TTL has passed the survivor may find less; afterwards the bucket
	// refills as if the victim's units had been spent, so after TTL + burst/rate it is full.
	full := at.Add(lease.TTL + time.Second)
	tt, tau := bucket.ShardGCRA(limit, 1, 0)
	want := int((tau - int64(lease.TTL)) / tt)
	if got := take(survivor, full, 3*int(limit.Burst)); got != want {
		t.Errorf("survivor at TTL + burst/rate after the kill: admitted %d, want the whole leasable burst %d", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = victim.CloseLeases(ctx) // its refunds fail: the process is dead
}

// killable is an API that fails every call once killed, like a replica's process that is gone.
type killable struct {
	dynamo.API
	dead atomic.Bool
}

func (k *killable) kill() { k.dead.Store(true) }

func (k *killable) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if k.dead.Load() {
		return nil, errors.New("killed")
	}
	return k.API.UpdateItem(ctx, in, o...)
}

// throttlingAPI throttles the first `throttle` UpdateItem calls the way DynamoDB does, then
// passes them on.
type throttlingAPI struct {
	dynamo.API
	throttle atomic.Int64
}

func (a *throttlingAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if a.throttle.Add(-1) >= 0 {
		return nil, &types.ProvisionedThroughputExceededException{Message: aws.String("The level of configured provisioned throughput for the table was exceeded.")}
	}
	return a.API.UpdateItem(ctx, in, o...)
}

// TestThrottledWritesRetriedAndCounted: a write that DynamoDB throttles is retried with backoff
// within the decision's deadline and counted; the decision is the one the table then makes.
func TestThrottledWritesRetriedAndCounted(t *testing.T) {
	leakCheck(t)
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprintf("lease=%v", leased), func(t *testing.T) {
			api := &throttlingAPI{API: newMemAPI()}
			api.throttle.Store(3)
			reg := prometheus.NewRegistry()
			s := newLeaseStores(t, api, 1, reg)[0]
			c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 10}}
			op := "update"
			if leased {
				c.Lease, op = bucket.Lease{Shards: 1}, "lease"
				// Simulated instants: the request waits for the throttled renewal until its
				// deadline, not for a round trip of wall-clock time (the 50 ms floor), which
				// the backoffs' sleeps outlast whenever the scheduler runs them late.
				dynamo.SetLeaseShift(s, 0)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			r := make([]bucket.Result, 1)
			ok, err := s.Take(ctx, t0, []bucket.Charge{c}, r)
			if err != nil || !ok {
				t.Fatalf("got admitted=%v err=%v, want admitted after the throttles", ok, err)
			}
			if got := testutil.ToFloat64(counterOf(t, reg, "ratelimit_dynamodb_throttled_total", "op", op)); got != 3 {
				t.Errorf("ratelimit_dynamodb_throttled_total{op=%q}: got %v, want 3", op, got)
			}
		})
	}
}

// TestThrottledPastDeadlineIsAnError: when DynamoDB keeps throttling, the decision fails with
// ErrThrottled (the caller's on_error decides) no later than its deadline.
func TestThrottledPastDeadlineIsAnError(t *testing.T) {
	leakCheck(t)
	for _, leased := range []bool{false, true} {
		api := &throttlingAPI{API: newMemAPI()}
		api.throttle.Store(1 << 40)
		s := newLeaseStores(t, api, 1, nil)[0]
		c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Minute}}
		if leased {
			c.Lease = bucket.Lease{Shards: 2}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
		start := time.Now()
		ok, err := s.Take(ctx, t0, []bucket.Charge{c}, make([]bucket.Result, 1))
		elapsed := time.Since(start)
		cancel()
		if ok || !(errors.Is(err, dynamo.ErrThrottled) || errors.Is(err, context.DeadlineExceeded)) {
			t.Errorf("lease=%v: got admitted=%v err=%v, want an ErrThrottled or deadline error", leased, ok, err)
		}
		if elapsed > time.Second {
			t.Errorf("lease=%v: returned after %v, want about the 40ms deadline", leased, elapsed)
		}
	}
}

// TestTakeLocalSpendsOnlyWhatIsHeld: TakeLocal (what a circuit breaker asks while the store is
// considered down) decides a leased charge from the pool's grants, or rejects it while the pool
// is known to be empty, and otherwise leaves it undecided; it never calls the store, and the
// admissions it makes, mixed with Take's, stay within the exact bucket's bound.
func TestTakeLocalSpendsOnlyWhatIsHeld(t *testing.T) {
	leakCheck(t)
	api := newMemAPI()
	s := newLeaseStores(t, api, 1, nil)[0]
	dynamo.SetLeaseShift(s, 0)
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 50}
	c := []bucket.Charge{{Key: newKey(t), Limit: limit, Lease: bucket.Lease{Shards: 1}}}
	plain := []bucket.Charge{{Key: newKey(t), Limit: limit}}
	r := make([]bucket.Result, 1)
	if _, decided := s.TakeLocal(t0, c, r); decided {
		t.Fatal("TakeLocal of a pool never leased: decided, want undecided")
	}
	var admitted []int64
	outcomes := map[string]int{}
	for i := range 3000 {
		at := t0.Add(time.Duration(i) * 2 * time.Millisecond) // 500/s offered, 5x the rate
		dynamo.Settle(s)                                      // a renewal the last Take started writes in the background
		writes := api.writes()
		ok, decided := s.TakeLocal(at, c, r)
		if api.writes() != writes {
			t.Fatalf("TakeLocal at +%v wrote to the store", at.Sub(t0))
		}
		switch {
		case decided && ok:
			outcomes["local admitted"]++
		case decided:
			outcomes["local rejected"]++
			if r[0].RetryAfter <= 0 {
				t.Fatalf("local rejection at +%v: RetryAfter %v, want > 0", at.Sub(t0), r[0].RetryAfter)
			}
		default:
			outcomes["undecided"]++
			var err error
			if ok, err = s.Take(context.Background(), at, c, r); err != nil {
				t.Fatal(err)
			}
		}
		if ok {
			admitted = append(admitted, at.UnixNano())
		}
		if _, decided := s.TakeLocal(at, plain, r); decided {
			t.Fatal("TakeLocal of a charge without a lease: decided, want undecided")
		}
	}
	checkGCRABound(t, admitted, limit)
	for _, k := range []string{"local admitted", "local rejected", "undecided"} {
		if outcomes[k] == 0 {
			t.Errorf("outcomes %v: none %s", outcomes, k)
		}
	}
	t.Logf("%v; %d admitted in 6 s (one exact bucket at most %d)", outcomes, len(admitted), 50+600)
}
