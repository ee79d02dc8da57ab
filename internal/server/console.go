package server

import (
	"context"
	"net/http"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/console"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// The DynamoDB store is the console's shared store: found by a type assertion below, so a
// signature that drifts must fail the build, not turn the sharing off.
var (
	_ console.Keys   = (*dynamo.Store)(nil)
	_ console.Shared = (*dynamo.Store)(nil)
)

// newConsole builds the operators' console (package console) on the store's primary: the admin
// block's tokens, the log's pseudonyms, and on DynamoDB exemptions shared through the table. One
// console serves both front ends (proxy and rate limit service), in every mode.
func (g *gateway) newConsole() (*console.Console, error) {
	cfg, rl, st, ps, log, reg, now := g.cfg, g.rl, g.st, g.pseudonyms, g.log, g.reg, g.now
	write, read, err := policy.AdminTokens(cfg, g.o.Getenv)
	if err != nil {
		return nil, err // validated already; only an environment changed since then gets here
	}
	o := console.Options{
		Policies:       rl.Set,
		Pseudonyms:     ps,
		WriteToken:     write,
		WriteTokenName: cfg.Admin.TokenEnv,
		ReadToken:      read,
		ReadTokenName:  cfg.Admin.ReadTokenEnv,
		TopK:           cfg.Admin.TopK,
		MaxExemptions:  cfg.Admin.MaxExemptions,
		StoreTimeout:   max(time.Second, cfg.Store.Timeout),
		Logger:         log.Named("admin"),
		Registerer:     reg,
		Now:            now,
	}
	if k, ok := st.Primary().(console.Keys); ok {
		o.Keys = k
	}
	if sh, ok := st.Primary().(console.Shared); ok {
		o.Shared = sh
	}
	return console.New(o)
}

// adminHandler serves the console's API (/v1/) and page (/) beside /metrics and the probes.
func adminHandler(c *console.Console, base http.Handler) http.Handler {
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

// adminGuard answers on the admin listener only requests naming it (console.HostGuard: against
// DNS rebinding, on every path, /metrics and the probes included) and refuses browsers'
// cross-origin writes.
func adminGuard(cfg *policy.Config, h http.Handler) http.Handler {
	return console.NewHostGuard(cfg.AdminListen, cfg.Admin.Hosts).Handler(console.CrossOrigin(h))
}

// runConsole reads shared exemptions until ctx ends (nothing to do without a console).
func runConsole(ctx context.Context, c *console.Console) {
	if c != nil {
		c.Run(ctx)
	}
}
