// Package fallback guards a store that can fail.
//
// It guards a rate-limit store that can fail (the shared DynamoDB store) so that
// an outage costs the gateway neither its latency nor, with on_error local, its limits.
//
// A Store wraps the primary bucket.Store with:
//
//   - a circuit breaker: the first failed decision (an error or a timeout) opens the circuit, and
//     while it is open the primary is not called at all, so that during an outage a decision
//     costs nothing instead of store.timeout each (a primary that can decide a charge from what
//     it holds, without I/O, still does: see localDecider). After a backoff (250 ms, doubling after each
//     failed probe up to 5 s) one decision is let through as a probe; its success closes the
//     circuit and resets the backoff. So the gateway recovers by itself when the store returns;
//   - a degraded mode (OnError Local): while the primary fails or the circuit is open, decisions
//     come from a private memstore.Store with every limit divided by Replicas (the number of
//     gateway replicas that share the limits), returned with a nil error. Across N replicas that
//     enforce limit/N each, the service as a whole stays at or below the limit while the shared
//     counts are out of reach; when the store is back the shared counts apply again;
//   - readiness (Ready): not ready only with OnError Deny and an open circuit. A fail-closed
//     gateway whose store is down cannot serve; with Allow or Local it can, and taking every pod
//     out of the load balancer during a store outage would be the outage. Ready probes the store
//     itself once the backoff has passed, because a pod that is out of the load balancer gets no
//     decisions that could probe it. A probe closes the circuit only if the store answers within
//     a decision's own timeout: a store that answers, but slower than decisions may wait, would
//     otherwise turn the pod ready, fail its traffic and turn it unready again, over and over.
//
// The package is the consumer side of the store: it knows bucket.Store and nothing of DynamoDB.
package fallback

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// Default breaker timings.
const (
	DefaultMinBackoff   = 250 * time.Millisecond
	DefaultMaxBackoff   = 5 * time.Second
	DefaultProbeTimeout = time.Second
)

// localDecider is a primary that can decide some charges from what it holds, without I/O (the
// DynamoDB store's leased units, reserved and exact to spend whatever the store does). While the
// circuit is open such decisions are made, and only the others follow OnError.
type localDecider interface {
	TakeLocal(now time.Time, charges []bucket.Charge, results []bucket.Result) (admitted, decided bool)
}

// ErrOpen is returned (wrapped with the last store error) for decisions that were not sent to
// the primary because its circuit is open.
var ErrOpen = errors.New("fallback: store unavailable (circuit open)")

// Options configure New.
type Options struct {
	// OnError is store.on_error, decided here for every front end. Allow and Deny: a decision
	// the primary cannot make returns a *bucket.UndecidedError carrying the rule, which the
	// front ends render (forward or OK; 503 or UNAVAILABLE). Local: decided from a private
	// memory store with limits divided by Replicas, never an error. (Optional) default Allow.
	OnError bucket.OnError
	// Replicas divides every limit in Local mode. (Required with Local, at least 1.)
	Replicas int
	// MaxKeys bounds the private memory store of Local mode. (Optional) default: bucket's.
	MaxKeys int
	// MinBackoff is how long the circuit stays open after it opens; it doubles after every
	// failed probe up to MaxBackoff. (Optional) defaults DefaultMinBackoff, DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// ProbeTimeout bounds the probe that Ready sends. (Optional) default DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// DecisionTimeout is the time a decision may take (store.timeout). When set, a readiness
	// probe that succeeds is followed by a second one bounded by DecisionTimeout, and only that
	// one can close the circuit: the first may have had to open a connection, which can take
	// longer than a decision's budget; the second asks what decisions need. (Optional) 0: one
	// probe, bounded by ProbeTimeout.
	DecisionTimeout time.Duration
	// Healthy reports whether an error of the primary still shows a working store (for example
	// contention on one hot key): such errors are handled like any other error (returned, or
	// decided locally) but do not open the circuit. (Optional) default: every error is a failure.
	Healthy func(error) bool
	// OnStateChange, when set, is called after the circuit opens (healthy false, with the error
	// that opened it) or closes (healthy true, nil), outside the Store's lock; a log line per
	// transition instead of one per failed decision. (Optional)
	OnStateChange func(healthy bool, err error)
	// Now is the breaker's clock. (Optional) default time.Now.
	Now func() time.Time
	// Registerer receives the metrics. (Optional) nil: not exported.
	Registerer prometheus.Registerer
}

// Store is a bucket.Store that guards a primary store. It is safe for concurrent use; the zero
// value is not usable (use New).
type Store struct {
	primary  bucket.Store
	onError  bucket.OnError
	replicas int64
	local    *memstore.Store // Local mode only
	healthy  func(error) bool
	onChange func(healthy bool, err error)
	now      func() time.Time
	probeTO  time.Duration
	decideTO time.Duration
	min, max time.Duration

	// isOpen mirrors open for the lock-free fast path of a healthy store.
	isOpen atomic.Bool

	mu      sync.Mutex
	open    bool      // the circuit is open: the store is considered down
	probing bool      // a probe is in flight
	until   time.Time // while open, no call before this instant
	backoff time.Duration
	lastErr error

	m metrics
}

var _ bucket.Releaser = (*Store)(nil)

type metrics struct {
	healthy         prometheus.Gauge
	skipped         prometheus.Counter
	fallbackError   prometheus.Counter
	fallbackSkipped prometheus.Counter
}

// New wraps primary. It fails when Local is asked for without Replicas or when the metrics
// cannot be registered.
func New(primary bucket.Store, o Options) (*Store, error) {
	if primary == nil {
		return nil, errors.New("fallback: primary store is required")
	}
	if o.OnError > bucket.Local {
		return nil, fmt.Errorf("fallback: unknown OnError %d", o.OnError)
	}
	s := &Store{
		primary:  primary,
		onError:  o.OnError,
		replicas: int64(o.Replicas),
		healthy:  o.Healthy,
		onChange: o.OnStateChange,
		now:      o.Now,
		probeTO:  o.ProbeTimeout,
		decideTO: o.DecisionTimeout,
		min:      o.MinBackoff,
		max:      o.MaxBackoff,
	}
	if s.onError == bucket.Local {
		if o.Replicas < 1 {
			return nil, fmt.Errorf("fallback: local mode needs replicas >= 1, got %d", o.Replicas)
		}
		s.local = memstore.New(memstore.Options{MaxKeys: o.MaxKeys})
	}
	if s.healthy == nil {
		s.healthy = func(error) bool { return false }
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.probeTO <= 0 {
		s.probeTO = DefaultProbeTimeout
	}
	if s.min <= 0 {
		s.min = DefaultMinBackoff
	}
	if s.max <= 0 {
		s.max = DefaultMaxBackoff
	}
	s.max = max(s.max, s.min)
	if err := s.initMetrics(o.Registerer); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) initMetrics(reg prometheus.Registerer) error {
	fallbacks := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_store_fallback_decisions_total",
		Help: "Decisions made from the local memory store (on_error local) because the shared store failed (reason error) or its circuit was open (reason open).",
	}, []string{"reason"})
	s.m = metrics{
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_store_healthy",
			Help: "1 while the rate-limit store's circuit is closed, 0 while it is open after a failure.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_store_circuit_open_total",
			Help: "Decisions that did not call the rate-limit store because its circuit was open.",
		}),
		fallbackError:   fallbacks.WithLabelValues("error"),
		fallbackSkipped: fallbacks.WithLabelValues("open"),
	}
	s.m.healthy.Set(1)
	if reg == nil {
		return nil
	}
	if err := errors.Join(reg.Register(s.m.healthy), reg.Register(s.m.skipped), reg.Register(fallbacks)); err != nil {
		return fmt.Errorf("fallback: register metrics: %w", err)
	}
	return nil
}

// Take implements bucket.Store: it asks the primary unless the circuit is open, and applies
// OnError when the primary cannot decide.
func (s *Store) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	call, probe := s.acquire()
	if !call {
		s.m.skipped.Inc()
		if ld, ok := s.primary.(localDecider); ok {
			if admitted, decided := ld.TakeLocal(now, charges, results[:len(charges)]); decided {
				return admitted, nil
			}
		}
		if s.onError == bucket.Local {
			s.m.fallbackSkipped.Inc()
			return s.takeLocal(ctx, now, charges, results)
		}
		return false, &bucket.UndecidedError{Rule: s.onError, Err: s.openError()}
	}
	admitted, err := s.primary.Take(ctx, now, charges, results)
	if err == nil {
		s.report(probe, nil)
		return admitted, nil
	}
	if errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled) {
		// The caller gave up (the client left): nothing is known about the store.
		s.release(probe)
		return false, err
	}
	if s.healthy(err) {
		s.report(probe, nil)
	} else {
		s.report(probe, err)
	}
	if s.onError == bucket.Local {
		s.m.fallbackError.Inc()
		clear(results[:len(charges)])
		return s.takeLocal(ctx, now, charges, results)
	}
	return false, &bucket.UndecidedError{Rule: s.onError, Err: err}
}

// takeLocal decides from the private memory store with every limit divided by the replicas.
// The primary may have used up ctx's deadline; the memory store needs no time, so the deadline
// no longer applies to it.
func (s *Store) takeLocal(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	divided := make([]bucket.Charge, len(charges))
	for i, c := range charges {
		c.Limit = Divide(c.Limit, s.replicas)
		divided[i] = c
	}
	admitted, err := s.local.Take(context.WithoutCancel(ctx), now, divided, results)
	for i := range charges {
		// Release must give these back to the local store, not to the primary, with the
		// local store's own token (a GCRA write's tat, below 2^63).
		results[i].Token |= localToken
	}
	return admitted, err
}

// localToken marks, in Result.Token, a charge that takeLocal decided. The primary's tokens
// never have the top bit set (bucket.Releaser: DynamoDB's are lease generations).
const localToken = 1 << 63

// Release implements bucket.Releaser: charges that the local store decided (on_error local)
// go back to it, with the divided limits they were taken under; the others go to the primary,
// also while its circuit is open (a concurrency slot released nowhere would stay taken until
// its lease expires). A primary that is no Releaser gives nothing back.
func (s *Store) Release(ctx context.Context, now time.Time, taken []bucket.Taken) error {
	var local, primary []bucket.Taken
	for _, tk := range taken {
		if tk.Token&localToken != 0 {
			tk.Charge.Limit = Divide(tk.Charge.Limit, s.replicas)
			tk.Token &^= localToken
			local = append(local, tk)
		} else {
			primary = append(primary, tk)
		}
	}
	var err error
	if len(local) > 0 && s.local != nil {
		err = s.local.Release(ctx, now, local)
	}
	if r, ok := s.primary.(bucket.Releaser); ok && len(primary) > 0 {
		err = errors.Join(err, r.Release(ctx, now, primary))
	}
	return err
}

// Divide returns l's share for one of n replicas: Rate/n, and Burst/n and Count/n rounded down
// but at least 1, so that n replicas together never exceed l (except when a count is below n,
// where each replica keeps 1). A leaky bucket admits Burst+1 at once (the request in service and
// Burst waiting), so it is that number that is divided: each replica keeps (Burst+1)/n - 1
// waiting places, at least 0. Fields that l does not use stay zero.
func Divide(l bucket.Limit, n int64) bucket.Limit {
	if n <= 1 {
		return l
	}
	l.Rate /= float64(n)
	switch {
	case l.Algorithm == bucket.LeakyBucket:
		l.Burst = max(0, (l.Burst+1)/n-1)
	case l.Burst > 0:
		l.Burst = max(1, l.Burst/n)
	}
	if l.Count > 0 {
		l.Count = max(1, l.Count/n)
	}
	return l
}

// acquire reports whether a decision may call the primary, and whether that call is the probe
// that decides whether an open circuit closes.
func (s *Store) acquire() (call, probe bool) {
	if !s.isOpen.Load() {
		return true, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.open:
		return true, false
	case s.probing || s.now().Before(s.until):
		return false, false
	default:
		s.probing = true
		return true, true
	}
}

// release gives up a probe that told nothing, so that the next decision probes instead.
func (s *Store) release(probe bool) {
	if !probe {
		return
	}
	s.mu.Lock()
	s.probing = false
	s.mu.Unlock()
}

// report records the outcome of a call to the primary: err nil closes the circuit; a failure
// opens it (a failed probe doubles the backoff). A failure of a call made before the circuit
// opened leaves the running backoff alone, so that a burst of concurrent failures counts once.
func (s *Store) report(probe bool, err error) {
	if err == nil && !probe && !s.isOpen.Load() {
		return
	}
	if changed := s.record(probe, err); changed && s.onChange != nil {
		s.onChange(err == nil, err)
	}
}

// record is report under the lock; it reports whether the circuit changed state.
func (s *Store) record(probe bool, err error) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if probe {
		s.probing = false
	}
	if err == nil {
		if !s.open {
			return false
		}
		s.open = false
		s.isOpen.Store(false)
		s.backoff = 0
		s.lastErr = nil
		s.m.healthy.Set(1)
		return true
	}
	s.lastErr = err
	switch {
	case !s.open:
		// Opening, also when a call that started before the circuit opened succeeded late and
		// closed it while this probe was out: doubling the backoff that close reset to 0 would
		// leave the circuit open with no backoff, and the re-open unreported.
		s.backoff = s.min
		changed = true
	case probe:
		s.backoff = min(2*s.backoff, s.max)
	default:
		return false
	}
	s.open = true
	s.isOpen.Store(true)
	s.until = s.now().Add(s.backoff)
	s.m.healthy.Set(0)
	return changed
}

func (s *Store) openError() error {
	s.mu.Lock()
	last := s.lastErr
	s.mu.Unlock()
	if last == nil {
		return ErrOpen
	}
	return fmt.Errorf("%w; last error: %v", ErrOpen, last) //nolint:errorlint // callers test for ErrOpen alone; the last error is for people
}

// Healthy reports whether the circuit is closed.
func (s *Store) Healthy() bool { return !s.isOpen.Load() }

// probeKey is the bucket the readiness probe charges: a fixed digest that no policy key
// (a digest of a policy name and a client value) meets in practice.
var probeKey = func() bucket.Key {
	sum := sha256.Sum256([]byte("ratelimit-proxy fallback readiness probe"))
	var k bucket.Key
	copy(k[:], sum[:])
	return k
}()

// probeLimit never rejects: the probe only needs the write to succeed.
var probeLimit = bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1_000_000_000, Window: time.Minute}

// Ready reports whether the gateway can serve: an error only with OnError Deny while the circuit
// is open. When the backoff has passed and no decision is probing, Ready sends the probe itself
// (one charge on a reserved bucket, bounded by ProbeTimeout, then with DecisionTimeout set a
// second one bounded by it), so that a gateway that the load balancer no longer sends requests to
// still finds out when the store is back.
func (s *Store) Ready(ctx context.Context) error {
	if !s.onError.FailsClosed() || s.Healthy() {
		return nil
	}
	call, probe := s.acquire()
	if call && probe {
		err := s.probe(ctx, s.probeTO)
		if (err == nil || s.healthy(err)) && s.decideTO > 0 {
			err = s.probe(ctx, s.decideTO)
		}
		switch {
		case err == nil || s.healthy(err):
			s.report(true, nil)
			return nil
		case errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled):
			s.release(true)
		default:
			s.report(true, err)
		}
	} else if call {
		// The circuit closed since Healthy was read.
		return nil
	}
	return fmt.Errorf("rate-limit store unavailable and store.on_error is deny: %w", s.openError())
}

// probe charges the reserved probe bucket once, within d.
func (s *Store) probe(ctx context.Context, d time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var r [1]bucket.Result
	_, err := s.primary.Take(pctx, s.now(), []bucket.Charge{{Key: probeKey, Limit: probeLimit}}, r[:])
	return err
}
