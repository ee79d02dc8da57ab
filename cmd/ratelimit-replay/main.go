// Command ratelimit-replay replays access logs through a ratelimit-proxy configuration offline:
// what would these policies have done to this traffic? It is a binary of its own so that the
// gateway, which runs beside every service, links no plotting, PDF or font code.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
