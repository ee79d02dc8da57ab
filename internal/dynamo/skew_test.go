package dynamo_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/clockref"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// skewedReplica is a Store on a host whose clock is off by off (this host's clock shifted), with
// the clock-offset Monitor the gateway runs: fed by the Date header of its client's answers.
type skewedReplica struct {
	store *dynamo.Store
	off   time.Duration
	mon   *clockref.Monitor
}

func newSkewedReplica(api *dynamodb.Client, table string, off time.Duration) (*skewedReplica, error) {
	local := func() time.Time { return time.Now().Add(off) }
	est := clockref.New(clockref.Options{})
	client := dynamodb.New(api.Options(), dynamo.WithDates(local, est.Observe))
	mon, err := clockref.NewMonitor(clockref.MonitorOptions{Estimator: est, Now: local, Correct: true, MaxCorrection: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	return &skewedReplica{store: dynamo.New(client, dynamo.Options{Table: table}), off: off, mon: mon}, nil
}

// measure runs the Monitor with its probes, plus a stream of reads as traffic would make, until
// the offset is known within 20ms (or 20s have passed: then what was measured is used, and
// must be within 100ms for the test to mean anything).
func (r *skewedReplica) measure() (clockref.Estimate, error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.mon.Run(ctx, func(ctx context.Context) error { return r.store.Warm(ctx, 1) })
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.store.Warm(rctx, 1)
		rcancel()
		if err != nil {
			return clockref.Estimate{}, fmt.Errorf("read: %w", err)
		}
		est := r.mon.Update(time.Now().Add(r.off))
		if est.Known && est.Uncertainty() <= 20*time.Millisecond || time.Now().After(deadline) {
			if !est.Known || est.Uncertainty() > 100*time.Millisecond {
				return est, fmt.Errorf("after 20s: %+v, want the offset within 100ms", est)
			}
			// The host and DynamoDB Local share one clock: the true offset is -off. (On AWS
			// the host's own offset adds to it: TestSkewedClocksAndCorrection compares the
			// replicas instead.)
			if !onAWS() && (est.Lo > -r.off || est.Hi < -r.off) {
				return est, fmt.Errorf("replica %v ahead: measured [%v, %v], which does not hold the true offset %v", r.off, est.Lo, est.Hi, -r.off)
			}
			return est, nil
		}
	}
}

// TestSkewedClocksAndCorrection reproduces the two examples of issue 17 on DynamoDB
// Local, with two replicas whose clocks differ by d, deciding at one real instant R:
//
//   - a token bucket of burst 10 at 100/s, d = 100ms: the replica ahead sees the bucket refilled
//     by rate × d = 10, so 10 + 10 are admitted where one clock admits 10;
//   - a fixed window of 10 per minute, d = 2s, R one second before a minute ends: the replica
//     ahead is already in the next window, so 10 + 10 are admitted within one real second.
//
// Without correction the over-admission is exactly the documented bound (rate × d; a whole
// window's count). With the clocks corrected by the offset each replica measured against
// DynamoDB's Date header, the fleet is one clock up to the measured error: at most
// burst + rate × (errA + errB), and the window's 10.
func TestSkewedClocksAndCorrection(t *testing.T) {
	api, table := localTable(t)
	at := time.Now()
	boundary := at.Truncate(time.Minute).Add(time.Minute)
	for _, c := range []struct {
		name  string
		limit bucket.Limit
		d     time.Duration
		real  time.Time // the real instant both decide at
		// the documented bound without correction, and the allowance per second of clock
		// error with it (the token bucket's rate; 0: the window's count holds while the
		// errors stay within the 1s to the boundary)
		uncorrected int
		perSecond   float64
	}{
		{"TokenBucket burst 10 at 100/s, 100ms apart", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 100, Burst: 10},
			100 * time.Millisecond, at, 20, 100},
		{"FixedWindow 10 per minute, 2s apart", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 10, Window: time.Minute},
			2 * time.Second, boundary.Add(-time.Second), 20, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, err := newSkewedReplica(api, table, 0)
			if err != nil {
				t.Fatal(err)
			}
			b, err := newSkewedReplica(api, table, c.d)
			if err != nil {
				t.Fatal(err)
			}
			var (
				estA, estB clockref.Estimate
				errA, errB error
				measured   = make(chan struct{})
			)
			go func() { defer close(measured); estB, errB = b.measure() }()
			estA, errA = a.measure()
			<-measured
			if err := errors.Join(errA, errB); err != nil {
				t.Fatal(err)
			}
			// Both measure one reference: B's interval, moved by the d B is ahead, meets A's.
			if max(estA.Lo, estB.Lo+c.d) > min(estA.Hi, estB.Hi+c.d) {
				t.Fatalf("A measured [%v, %v], B (%v ahead) [%v, %v]: inconsistent", estA.Lo, estA.Hi, c.d, estB.Lo, estB.Hi)
			}
			corrA, corrB := a.mon.Correction(), b.mon.Correction()
			t.Logf("replica A: offset %v ± %v, correction %v; replica B (%v ahead): offset %v ± %v, correction %v",
				estA.Offset(), estA.Uncertainty(), corrA, c.d, estB.Offset(), estB.Uncertainty(), corrB)

			take := func(s *dynamo.Store, key bucket.Key, now time.Time) int {
				n := 0
				for range 10 {
					r := make([]bucket.Result, 1)
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					ok, err := s.Take(ctx, now, []bucket.Charge{{Key: key, Limit: c.limit, Cost: 1}}, r)
					cancel()
					if err != nil {
						t.Fatalf("Take: %v", err)
					}
					if ok {
						n++
					}
				}
				return n
			}
			t.Run("uncorrected", func(t *testing.T) {
				key := newKey(t)
				got := take(a.store, key, c.real.Add(a.off)) + take(b.store, key, c.real.Add(b.off))
				t.Logf("uncorrected: %d admitted", got)
				if got != c.uncorrected {
					t.Errorf("admitted %d at one real instant, want %d: the over-admission the docs state", got, c.uncorrected)
				}
			})
			t.Run("corrected", func(t *testing.T) {
				key := newKey(t)
				got := take(a.store, key, c.real.Add(a.off+corrA)) + take(b.store, key, c.real.Add(b.off+corrB))
				spread := estA.ErrorBound(corrA) + estB.ErrorBound(corrB)
				want := 10 + int(c.perSecond*spread.Seconds())
				t.Logf("corrected: %d admitted; clock errors up to %v + %v", got, estA.ErrorBound(corrA), estB.ErrorBound(corrB))
				if c.perSecond == 0 && spread >= time.Second {
					t.Fatalf("clock errors %v: beyond the 1s to the window's end", spread)
				}
				if got > want {
					t.Errorf("admitted %d with corrected clocks (errors up to %v in all), want at most %d", got, spread, want)
				}
				if got < 10 {
					t.Errorf("admitted %d, want at least the limit's 10", got)
				}
			})
		})
	}
}
