package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// adminDynamoPolicies: a bucket per user, and a leased pool per user (two shards).
const adminDynamoPolicies = `identity:
  user_header: X-User-Id
admin:
  token_env: ADMIN_TOKEN
policies:
  - name: tb
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 3
    match: {path_prefix: /tb/}
  - name: pool
    key: user
    algorithm: token_bucket
    rate: 1/h
    burst: 40
    lease: {enabled: true, shards: 2, ttl: 200ms}
    match: {path_prefix: /pool/}
`

// Bounds of the console on DynamoDB (docs/operations.md): a replica reads the shared resets
// and exemptions every second, within store.timeout, and a leased pool's units outlive a reset
// by at most one lease TTL.
const (
	adminSyncPeriod   = time.Second
	adminStoreTimeout = 500 * time.Millisecond
	adminLeaseTTL     = 200 * time.Millisecond
)

// waitStatus polls url as user until it answers want, and returns how long that took; the
// test fails past limit.
func waitStatus(t *testing.T, url, user string, want int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if statusOf(url, user) == want {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			t.Fatalf("%s as %s: no %d within %v", url, user, want, limit)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// TestAdminConsoleDynamoTwoReplicas: on DynamoDB Local with two replicas (deny caches on), a
// key's state matches the header, a reset through one replica admits the next request on both
// within the stated bound (a leased pool included), and an exemption made on one raises the
// limit on both and ends on time.
func TestAdminConsoleDynamoTwoReplicas(t *testing.T) {
	endpoint := dynamoEndpoint(t)
	table := "e2e-admin-" + randomSuffix()
	up := newUpstream(t, nil)
	cfg := dynamoStore(table, endpoint, true, adminStoreTimeout.String(), "  on_error: deny\n") +
		"    deny_cache: true\n" + adminDynamoPolicies
	env := append(awsEnv(), "ADMIN_TOKEN="+adminToken)
	a := startGateway(t, up.URL, cfg, env...)
	b := startGateway(t, up.URL, cfg, env...)
	user := "user-" + randomSuffix()

	// Exhaust the bucket through both replicas; b's refusals are in its deny cache.
	var last *http.Response
	for i := range 3 {
		gw := []*gateway{a, b}[i%2]
		last, _ = get(t, gw.proxy+"/tb/x", "X-User-Id", user)
	}
	if last.StatusCode != http.StatusOK || last.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("third request: %d remaining %q, want 200 and 0", last.StatusCode, last.Header.Get("X-RateLimit-Remaining"))
	}
	for _, gw := range []*gateway{a, b, b} {
		if code := statusOf(gw.proxy+"/tb/x", user); code != http.StatusTooManyRequests {
			t.Fatalf("past the limit: %d, want 429", code)
		}
	}
	for _, gw := range []*gateway{a, b} {
		if ks := peekKey(t, gw.admin, "tb", user); ks.Remaining != 0 || !ks.Limited || ks.Limit != 3 {
			t.Fatalf("peek on %s: %+v, want limited with 0 of 3 left", gw.admin, ks)
		}
	}

	bound := adminSyncPeriod + adminStoreTimeout + adminLeaseTTL
	code, body := adminCall(t, http.MethodPost, a.admin+"/v1/keys/tb/reset", adminToken, map[string]string{"key": user})
	if code != http.StatusOK {
		t.Fatalf("reset: %d %s", code, body)
	}
	if d := waitStatus(t, b.proxy+"/tb/x", user, http.StatusOK, 2*bound); d > bound {
		t.Errorf("the other replica admitted %v after the reset, want within %v", d, bound)
	}
	if code := statusOf(a.proxy+"/tb/x", user); code != http.StatusOK {
		t.Fatalf("the resetting replica after the reset: %d, want 200", code)
	}

	// A leased pool: 40 units leased and spent through both replicas, then a reset.
	admitted := 0
	for i := range 60 {
		if statusOf([]*gateway{a, b}[i%2].proxy+"/pool/x", user) == http.StatusOK {
			admitted++
		}
	}
	if admitted > 40 {
		t.Fatalf("the pool admitted %d, want at most 40", admitted)
	}
	for _, gw := range []*gateway{a, b} {
		waitStatus(t, gw.proxy+"/pool/x", user, http.StatusTooManyRequests, 5*time.Second)
	}
	code, body = adminCall(t, http.MethodPost, b.admin+"/v1/keys/pool/reset", adminToken, map[string]string{"key": user})
	if code != http.StatusOK {
		t.Fatalf("pool reset: %d %s", code, body)
	}
	for _, gw := range []*gateway{a, b} {
		if d := waitStatus(t, gw.proxy+"/pool/x", user, http.StatusOK, 2*bound); d > bound {
			t.Errorf("leased pool on %s admitted %v after the reset, want within %v", gw.proxy, d, bound)
		}
	}

	// An exemption made on a applies on b, and ends on both at its expiry.
	other := "user-" + randomSuffix()
	for range 3 {
		get(t, a.proxy+"/tb/x", "X-User-Id", other)
	}
	code, body = adminCall(t, http.MethodPost, a.admin+"/v1/exemptions", adminToken, map[string]any{
		"policy": "tb", "key": other, "limit": map[string]any{"rate": "1/h", "burst": 100}, "expires_in": "4s", "reason": "launch"})
	if code != http.StatusCreated || strings.Contains(body, other) {
		t.Fatalf("exempt: %d %s (the raw user id must not be echoed)", code, body)
	}
	ends := time.Now().Add(4 * time.Second)
	if d := waitStatus(t, b.proxy+"/tb/x", other, http.StatusOK, 2*bound); d > adminSyncPeriod+adminStoreTimeout {
		t.Errorf("the exemption applied on the other replica after %v, want within %v", d, adminSyncPeriod+adminStoreTimeout)
	}
	for _, gw := range []*gateway{a, b} {
		if time.Until(ends) < time.Second {
			t.Fatal("too slow to check the exemption before it ends")
		}
		if code := statusOf(gw.proxy+"/tb/x", other); code != http.StatusOK {
			t.Fatalf("exempt user on %s: %d, want 200", gw.proxy, code)
		}
	}
	for _, gw := range []*gateway{a, b} {
		limit := time.Until(ends) + adminSyncPeriod + adminStoreTimeout
		waitStatus(t, gw.proxy+"/tb/x", other, http.StatusTooManyRequests, limit)
		if late := time.Since(ends); late > adminSyncPeriod {
			t.Errorf("the exemption still applied on %s %v after its expiry", gw.proxy, late)
		}
	}
	for _, gw := range []*gateway{a, b} {
		if strings.Contains(gw.logs.String(), user) || strings.Contains(gw.logs.String(), adminToken) {
			t.Errorf("a raw user id or the token in %s's logs", gw.proxy)
		}
	}
}
