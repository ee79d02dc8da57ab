package dynamo

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/histbuckets"
)

// The op label's values: one per kind of DynamoDB call.
const (
	opUpdate   = "update"
	opBatchGet = "batch_get"
	opTransact = "transact"
	opRefund   = "refund"
	opSeal     = "seal"
	opReap     = "reap"    // concurrency: expired slots removed
	opRenew    = "renew"   // concurrency: leases extended
	opRelease  = "release" // Release: slots given back, charge_on refunds
	// opLease is a lease write, opLeaseRefund one giving a lease's unspent units back.
	opLease       = "lease"
	opLeaseRefund = "lease_refund"
)

type metrics struct {
	requests, errors *prometheus.CounterVec
	denyHits         prometheus.Counter
	batchCharges     prometheus.Histogram
	reaped           prometheus.Counter
	throttled        *prometheus.CounterVec
	// The lease pools' (lease.Metrics), which create their label values.
	leases     *prometheus.CounterVec
	leaseLocal prometheus.Histogram
	leaseUnits *prometheus.CounterVec
	leaseHeld  prometheus.Gauge
	// giveBackFailed counts non-lease give-backs that did not land after every attempt.
	giveBackFailed *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_store_requests_total",
			Help: "DynamoDB calls made by the rate-limit store, by operation (update, batch_get, transact, refund, seal, reap, renew, release, lease, lease_refund).",
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_dynamodb_errors_total",
			Help: "DynamoDB calls that failed with an error other than a condition failure, by operation.",
		}, []string{"op"}),
		denyHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_deny_cache_hits_total",
			Help: "Charges rejected from the local deny cache without calling DynamoDB.",
		}),
		batchCharges: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ratelimit_dynamodb_batch_charges",
			Help: "Charges of one item decided together by its coalesced writes (Refund mode): the charges that arrived while the item's previous write was in flight.",
			// 1 to 128 (maxBatch).
			Buckets: prometheus.ExponentialBuckets(1, 2, 8),
		}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_dynamodb_leases_total",
			Help: "Lease renewals of leased policies, by result (granted, empty: every shard was empty, error).",
		}, []string{"result"}),
		leaseLocal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "ratelimit_dynamodb_lease_local_decision_seconds",
			Help: "Time to decide a leased charge without a DynamoDB round trip: spent from this replica's lease, or rejected while the pool is empty.",
			// 1µs to 100ms, ×√10 apart.
			Buckets: histbuckets.Range(1e-6, 0.1, 11),
		}),
		leaseUnits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_dynamodb_lease_units_total",
			Help: "Units of leased capacity, by outcome (leased from the table, spent by admitted requests, refunded unspent, expired unspent: capacity the pool lost; unanswered: asked for by a lease write whose answer never came, not part of leased).",
		}, []string{"outcome"}),
		leaseHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_dynamodb_lease_units_held",
			Help: "Units this replica holds in live leases, unspent. Leased = spent + refunded + expired + held, up to the units of decisions in progress.",
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_dynamodb_throttled_total",
			Help: "DynamoDB calls throttled (ProvisionedThroughputExceeded, ThrottlingException, RequestLimitExceeded), by operation; each is retried with backoff within the decision's deadline.",
		}, []string{"op"}),
	}
	m.giveBackFailed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_dynamodb_giveback_failures_total",
		Help: "Give-backs (a rejected group's refunds: op=refund; charge_on refunds and slot releases: op=release) that failed after every attempt: the limit stays stricter by what they would have given back (a slot until its lease expires).",
	}, []string{"op"})
	m.reaped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_dynamodb_slots_reaped_total",
		Help: "Concurrency slots whose lease expired (their replica stopped renewing them) and that a take removed.",
	})
	for _, op := range []string{opUpdate, opBatchGet, opTransact, opRefund, opSeal, opReap, opRenew, opRelease, opLease, opLeaseRefund} {
		m.requests.WithLabelValues(op)
		m.errors.WithLabelValues(op)
		m.throttled.WithLabelValues(op)
	}
	m.giveBackFailed.WithLabelValues(opRefund)
	m.giveBackFailed.WithLabelValues(opRelease)
	if reg != nil {
		m.requests = register(reg, m.requests)
		m.errors = register(reg, m.errors)
		m.denyHits = register(reg, m.denyHits)
		m.batchCharges = register(reg, m.batchCharges)
		m.reaped = register(reg, m.reaped)
		m.leases = register(reg, m.leases)
		m.leaseLocal = register(reg, m.leaseLocal)
		m.leaseUnits = register(reg, m.leaseUnits)
		m.leaseHeld = register(reg, m.leaseHeld)
		m.throttled = register(reg, m.throttled)
		m.giveBackFailed = register(reg, m.giveBackFailed)
	}
	return m
}

// register registers c, or returns the collector already registered under the same name so that
// several stores (one per table, or replicas in a test) can share one registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	if err != nil {
		// A different collector under our name is a wiring bug that no caller can handle.
		panic(err)
	}
	return c
}
