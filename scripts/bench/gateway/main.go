// Command gateway is the ratelimit-proxy gateway (server.Run, the same wiring as `ratelimit-proxy
// serve`) plus, only when BENCH_PPROF names an address, a net/http/pprof listener there. It exists
// for `make profile-c` / `make profile-d`: the product's admin port has no pprof, and profiling
// the real wiring under real load shows what a user's deployment spends, which a benchmark of the
// handler alone would not.
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/server"
)

func main() {
	cfg := flag.String("config", "", "gateway YAML file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if addr := os.Getenv("BENCH_PPROF"); addr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Printf("pprof listener: %v", err)
			}
		}()
	}
	if err := server.Run(ctx, server.Options{ConfigPath: *cfg}); err != nil {
		log.Fatal(err)
	}
}
