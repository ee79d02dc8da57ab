package e2e

import (
	"crypto/sha256"
	bin "encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestFloodKeepsExhaustedQuota is issue 18's eviction attack through the binary: a client
// exhausts its daily quota and its token bucket; then 20 times store.max_keys (1,000) distinct API keys, plus 2,000 crafted
// against the shard choice the memory store had before (it took the shard from the first 8
// bytes of the bucket key, SHA-256 of the policy's name, algorithm, key kind and calendar and
// of the value, all public), are sent at full speed. The victim's limits must stay exhausted, the
// store must hold at most max_keys, and the evictions must be counted by kind. A second flood of
// keys that each reach their own limit with one request fills the store with keys at their
// limit: new keys are then judged in the memory store's sketch, each at its own limit (a few
// refused early, all counted), and still no exhausted key is reset.
func TestFloodKeepsExhaustedQuota(t *testing.T) {
	const maxKeys = 1000
	// A period that ends during the test would reset the quota for real: use a zone whose
	// midnight is hours away.
	zone := "UTC"
	if h := time.Now().UTC().Hour(); h >= 22 || h < 2 {
		zone = "Asia/Tokyo"
	}
	up := newUpstream(t, nil)
	g := startGateway(t, up.URL, fmt.Sprintf(`store:
  max_keys: %d
policies:
  - name: daily
    key: api_key
    algorithm: quota
    limit: 5
    period: day
    time_zone: %s
    match: {path_prefix: /a/}
  - name: bucket
    key: api_key
    algorithm: token_bucket
    rate: 1/h
    burst: 3
    match: {path_prefix: /t/}
  - name: once
    key: api_key
    algorithm: quota
    limit: 1
    period: day
    time_zone: %s
    match: {path_prefix: /b/}
`, maxKeys, zone, zone))
	c := newClient(t, 30*time.Second)
	apiKey := func(v string) func(int) []string {
		return func(int) []string { return []string{"X-Api-Key", v} }
	}
	// The victim: its daily quota (5) and its token bucket (3 an hour) spent.
	for _, v := range []struct {
		path string
		n    int
	}{{"/a/x", 5}, {"/t/x", 3}} {
		for i, a := range burst(c, g.proxy+v.path, v.n+1, 1, apiKey("victim")) {
			if want := map[bool]int{true: 200, false: 429}[i < v.n]; a.err != nil || a.status != want {
				t.Fatalf("victim request %d on %s: got %d %v, want %d", i+1, v.path, a.status, a.err, want)
			}
		}
	}
	victimStill := func(when string) {
		t.Helper()
		for _, path := range []string{"/a/x", "/t/x"} {
			if a := fetch(c, g.proxy+path, "X-Api-Key", "victim"); a.err != nil || a.status != 429 {
				t.Errorf("the victim's exhausted limit on %s %s: got %d %v, want 429", path, when, a.status, a.err)
			}
		}
	}

	// Crafted values: the daily policy's bucket keys of these values share the old shard of one
	// of the victim's keys (32 shards for 1,000 keys on up to 32 CPUs; each value costs about 32
	// hashes to find).
	oldShard := func(prefix, v string) uint64 {
		sum := sha256.Sum256([]byte(prefix + v))
		return bin.LittleEndian.Uint64(sum[:8]) & 31
	}
	daily := "daily\x00quota\x00api_key\x00day/" + zone + "/0\x00"
	targets := []uint64{oldShard(daily, "victim"), oldShard("bucket\x00token_bucket\x00api_key\x00", "victim")}
	rng := rand.New(rand.NewPCG(18, 3))
	var values []string
	for crafted := 0; crafted < 2000; {
		v := fmt.Sprintf("c%016x", rng.Uint64())
		if oldShard(daily, v) == targets[crafted%2] {
			values = append(values, v)
			crafted++
		}
	}
	for range 20 * maxKeys {
		values = append(values, fmt.Sprintf("r%016x", rng.Uint64()))
	}
	rng.Shuffle(len(values), func(i, j int) { values[i], values[j] = values[j], values[i] })
	start := time.Now()
	as := burst(c, g.proxy+"/a/x", len(values), 32, func(i int) []string { return []string{"X-Api-Key", values[i]} })
	took := time.Since(start)
	for i, a := range as {
		if a.err != nil || a.status != 200 {
			t.Fatalf("flood request %d (a new key with room): got %d %v, want 200", i, a.status, a.err)
		}
	}
	keys := metric(t, g.admin, "ratelimit_memory_keys")
	leastUsed := metric(t, g.admin, `ratelimit_memory_evictions_total{kind="least_used"}`)
	t.Logf("%d keys (2000 crafted) in %v (%.0f/s, race-enabled binary): %v tracked, %v least-used evicted",
		len(values), took.Round(time.Millisecond), float64(len(values))/took.Seconds(), keys, leastUsed)
	victimStill("after a flood of keys with room")
	if keys > maxKeys {
		t.Errorf("ratelimit_memory_keys: got %v, want at most %d", keys, maxKeys)
	}
	if leastUsed <= 0 {
		t.Errorf(`ratelimit_memory_evictions_total{kind="least_used"}: got %v, want the flood's keys evicted`, leastUsed)
	}

	// Keys that reach their limit with their first request: the policy's share of the store
	// fills with them, then its new keys are judged in the sketch rather than evict one: each at
	// its own quota of 1 a day, refused early only when all its cells were charged by others.
	as = burst(c, g.proxy+"/b/x", 2*maxKeys, 32, func(i int) []string { return []string{"X-Api-Key", fmt.Sprintf("x%d", i)} })
	refused := 0
	for i, a := range as {
		switch {
		case a.err != nil || a.status != 200 && a.status != 429:
			t.Fatalf("flood of keys at their limit, request %d: got %d %v, want 200 or 429", i, a.status, a.err)
		case a.status == 429:
			refused++
			if !strings.Contains(a.body, "once") {
				t.Errorf("a refused new key's 429 names no policy: %q", a.body)
			}
		}
	}
	victimStill("after a flood of keys at their limit")
	overflow := metric(t, g.admin, "ratelimit_memory_overflow_total")
	t.Logf("second flood: %d of %d new keys refused early, ratelimit_memory_overflow_total %v", refused, 2*maxKeys, overflow)
	if overflow < maxKeys || float64(refused) > overflow/10 {
		t.Errorf("new keys in the sketch: %d answers 429, ratelimit_memory_overflow_total %v; want at least %d judged in the sketch (the keys past the policy's share), at most a tenth of them refused", refused, overflow, maxKeys)
	}
	if got := metric(t, g.admin, "ratelimit_memory_keys_refused_total"); got != 0 {
		t.Errorf("ratelimit_memory_keys_refused_total: got %v, want 0 (the sketch decides)", got)
	}
	if keys := metric(t, g.admin, "ratelimit_memory_keys"); keys > maxKeys {
		t.Errorf("ratelimit_memory_keys after the second flood: got %v, want at most %d", keys, maxKeys)
	}
}
