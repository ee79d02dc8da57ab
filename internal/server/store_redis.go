package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/console"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
)

// The Redis store is a console's shared store too (see console.go).
var (
	_ console.Keys   = (*redisstore.Store)(nil)
	_ console.Shared = (*redisstore.Store)(nil)
)

// redisBackend is the Redis (or Valkey) store. It starts whether or not Redis answers: the
// store connects in the background, decisions follow store.on_error until it does, and one line
// says so.
func (g *gateway) redisBackend(ctx context.Context) (backend, error) {
	cfg, log := g.cfg, g.log
	r := cfg.Store.Redis // Validate guarantees it
	o, err := redisDialOptions(r, g.o.Getenv)
	if err != nil {
		return backend{}, err
	}
	o.DialTimeout = min(max(time.Second, 5*cfg.Store.Timeout), StartupTimeout)
	dial, err := redisstore.Dial(o)
	if err != nil {
		return backend{}, err
	}
	rs := redisstore.NewDialed(dial, redisstore.Options{
		KeyPrefix: r.KeyPrefix, Cluster: r.Mode == "cluster", WaitReplicas: r.WaitReplicas,
		Now: g.o.Now, Logger: log.Named("redis"),
	})
	wctx, cancel := context.WithTimeout(ctx, o.DialTimeout+time.Second)
	defer cancel()
	err = rs.Connected(wctx)
	if err == nil {
		err = rs.Ping(wctx)
	}
	if err != nil {
		log.Warn("redis did not answer at startup; decisions follow store.on_error until it does",
			zap.String("redis", redisWhere(r)), zap.String("mode", r.Mode), zap.Error(err))
	} else {
		log.Info("redis store ready", zap.String("redis", redisWhere(r)), zap.String("mode", r.Mode))
	}
	return backend{
		primary: g.o.Hooks.store(rs),
		// A write that no replica confirmed in time stands on the primary: the store works,
		// the decision follows on_error, the breaker stays closed.
		healthy: func(err error) bool { return errors.Is(err, redisstore.ErrNotReplicated) },
		close:   func(context.Context) error { return rs.Close() },
	}, nil
}

// redisDialOptions resolves the store.redis block: the password from its variable.
func redisDialOptions(r *policy.RedisConfig, getenv func(string) string) (redisstore.DialOptions, error) {
	o := redisstore.DialOptions{URL: r.URL, Mode: r.Mode, Addrs: r.Addrs, SentinelMaster: r.SentinelMaster, Username: r.Username}
	if r.PasswordEnv != "" {
		o.Password = getenv(r.PasswordEnv)
		if o.Password == "" {
			return o, fmt.Errorf("store.redis.password_env: %s is empty or not set", r.PasswordEnv)
		}
	}
	return o, nil
}

// redisWhere names the Redis of the block for a log line: hosts only, never credentials.
func redisWhere(r *policy.RedisConfig) string {
	if len(r.Addrs) > 0 {
		return strings.Join(r.Addrs, ",")
	}
	if u, err := url.Parse(r.URL); err == nil {
		return u.Scheme + "://" + u.Host
	}
	return "(unparsable url)"
}
