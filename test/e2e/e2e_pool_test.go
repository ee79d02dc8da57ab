package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// poolPolicies are two services' policies on one account pool: they call their policies
// differently, set namespaces of their own, and share only because both name pool acme-account.
// The pool is a leased fixed window (a week long, so its boundary is one minute a week), split
// over two items.
const poolPolicies = `policies:
  - name: %s-account
    key: global
    algorithm: fixed_window
    limit: 40
    window: 168h
    pool: acme-account
    lease: {enabled: true, shards: 2, ttl: 200ms}
`

// TestTwoServicesShareOnePool: two gateways in front of two different upstreams draw from one
// pool: together they never admit more than its limit, and the capacity that one gateway leased
// but did not spend comes back to the other, so the total reaches the limit exactly.
func TestTwoServicesShareOnePool(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	const week = 168 * time.Hour
	if untilBoundary := week - time.Duration(time.Now().UnixNano()%int64(week)); untilBoundary < time.Minute {
		t.Skipf("the week-long window ends within a minute (%s); rerun after it", time.Now().Format(time.TimeOnly))
	}
	table := "e2e-pool-" + randomSuffix()
	checkoutUp, searchUp := newUpstream(t, nil), newUpstream(t, nil)
	store := func(namespace string) string {
		return dynamoStore(table, endpoint, true, "5s", "  on_error: deny\n") + "    namespace: " + namespace + "\n"
	}
	checkout := startGateway(t, checkoutUp.URL, store("checkout")+fmt.Sprintf(poolPolicies, "checkout"), awsEnv()...)
	search := startGateway(t, searchUp.URL, store("search")+fmt.Sprintf(poolPolicies, "search"), awsEnv()...)
	gws := []*gateway{checkout, search}

	var mu sync.Mutex
	status := map[int]int{}
	hammer := func(n int) {
		var wg sync.WaitGroup
		for g := range n {
			wg.Go(func() {
				code := statusOf(gws[g%2].proxy+"/x", "")
				mu.Lock()
				status[code]++
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	hammer(60) // both services at once: more than the pool holds
	mu.Lock()
	first := status[http.StatusOK]
	mu.Unlock()
	if first > 40 {
		t.Fatalf("the first 60 requests: %d admitted, want at most 40", first)
	}
	// Units one gateway leased and did not spend go back when its leases' TTL ends; keep asking
	// (both gateways) until the pool is used up, within a deadline.
	// One request to each gateway per tick: the leases' TTL is 200ms.
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		mu.Lock()
		ok := status[http.StatusOK]
		mu.Unlock()
		if ok >= 40 || time.Now().After(deadline) {
			break
		}
		<-tick.C
		hammer(2)
	}
	hammer(20) // and then nothing more
	// Where the leased units went, per gateway: every unit leased is spent, refunded or expired
	// once the gateway's idle pools have given their units back (after their 200ms TTL), and
	// the spent ones are the upstream's hits. A unit leased and neither spent nor refunded
	// (expired, or a give-back that failed) is capacity the pool lost.
	var spent float64
	for i, g := range gws {
		units := map[string]float64{}
		settled := time.Now().Add(10 * time.Second)
		for {
			for _, o := range []string{"leased", "spent", "refunded", "expired"} {
				units[o] = metric(t, g.admin, fmt.Sprintf(`ratelimit_dynamodb_lease_units_total{outcome=%q}`, o))
			}
			units["held"] = metric(t, g.admin, `ratelimit_dynamodb_lease_units_held`)
			if units["held"] == 0 && units["leased"] == units["spent"]+units["refunded"]+units["expired"] || time.Now().After(settled) {
				break
			}
			<-tick.C
		}
		t.Logf("gateway %d: lease units %v; lease_refund errors %v", i, units,
			metric(t, g.admin, `ratelimit_dynamodb_errors_total{op="lease_refund"}`))
		if units["held"] != 0 || units["leased"] != units["spent"]+units["refunded"]+units["expired"] {
			t.Errorf("gateway %d: lease units %v: want none held and leased = spent + refunded + expired", i, units)
		}
		spent += units["spent"]
	}
	if spent != 40 {
		t.Errorf("lease units spent %v across the gateways, want the 40 admitted", spent)
	}
	mu.Lock()
	defer mu.Unlock()
	if status[http.StatusOK] != 40 {
		t.Errorf("statuses %v: got %d admitted in all, want exactly the pool's 40", status, status[http.StatusOK])
	}
	for code, n := range status {
		if code != http.StatusOK && code != http.StatusTooManyRequests {
			t.Errorf("%d answers with status %d, want only 200 and 429", n, code)
		}
	}
	if got := checkoutUp.hits.Load() + searchUp.hits.Load(); got != 40 {
		t.Errorf("upstream hits: checkout %d + search %d = %d, want 40", checkoutUp.hits.Load(), searchUp.hits.Load(), got)
	}
	if checkoutUp.hits.Load() == 0 || searchUp.hits.Load() == 0 {
		t.Errorf("upstream hits checkout %d, search %d: want both services served from the pool", checkoutUp.hits.Load(), searchUp.hits.Load())
	}
}
