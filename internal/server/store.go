package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/fallback"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/rls"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/telemetry"
)

// StartupTimeout bounds what serve does with DynamoDB before it listens: loading the AWS
// configuration and, with create_table, creating the table and waiting until it is ACTIVE.
const StartupTimeout = 30 * time.Second

// evictionsHelp describes ratelimit_memory_evictions_total.
const evictionsHelp = "Keys the in-memory store forgot, by kind: idle (state equal to a fresh key's) or least_used (live, evicted at store.max_keys; never a key at its limit)."

// warmConns is how many connections to DynamoDB a starting gateway opens before it serves:
// enough for the first decisions of a busy pod not to queue behind new connections.
const warmConns = 4

// backend is a store as its builder made it, before the fallback wraps it.
type backend struct {
	primary bucket.Store
	// healthy says which of the store's errors are the store working as designed: they follow
	// on_error but do not open the circuit.
	healthy func(error) bool
	close   func(context.Context) error // gives back what the store holds at shutdown (nil: nothing)
	decide  func() time.Time            // the clock decisions use (nil: the host's)
	clock   *storeClock                 // nil unless the backend measures the clock
	probe   func(context.Context) error // the clock's exchange with the reference (with clock)
	// fallback is primary wrapped in the circuit breaker and on_error rule; its Ready method
	// is the /readyz probe.
	fallback *fallback.Store
}

// newBackend builds the configured backend and wraps it in the circuit breaker and on_error
// rule of package fallback (every backend, so that readiness and metrics have one shape).
func (g *gateway) newBackend(ctx context.Context) (backend, error) {
	var (
		b   backend
		err error
	)
	switch g.cfg.Store.Backend {
	case "memory":
		b, err = g.memoryBackend()
	case "dynamodb":
		b, err = g.dynamoBackend(ctx)
	case "redis":
		b, err = g.redisBackend(ctx)
	default:
		err = fmt.Errorf("store.backend %q: not available in this build", g.cfg.Store.Backend)
	}
	if err != nil {
		return backend{}, err
	}
	if b.decide == nil {
		b.decide = g.o.Now
	}
	b.fallback, err = g.wrapFallback(b)
	if err != nil {
		if b.close != nil {
			ctx, cancel := context.WithTimeout(context.Background(), closeStoreTimeout)
			defer cancel()
			_ = b.close(ctx)
		}
		return backend{}, err
	}
	if b.clock != nil {
		// Started last: nothing before it can fail and leave it running.
		b.clock.start(b.probe)
	}
	return b, nil
}

// memoryBackend is the in-memory store, with its metrics.
func (g *gateway) memoryBackend() (backend, error) {
	cfg, rl, reg := g.cfg, g.rl, g.reg
	m := memstore.New(memstore.Options{MaxKeys: cfg.Store.MaxKeys})
	// Every pool has its share of the store before the first request (a pool first seen
	// during a flood would find the shares divided among fewer), and again after each reload.
	rl.OnSet(func(set *policy.Set) { m.SetPools(poolNames(set)...) })
	err := errors.Join(
		reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_memory_keys",
			Help: "Keys tracked by the in-memory store.",
		}, func() float64 { return float64(m.Len()) })),
		// One series per kind of what the store forgot: idle keys (their state was a fresh
		// key's: nobody gains) and least-used live keys evicted at store.max_keys (never a key
		// at its limit).
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ratelimit_memory_evictions_total",
			Help:        evictionsHelp,
			ConstLabels: prometheus.Labels{"kind": "idle"},
		}, func() float64 { return float64(m.Evictions().Idle) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "ratelimit_memory_evictions_total",
			Help:        evictionsHelp,
			ConstLabels: prometheus.Labels{"kind": "least_used"},
		}, func() float64 { return float64(m.Evictions().LeastUsed) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimit_memory_overflow_total",
			Help: "Charges judged in the memory store's count-min sketch (each at its own limit) because they needed a new key while the pool's share of store.max_keys was full of keys it could not evict, or the sketch still counted the key.",
		}, func() float64 { return float64(m.Overflowed()) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "ratelimit_memory_keys_refused_total",
			Help: "Always 0 since the sketch replaced the overflow buckets (kept for existing dashboards): charges rejected because no state could be made for a new key.",
		}, func() float64 { return float64(m.Evictions().Refused) })),
	)
	if err != nil {
		return backend{}, fmt.Errorf("register store metrics: %w", err)
	}
	// The memory store fails only for a request whose client has gone (it decides even past
	// the deadline), never because it is down: its circuit never opens, or one failure would
	// skip the limits of every request for the backoff.
	return backend{primary: m, healthy: func(error) bool { return true }}, nil
}

// dynamoBackend is the DynamoDB store, with the clock it measures against DynamoDB's.
func (g *gateway) dynamoBackend(ctx context.Context) (backend, error) {
	cfg, reg, log := g.cfg, g.reg, g.log
	d := cfg.Store.DynamoDB // Validate guarantees it with a table
	sctx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	clock, err := newStoreClock(d.Clock, g.o.Now, log, reg)
	if err != nil {
		return backend{}, err
	}
	client, err := newDynamoClient(sctx, d, clock.local, clock.est.Observe)
	if err != nil {
		return backend{}, err
	}
	if d.CreateTable {
		if err := dynamo.CreateTable(sctx, client, d.Table); err != nil {
			return backend{}, fmt.Errorf("store.dynamodb.create_table: %w", err)
		}
		log.Info("dynamodb table ready", zap.String("table", d.Table))
	}
	mode := dynamo.Refund
	if d.Mode == "transaction" {
		mode = dynamo.Transaction
	}
	var api dynamo.API = client
	if cfg.Telemetry.Enabled() {
		api = telemetry.TraceDynamoDB(client) // a span per DynamoDB call of a recorded request
	}
	ds := dynamo.New(g.o.Hooks.dynamoDB(api), dynamo.Options{Table: d.Table, Mode: mode, DenyCache: d.DenyCache, Registerer: reg, Logger: log,
		SlotLease: d.SlotLease, Now: clock.decide,
		// A coalesced charge may wait one store.timeout in its item's queue and then ride a
		// batch whose deadline is another waiter's: a write can land up to about twice the
		// timeout after its decision.
		LateWrites: max(5*time.Second, 2*cfg.Store.Timeout)})
	// Connections and credentials before the first decision, not during it (see Warm);
	// a store that does not answer is no reason not to start: on_error decides meanwhile.
	wctx, wcancel := context.WithTimeout(ctx, min(StartupTimeout, max(time.Second, 5*cfg.Store.Timeout)))
	if err := ds.Warm(wctx, warmConns); err != nil {
		var missing *types.ResourceNotFoundException
		if errors.As(err, &missing) {
			// It answered: no such table there. Say which, where, and how to make it.
			log.Error(fmt.Sprintf("table %s not found in region %s; decisions follow store.on_error until it exists", d.Table, client.Options().Region),
				zap.String("endpoint", d.Endpoint), zap.String("hint", "store.dynamodb.create_table: true, or ratelimit-proxy table create --config FILE"))
		} else {
			log.Warn("dynamodb did not answer at startup; decisions follow store.on_error until it does",
				zap.String("table", d.Table), zap.Error(err))
		}
	}
	wcancel()
	return backend{
		primary: g.o.Hooks.store(ds),
		// Contention on one hot key, or DynamoDB throttling one, is the store working as
		// designed, not an outage: the decision follows on_error, the breaker stays closed.
		healthy: func(err error) bool {
			return errors.Is(err, dynamo.ErrContention) || errors.Is(err, dynamo.ErrThrottled)
		},
		close: func(ctx context.Context) error {
			err := ds.CloseLeases(ctx)
			_ = ds.Close() // stop renewing concurrency slots: the drain released them
			clock.stop()
			return err
		},
		decide: clock.decide,
		clock:  clock,
		// The clock's probe is the warm-up read: one item never written, no rights beyond the
		// decisions'.
		probe: func(ctx context.Context) error { return ds.Probe(ctx, 1) },
	}, nil
}

// wrapFallback wraps b's store in the circuit breaker and the on_error rule.
func (g *gateway) wrapFallback(b backend) (*fallback.Store, error) {
	cfg, log := g.cfg, g.log
	// Parsed once, here, and decided once, in the fallback store; the front ends only render
	// what it decided (bucket.UndecidedError).
	onError, err := bucket.ParseOnError(cfg.Store.OnError)
	if err != nil {
		return nil, err
	}
	return fallback.New(b.primary, fallback.Options{
		OnError:  onError,
		Replicas: cfg.Store.Replicas,
		MaxKeys:  cfg.Store.MaxKeys,
		// A probe may have to open a new connection (TLS to DynamoDB): give it more than one
		// decision's budget, but never less.
		ProbeTimeout: max(cfg.Store.Timeout, fallback.DefaultProbeTimeout),
		// ... and then judge the store by what decisions need.
		DecisionTimeout: cfg.Store.Timeout,
		Healthy:         b.healthy,
		OnStateChange: func(ok bool, err error) {
			if ok {
				log.Info("rate-limit store recovered; circuit closed", zap.String("store", cfg.Store.Backend))
				return
			}
			log.Warn("rate-limit store failing; circuit open, decisions follow store.on_error",
				zap.String("store", cfg.Store.Backend), zap.Stringer("on_error", onError), zap.Error(err))
		},
		Registerer: g.reg,
	})
}

// NewDynamoClient builds the DynamoDB client for the store.dynamodb block from the standard AWS
// chain. It fails when neither the block nor the chain names a region.
func NewDynamoClient(ctx context.Context, d *policy.DynamoDBConfig) (*dynamodb.Client, error) {
	return newDynamoClient(ctx, d, nil, nil)
}

// newDynamoClient is NewDynamoClient whose answers' Date headers go to dates, timed with now.
func newDynamoClient(ctx context.Context, d *policy.DynamoDBConfig, now func() time.Time, dates dynamo.DateObserver) (*dynamodb.Client, error) {
	client, err := dynamo.NewClient(ctx, dynamo.ClientOptions{Region: d.Region, Endpoint: d.Endpoint, Now: now, Dates: dates})
	if err != nil {
		return nil, fmt.Errorf("store.dynamodb: %w", err)
	}
	if client.Options().Region == "" {
		return nil, errors.New("store.dynamodb.region: not set, and the AWS configuration (AWS_REGION, the profile) names no region")
	}
	return client, nil
}

// CreateTable creates the table of cfg's store.dynamodb block (see dynamo.CreateTable), bounded
// by ctx. It fails unless store.backend is dynamodb.
func CreateTable(ctx context.Context, cfg *policy.Config) (created bool, err error) {
	if cfg.Store.Backend != "dynamodb" || cfg.Store.DynamoDB == nil {
		return false, fmt.Errorf("store.backend is %q: table create needs store.backend dynamodb and a store.dynamodb block", cfg.Store.Backend)
	}
	client, err := NewDynamoClient(ctx, cfg.Store.DynamoDB)
	if err != nil {
		return false, err
	}
	return dynamo.EnsureTable(ctx, client, cfg.Store.DynamoDB.Table)
}

// poolNames are the memory store's pools of a compiled set: each policy's name and each RLS
// domain's pool (see bucket.Charge.Pool).
func poolNames(set *policy.Set) []string {
	var names []string
	for _, p := range set.Policies() {
		names = append(names, p.Name)
	}
	for _, d := range set.RLS().Domains() {
		names = append(names, rls.Pool(d))
	}
	return names
}
