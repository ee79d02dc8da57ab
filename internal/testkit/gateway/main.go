// Command gateway is ratelimit-proxy with its test seams: the shipped command line, plus what
// multi-process tests and make check-exact need, read from the environment and passed through
// cli.Options.Server and server.Hooks:
//
//   - RATELIMIT_TEST_CLOCK_OFFSET (a duration such as -2s or 1m): the gateway's clock shifted by
//     it, to run replicas whose clocks disagree on one host. The shift reaches every instant the
//     gateway decides with, and what the clock-offset estimator measures against DynamoDB's Date.
//   - RATELIMIT_EXACT_MUTANT: the self-test's mutant to become (internal/testkit/exactmutant).
//
// It is test tooling: the shipped binary is cmd/ratelimit-proxy, which links none of this.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/cli"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/server"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

// ClockOffsetEnv is the variable holding the clock's shift.
const ClockOffsetEnv = "RATELIMIT_TEST_CLOCK_OFFSET"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := run(ctx)
	stop()
	os.Exit(code)
}

func run(ctx context.Context) int {
	seams, err := seamsFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		return 2
	}
	return cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv, cli.Options{Version: "test", Server: seams})
}

// seamsFromEnv returns the adjustment of server.Options that the environment asks for.
func seamsFromEnv(getenv func(string) string) (func(*server.Options), error) {
	var offset time.Duration
	if v := getenv(ClockOffsetEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: want a duration such as -2s or 1m", ClockOffsetEnv, v)
		}
		offset = d
	}
	mutant := getenv(exactmutant.Env)
	return func(o *server.Options) {
		if offset != 0 {
			o.Now = func() time.Time { return time.Now().Add(offset) }
		}
		if mutant != "" {
			o.Hooks.DynamoDB = func(api dynamo.API) dynamo.API { return exactmutant.Client(api, mutant) }
			o.Hooks.Store = func(s bucket.Store) bucket.Store { return exactmutant.Store(s, mutant) }
		}
	}, nil
}
