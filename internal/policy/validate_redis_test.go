package policy

import (
	"strings"
	"testing"
)

func TestParseRedisDefaults(t *testing.T) {
	cfg := mustParse(t, minimal+"store: {backend: redis, redis: {url: 'redis://127.0.0.1:6379/0'}}\n", noEnv)
	r := cfg.Store.Redis
	if r == nil || r.URL != "redis://127.0.0.1:6379/0" || r.Mode != "single" || r.KeyPrefix != "rl:" || r.WaitReplicas != 0 {
		t.Errorf("got %+v, want url kept, mode single, key_prefix rl:, wait_replicas 0", r)
	}
}

func TestRedisURLFromEnvironment(t *testing.T) {
	env := map[string]string{
		"RATELIMIT_STORE_BACKEND":     "redis",
		"RATELIMIT_STORE_REDIS_URL":   "redis://10.0.0.7:6380/2",
		"RATELIMIT_STORE_REDIS_ADDRS": "",
	}
	cfg := mustParse(t, minimal, func(k string) string { return env[k] })
	if r := cfg.Store.Redis; r == nil || r.URL != "redis://10.0.0.7:6380/2" || r.Mode != "single" {
		t.Fatalf("got %+v, want the URL from RATELIMIT_STORE_REDIS_URL", r)
	}
	env["RATELIMIT_STORE_REDIS_MODE"] = "cluster"
	env["RATELIMIT_STORE_REDIS_ADDRS"] = "10.0.0.1:6379, 10.0.0.2:6379"
	cfg = mustParse(t, minimal, func(k string) string { return env[k] })
	if r := cfg.Store.Redis; r.Mode != "cluster" || len(r.Addrs) != 2 || r.Addrs[1] != "10.0.0.2:6379" {
		t.Errorf("got %+v, want mode cluster and two addrs", r)
	}
}

func TestValidateRedisNamesFieldAndValue(t *testing.T) {
	cases := []struct {
		store string
		want  []string // field and value in the message
	}{
		{"{backend: redis}", []string{"store.redis.url", "required"}},
		{"{backend: redis, redis: {url: 'http://x:1'}}", []string{"store.redis.url", "http://x:1"}},
		{"{backend: redis, redis: {url: 'redis://:hunter2@x:1'}}", []string{"store.redis.url", "password_env"}},
		{"{backend: redis, redis: {url: 'redis://x:1/99'}}", []string{"store.redis.url", "0 to 15"}},
		{"{backend: redis, redis: {url: 'redis://x:1', mode: ring}}", []string{"store.redis.mode", "ring"}},
		{"{backend: redis, redis: {mode: sentinel}}", []string{"store.redis.sentinel_master", "store.redis.addrs"}},
		{"{backend: redis, redis: {mode: cluster, addrs: ['nohost']}}", []string{"store.redis.addrs[0]", "nohost"}},
		{"{backend: redis, redis: {url: 'redis://x:1', key_prefix: 'a{b}'}}", []string{"store.redis.key_prefix", "a{b}"}},
		{"{backend: redis, redis: {url: 'redis://x:1', password_env: 'p@ss word'}}", []string{"store.redis.password_env", "p@ss word"}},
		{"{backend: redis, redis: {url: 'redis://x:1', wait_replicas: 99}}", []string{"store.redis.wait_replicas", "99"}},
		{"{backend: memory, redis: {url: 'redis://x:1'}}", []string{"store.redis", "store.backend is memory"}},
		{"{backend: rediss}", []string{"store.backend", "rediss"}},
	}
	for _, c := range cases {
		err := mustParse(t, minimal+"store: "+c.store+"\n", noEnv).Validate(noEnv)
		if err == nil {
			t.Errorf("store %s: got no error, want one naming %v", c.store, c.want)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("store %s: got %q, want it to name %q", c.store, err, w)
			}
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("store %s: the error shows the password: %q", c.store, err)
		}
	}
	if err := mustParse(t, minimal+"store: {backend: redis, redis: {mode: sentinel, addrs: ['10.0.0.1:26379'], sentinel_master: rl}}\n", noEnv).Validate(noEnv); err != nil {
		t.Errorf("a valid sentinel block: %v", err)
	}
}
