// Command ratelimit-proxy is a rate-limiting reverse proxy that runs as a sidecar in front of an
// HTTP service and enforces layered policies from a YAML file.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts the drain; stopping the relay then gives a second signal its
	// default action, so Ctrl-C twice ends the process at once instead of after drain_timeout.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
