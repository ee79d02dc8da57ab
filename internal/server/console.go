package server

import (
	"context"
	"net/http"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/admin"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// newConsole builds the operators' console (package admin) on the store's primary: the admin
// block's tokens, the log's pseudonyms, and on DynamoDB exemptions shared through the table. One
// console serves both front ends (proxy and rate limit service), in every mode.
func (g *gateway) newConsole() (*admin.Console, error) {
	cfg, rl, st, ps, log, reg, now := g.cfg, g.rl, g.st, g.pseudonyms, g.log, g.reg, g.now
	write, read, err := policy.AdminTokens(cfg, g.o.Getenv)
	if err != nil {
		return nil, err // validated already; only an environment changed since then gets here
	}
	o := admin.Options{
		Policies:       rl.Set,
		Pseudonyms:     ps,
		WriteToken:     write,
		WriteTokenName: cfg.Admin.TokenEnv,
		ReadToken:      read,
		ReadTokenName:  cfg.Admin.ReadTokenEnv,
		TopK:           cfg.Admin.TopK,
		StoreTimeout:   max(time.Second, cfg.Store.Timeout),
		Logger:         log.Named("admin"),
		Registerer:     reg,
		Now:            now,
	}
	if k, ok := st.Primary().(admin.Keys); ok {
		o.Keys = k
	}
	if sh, ok := st.Primary().(admin.Shared); ok {
		o.Shared = sh
	}
	return admin.New(o)
}

// adminHandler serves the console's API (/v1/) and page (/) beside /metrics and the probes.
func adminHandler(c *admin.Console, base http.Handler) http.Handler {
	if c == nil {
		return base
	}
	mux := http.NewServeMux()
	ch := c.Handler()
	mux.Handle("/v1/", ch)
	mux.Handle("/{$}", ch)
	mux.Handle("/", base)
	return mux
}

// runConsole reads shared exemptions until ctx ends (nothing to do without a console).
func runConsole(ctx context.Context, c *admin.Console) {
	if c != nil {
		c.Run(ctx)
	}
}
