package e2e

// End-to-end tests of store.backend redis: real gateway processes sharing one Debian
// redis-server (scripts/redis.sh, started here when make test did not export REDIS_URL).

import (
	"context"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/redislocal"
)

var redisSingle = redislocal.Lazy{Mode: redislocal.Single}

// redisURL returns the single node's URL; the test fails when none can be started.
func redisURL(t *testing.T) string {
	t.Helper()
	inst, err := redisSingle.Get()
	if err != nil {
		t.Fatalf("redis: %v", err)
	}
	return inst.URLs[0]
}

func redisStore(url, prefix, onError string) string {
	return "store:\n  backend: redis\n  timeout: 2s\n  on_error: " + onError + "\n  redis:\n    url: " + url + "\n    key_prefix: '" + prefix + "'\n"
}

func TestRedisThreeReplicasAdmitExactlyTheLimit(t *testing.T) {
	url := redisURL(t)
	prefix := "e2e" + randomSuffix() + ":"
	up := newUpstream(t, nil)
	cfg := redisStore(url, prefix, "deny") + sharedPolicies
	var gws []*gateway
	for range 3 {
		gws = append(gws, startGateway(t, up.URL, cfg))
	}
	user := "user-e2e-" + randomSuffix()
	for _, path := range []string{"/tb/", "/fw/", "/sw/", "/qm/", "/qc/"} {
		t.Run(strings.Trim(path, "/"), func(t *testing.T) {
			before := up.hits.Load()
			var (
				mu     sync.Mutex
				status = map[int]int{}
				wg     sync.WaitGroup
			)
			const goroutines, each = 60, 3
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						code := statusOf(gws[(g+i)%len(gws)].proxy+path+"x", user)
						mu.Lock()
						status[code]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if status[http.StatusOK] != 25 || status[http.StatusTooManyRequests] != goroutines*each-25 {
				t.Errorf("statuses got %v, want exactly 25 x 200 and %d x 429", status, goroutines*each-25)
			}
			if got := up.hits.Load() - before; got != 25 {
				t.Errorf("upstream hits got %d, want 25", got)
			}
		})
	}

	// SCAN shows digests, never the user; every key expires.
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.ForceSingleClient, opt.DisableCache = true, true
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	keys, err := c.Do(ctx, c.B().Keys().Pattern(prefix+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 5 {
		t.Errorf("got keys %v, want 5 (one per policy)", keys)
	}
	keyRe := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `\{[0-9a-f]{32}\}:[bfsc]$`)
	for _, k := range keys {
		if !keyRe.MatchString(k) {
			t.Errorf("key %q does not match %s", k, keyRe)
		}
		if ttl, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64(); err != nil || ttl <= 0 {
			t.Errorf("key %q: PTTL %d (%v), want an expiry", k, ttl, err)
		}
		vals, err := c.Do(ctx, c.B().Hgetall().Key(k).Build()).AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range vals {
			if strings.Contains(f+v, "user-e2e") {
				t.Errorf("key %q field %s=%s holds the raw user", k, f, v)
			}
		}
	}
}

// TestRedisUnreachableFollowsOnError: a gateway whose Redis does not answer starts, decides by
// on_error, answers /readyz 503 only with deny, and says so in one line, not once a second.
func TestRedisUnreachableFollowsOnError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "redis://" + l.Addr().String()
	l.Close() // nothing listens there now
	up := newUpstream(t, nil)
	policies := "policies:\n  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"

	allow := startGateway(t, up.URL, redisStore(dead, "rl:", "allow")+policies)
	for range 3 {
		if code := statusOf(allow.proxy+"/a", "u"); code != http.StatusOK {
			t.Errorf("on_error allow: got %d, want 200 (the store is out)", code)
		}
	}

	deny := launchGateway(t, nil, up.URL, redisStore(dead, "rl:", "deny")+policies)
	eventually(t, "a deny gateway serving", func() bool {
		resp, err := http.Get(deny.proxy + "/a")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	resp, err := http.Get(deny.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("on_error deny, store out: /readyz got %d, want 503", resp.StatusCode)
	}
	resp, err = http.Get(allow.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("on_error allow, store out: /readyz got %d, want 200", resp.StatusCode)
	}
	// Three seconds of requests: still one startup line, and the circuit's lines only when it
	// changes state.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		statusOf(allow.proxy+"/a", "u")
		time.Sleep(50 * time.Millisecond) // pacing the load, not waiting for a state
	}
	logs := allow.logs.String()
	if n := strings.Count(logs, "redis did not answer at startup"); n != 1 {
		t.Errorf("got %d startup lines, want 1:\n%s", n, logs)
	}
	if n := strings.Count(logs, "reading the shared exemptions failed"); n != 1 {
		t.Errorf("got %d lines of failed exemption reads in 3 s, want 1 (then one a minute):\n%s", n, logs)
	}
	if n := strings.Count(logs, "circuit open, decisions follow"); n > 3 {
		t.Errorf("got %d circuit-open lines in 3 s, want a few at most (one per state change):\n%s", n, logs)
	}
}

// TestRLSRedis: envoyproxy/ratelimit's sequences through the rate limit service on Redis, and a
// reload.
func TestRLSRedis(t *testing.T) {
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, redisStore(redisURL(t), "rls"+randomSuffix()+":", "allow"), "")
	rlsSequences(t, g, randomSuffix())
	rlsReload(t, g)
}
