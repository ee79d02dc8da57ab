package policy

import (
	"net"
	"net/url"
	"strconv"
	"strings"
)

// The modes of store.redis.mode.
const (
	redisSingle   = "single"
	redisSentinel = "sentinel"
	redisCluster  = "cluster"
)

// maxWaitReplicas bounds store.redis.wait_replicas: more replicas than any deployment runs.
const maxWaitReplicas = 16

// checkRedis checks store.redis against store.backend.
func checkRedis(es *Errors, st *StoreConfig) {
	r := st.Redis
	if st.Backend != "redis" {
		if r != nil {
			// A forgotten `backend: redis` would enforce every limit per replica, silently.
			es.add("store.redis", "", "set, but store.backend is "+st.Backend+": set store.backend: redis, or remove the block")
		}
		return
	}
	if r == nil {
		es.add("store.redis.url", "", "required when store.backend is redis")
		return
	}
	switch r.Mode {
	case redisSingle, redisSentinel, redisCluster:
	default:
		es.add("store.redis.mode", r.Mode, "must be single, sentinel or cluster")
	}
	switch {
	case r.URL == "" && r.Mode == redisSingle:
		es.add("store.redis.url", "", "required with store.redis.mode single, such as redis://127.0.0.1:6379/0")
	case r.URL != "":
		checkRedisURL(es, r.URL)
	}
	if r.Mode == redisCluster && r.URL == "" && len(r.Addrs) == 0 {
		es.add("store.redis.addrs", "", "required with store.redis.mode cluster (seed nodes, host:port), unless store.redis.url names one")
	}
	if r.Mode == redisSentinel {
		if len(r.Addrs) == 0 {
			es.add("store.redis.addrs", "", "required with store.redis.mode sentinel: the Sentinels, host:port each")
		}
		if r.SentinelMaster == "" {
			es.add("store.redis.sentinel_master", "", "required with store.redis.mode sentinel: the master name the Sentinels monitor")
		}
	}
	if r.Mode == redisSingle && len(r.Addrs) > 0 {
		es.add("store.redis.addrs", strings.Join(r.Addrs, ","), "only with store.redis.mode sentinel or cluster (single uses store.redis.url)")
	}
	for i, a := range r.Addrs {
		host, port, err := net.SplitHostPort(a)
		if p, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || p < 1 || p > 65535 {
			es.add("store.redis.addrs["+strconv.Itoa(i)+"]", a, "must be host:port, such as 10.0.0.7:6379")
		}
	}
	if e := r.PasswordEnv; e != "" && !validEnvName(e) {
		es.add("store.redis.password_env", e, "must be an environment variable's name (A-Z, a-z, 0-9, _), not the password")
	}
	if p := r.KeyPrefix; p == "" || len(p) > 64 || strings.ContainsAny(p, "{} \t\r\n") {
		// A brace would move the hash tag off the bucket key: every key in one cluster slot.
		es.add("store.redis.key_prefix", p, "must be 1 to 64 characters without braces or spaces")
	}
	if w := r.WaitReplicas; w < 0 || w > maxWaitReplicas {
		es.add("store.redis.wait_replicas", strconv.Itoa(w), "must be from 0 to "+strconv.Itoa(maxWaitReplicas))
	}
}

// checkRedisURL checks store.redis.url, naming it without its password.
func checkRedisURL(es *Errors, raw string) {
	u, err := url.Parse(raw)
	switch {
	case err != nil, u.Opaque != "", u.Host == "":
		es.add("store.redis.url", redactURL(raw), "must be redis://host:port[/db] or rediss://host:port[/db]")
		return
	case u.Scheme != "redis" && u.Scheme != "rediss" && u.Scheme != "valkey" && u.Scheme != "valkeys":
		es.add("store.redis.url", redactURL(raw), "must start with redis:// or rediss:// (TLS)")
		return
	}
	if _, ok := u.User.Password(); ok {
		es.add("store.redis.url", redactURL(raw), "must not carry the password: name its variable in store.redis.password_env")
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		if n, err := strconv.Atoi(db); err != nil || n < 0 || n > 15 {
			es.add("store.redis.url", redactURL(raw), "the database (path) must be a number from 0 to 15")
		}
	}
}

// validEnvName reports whether s can name an environment variable.
func validEnvName(s string) bool {
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return s != ""
}
