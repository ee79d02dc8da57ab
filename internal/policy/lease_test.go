package policy

import (
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

const leaseBase = "upstream: http://127.0.0.1:3000\n"

func TestValidateLeaseAndPool(t *testing.T) {
	pol := func(extra string) string {
		return leaseBase + "policies:\n  - {name: account, key: global, algorithm: token_bucket, rate: 2000/s, burst: 1000" + extra + "}\n"
	}
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"lease on", pol(", lease: {enabled: true}"), nil},
		{"lease sharded with ttl", pol(", lease: {enabled: true, shards: 4, ttl: 100ms}"), nil},
		{"fixed window lease", leaseBase + "policies:\n  - {name: q, key: api_key, algorithm: fixed_window, limit: 600, window: 1m, lease: {enabled: true, shards: 3}}\n", nil},
		{"pool", pol(", pool: acme-account"), nil},
		{"pool name", pol(", pool: 'acme account'"), []string{`policies[0].pool: "acme account": must be 1 to 64 of A-Z a-z 0-9 _ . -`}},
		{"fields without enabled", pol(", lease: {shards: 4}"),
			[]string{`policies[0].lease.enabled: "false": lease fields are set, but enabled is false: set enabled: true, or remove the block`}},
		{"sliding window", leaseBase + "policies:\n  - {name: s, key: global, algorithm: sliding_window, limit: 10, window: 1m, lease: {enabled: true}}\n",
			[]string{`policies[0].lease.enabled: "true": leases serve token_bucket and fixed_window only, not sliding_window (see docs/shared-pools.md)`}},
		{"leaky bucket", leaseBase + "policies:\n  - {name: l, key: global, algorithm: leaky_bucket, rate: 10/s, burst: 10, lease: {enabled: true}}\n",
			[]string{`policies[0].lease.enabled: "true": leases serve token_bucket and fixed_window only, not leaky_bucket (see docs/shared-pools.md)`}},
		{"too many shards", pol(", lease: {enabled: true, shards: 65}"), []string{`policies[0].lease.shards: "65": must be from 1 to 64`}},
		{"shards over the burst", leaseBase + "policies:\n  - {name: a, key: global, algorithm: token_bucket, rate: 10/s, burst: 3, lease: {enabled: true, shards: 4}}\n",
			[]string{`policies[0].lease.shards: "4": must be at most the burst (3): every shard holds at least one request of it`}},
		{"one per shard", leaseBase + "policies:\n  - {name: a, key: global, algorithm: token_bucket, rate: 10/s, burst: 4, lease: {enabled: true, shards: 4}}\n",
			[]string{`policies[0].lease.shards: "4": leaves 1 of the burst (4) to a shard: a leased token bucket needs at least 2 per shard`}},
		{"ttl past the burst", pol(", lease: {enabled: true, shards: 2, ttl: 600ms}"),
			[]string{`policies[0].lease.ttl: "600ms": must be at most 499ms (the smallest shard's burst time less one interval): leased units come out of the burst less rate×ttl`}},
		{"charge_on", pol(", charge_on: [429], lease: {enabled: true}"),
			[]string{`policies[0].lease.enabled: "true": cannot be combined with charge_on: a leased unit is spent when the request is admitted`}},
		{"negative ttl", pol(", lease: {enabled: true, ttl: -1s}"), []string{`policies[0].lease.ttl: "-1s": must be positive`}},
		{"override too small for the shards", leaseBase + "policies:\n  - {name: k, key: api_key, algorithm: token_bucket, rate: 100/s, burst: 100, lease: {enabled: true, shards: 8},\n     overrides: [{key: 'sha256:" + strings.Repeat("a", 64) + "', burst: 5}]}\n",
			[]string{`policies[0].lease.shards: "8": must be at most the burst (5): every shard holds at least one request of it`}},
		{"namespace", leaseBase + "store: {backend: dynamodb, dynamodb: {table: rate-limits, region: us-east-1, namespace: checkout}}\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil},
		{"namespace name", leaseBase + "store: {backend: dynamodb, dynamodb: {table: rate-limits, region: us-east-1, namespace: 'a/b'}}\npolicies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n",
			[]string{`store.dynamodb.namespace: "a/b": must be 1 to 64 of A-Z a-z 0-9 _ . -`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.yaml, noEnv)
			got := errorLines(t, cfg.Validate(noEnv))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

// chargesOf compiles yaml and returns the charges of one GET / from 192.0.2.1 with API key k.
func chargesOf(t *testing.T, yaml string) []bucket.Charge {
	t.Helper()
	s, err := Compile(mustParse(t, yaml, noEnv), CompileOptions{Getenv: noEnv})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	r.Header.Set("X-Api-Key", "k")
	var p Plan
	if err := s.Plan(r, &p); err != nil {
		t.Fatal(err)
	}
	return p.Charges
}

// TestPoolKeys: two gateways that name one pool share its buckets whatever they call the
// policy; without a pool, two services that call a policy alike share only when they do not set
// namespaces; and a policy without pool or namespace keeps the keys it always had.
func TestPoolKeys(t *testing.T) {
	one := func(name, extra string) string {
		return leaseBase + "policies:\n  - {name: " + name + ", key: api_key, algorithm: token_bucket, rate: 10/s, burst: 10" + extra + "}\n"
	}
	ns := func(namespace, name string) string {
		return leaseBase + "store: {backend: dynamodb, dynamodb: {table: rate-limits, region: us-east-1, namespace: " + namespace + "}}\n" +
			"policies:\n  - {name: " + name + ", key: api_key, algorithm: token_bucket, rate: 10/s, burst: 10}\n"
	}
	key := func(yaml string) bucket.Key { return chargesOf(t, yaml)[0].Key }

	if key(one("checkout-account", ", pool: acme")) != key(one("search-account", ", pool: acme")) {
		t.Error("two policies naming pool acme got different keys, want one")
	}
	if key(one("account", ", pool: acme")) == key(one("account", ", pool: other")) {
		t.Error("pools acme and other got one key, want two")
	}
	if key(one("account", ", pool: acme")) == key(one("account", "")) {
		t.Error("a pool shares its key with the policy's own, want apart")
	}
	if key(ns("checkout", "account")) == key(ns("search", "account")) {
		t.Error("policy account in namespaces checkout and search got one key, want two")
	}
	if key(ns("checkout", "account")) == key(one("account", "")) {
		t.Error("a namespaced policy shares its key with the bare one, want apart")
	}
	// The digest of the policy's name, algorithm, key kind and value: the key a policy without
	// pool or namespace has always had (so upgrading moves no state).
	want := digest([]byte("account\x00token_bucket\x00api_key\x00"), "k")
	var wantKey bucket.Key
	copy(wantKey[:], want[:])
	if got := key(one("account", "")); got != wantKey {
		t.Errorf("key of a plain policy: got %s, want %s (unchanged)", got, wantKey)
	}
	// A pool's and a namespace's keys, byte for byte: the pool's name is marked as Envoy rules'
	// pools are (TestRLSKeyBytes), the namespace wraps the policy's name.
	for _, tt := range []struct {
		name, yaml, prefix string
	}{
		{"pool", one("account", ", pool: acme"), "\x02pool\x00acme\x00token_bucket\x00api_key\x00"},
		{"namespace", ns("checkout", "account"), "\x01ns\x00checkout\x00account\x00token_bucket\x00api_key\x00"},
	} {
		want := digest([]byte(tt.prefix), "k")
		copy(wantKey[:], want[:])
		if got := key(tt.yaml); got != wantKey {
			t.Errorf("key of a policy with a %s: got %s, want %s", tt.name, got, wantKey)
		}
	}
}

func TestLeaseReachesTheCharge(t *testing.T) {
	c := chargesOf(t, leaseBase+"policies:\n  - {name: a, key: global, algorithm: token_bucket, rate: 100/s, burst: 100, lease: {enabled: true, shards: 3, ttl: 50ms}}\n")
	if want := (bucket.Lease{Shards: 3, TTL: 50 * time.Millisecond}); c[0].Lease != want {
		t.Errorf("charge's lease: got %+v, want %+v", c[0].Lease, want)
	}
	c = chargesOf(t, leaseBase+"policies:\n  - {name: a, key: global, algorithm: token_bucket, rate: 100/s, burst: 100, lease: {enabled: true}}\n")
	if want := (bucket.Lease{Shards: 1}); c[0].Lease != want {
		t.Errorf("charge's lease with defaults: got %+v, want %+v", c[0].Lease, want)
	}
	c = chargesOf(t, leaseBase+"policies:\n  - {name: a, key: global, algorithm: token_bucket, rate: 100/s, burst: 100}\n")
	if c[0].Lease.On() {
		t.Errorf("a policy without lease got %+v, want off", c[0].Lease)
	}
}
