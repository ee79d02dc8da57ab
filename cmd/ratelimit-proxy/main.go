// Command ratelimit-proxy is a rate-limiting reverse proxy that runs as a sidecar in front of an
// HTTP service and enforces layered policies from a YAML file.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts the drain; stopping the relay then gives a second signal its
	// default action, so Ctrl-C twice ends the process at once instead of after drain_timeout.
	context.AfterFunc(ctx, stop)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv, cli.Options{Version: version})
	stop()
	os.Exit(code)
}
