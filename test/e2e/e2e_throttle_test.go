package e2e

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
)

// TestThrottledDynamoFollowsOnError: the gateway's table sits behind a relay that answers every
// write past one per item per second ProvisionedThroughputExceededException, exactly as DynamoDB
// does past an item's partition limit. Requests one after another at one hot key (so that write coalescing cannot fold them into one
// write) are then throttled: each throttled
// write is retried within store.timeout and counted, and a decision that still cannot be written
// follows on_error (deny: 503; allow: forwarded without rate-limit headers). Throttling never
// admits a request as if it had been counted, it does not crash the gateway, and the circuit stays
// closed (/readyz 200): it is one hot item, not an outage.
func TestThrottledDynamoFollowsOnError(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	relay, err := ddbrelay.New(endpoint, ddbrelay.Options{WritesPerItemPerSecond: 1})
	if err != nil {
		t.Fatal(err)
	}
	rs := httptest.NewServer(relay)
	t.Cleanup(rs.Close)
	table := "e2e-throttle-" + randomSuffix()
	for _, onError := range []string{"deny", "allow"} {
		t.Run(onError, func(t *testing.T) {
			up := newUpstream(t, nil)
			cfg := dynamoStore(table, rs.URL, true, "300ms", "  on_error: "+onError+"\n") + `policies:
  - name: hot
    key: global
    algorithm: token_bucket
    rate: 1000/s
    burst: 1000
`
			g := startGateway(t, up.URL, cfg, awsEnv()...)
			const requests = 8
			status := map[int]int{}
			headers := map[int]int{} // answers with X-RateLimit-Limit, by status
			for range requests {
				resp, _ := get(t, g.proxy+"/x")
				status[resp.StatusCode]++
				if resp.Header.Get("X-Ratelimit-Limit") != "" {
					headers[resp.StatusCode]++
				}
			}
			throttled := metric(t, g.admin, `ratelimit_dynamodb_throttled_total{op="update"}`)
			if throttled <= 0 {
				t.Fatalf("ratelimit_dynamodb_throttled_total{op=\"update\"} = %v after %d requests on one item behind a 1 write/s budget, want > 0", throttled, requests)
			}
			// Requests whose charge was written are admitted with headers; the others follow
			// on_error.
			counted := headers[http.StatusOK]
			switch onError {
			case "deny":
				if status[http.StatusServiceUnavailable] == 0 || counted == 0 || status[http.StatusOK]+status[http.StatusServiceUnavailable] != requests {
					t.Errorf("statuses %v: want 200s (written) and 503s (throttled past the deadline), %d in all", status, requests)
				}
				if status[http.StatusOK] != counted {
					t.Errorf("%d admitted, %d of them with rate-limit headers: with on_error deny every admitted request was counted", status[http.StatusOK], counted)
				}
			case "allow":
				if status[http.StatusOK] != requests || counted == requests || counted == 0 {
					t.Errorf("statuses %v, %d with headers: want %d forwarded, those throttled past the deadline without headers", status, counted, requests)
				}
			}
			if got := int(up.hits.Load()); got != status[http.StatusOK] {
				t.Errorf("upstream hits %d, want the %d admitted", got, status[http.StatusOK])
			}
			if resp, _ := get(t, g.admin+"/readyz"); resp.StatusCode != http.StatusOK {
				t.Errorf("/readyz %d while one item is throttled, want 200 (the circuit stays closed)", resp.StatusCode)
			}
			t.Logf("on_error %s: statuses %v, %d counted, %v throttled calls", onError, status, counted, throttled)
		})
	}
}
