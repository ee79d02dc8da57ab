// Command goproxy is the literal baseline of issue 33 item 11, as a Go developer writes it from
// the standard library's and x/time/rate's documentation, with nothing tuned: a
// httputil.NewSingleHostReverseProxy on http.DefaultTransport (so 2 idle upstream connections per
// host: under concurrency most forwards dial). With -ratelimit it is "a Go proxy with
// x/time/rate": the same proxy behind a middleware that keeps one rate.Limiter per X-Api-Key in
// a map behind a mutex and answers http.Error 429 when Allow says no.
//
// The limits mirror the gateway's bench configuration for the api_key policy (100,000/s with
// a burst of 100,000, and the -hot key 1 an hour), so that load (c) is never limited and load
// (d) always is. It runs one limiter per request where the gateway runs three policies.
// scripts/bench/plainproxy and scripts/bench/bare429 are the tuned floors beside it.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:18086", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:18000", "upstream base URL")
	limit := flag.Bool("ratelimit", false, "limit per X-Api-Key with x/time/rate, answering 429")
	hot := flag.String("hot", "hot-key", "the X-Api-Key limited to 1 an hour (with -ratelimit)")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	var h http.Handler = httputil.NewSingleHostReverseProxy(u)
	if *limit {
		h = perKey(h, *hot)
	}
	log.Fatal(http.ListenAndServe(*addr, h))
}

// perKey is the middleware of the x/time/rate documentation's shape: a limiter per client key.
func perKey(next http.Handler, hot string) http.Handler {
	var mu sync.Mutex
	limiters := make(map[string]*rate.Limiter)
	limiter := func(key string) *rate.Limiter {
		mu.Lock()
		defer mu.Unlock()
		l, ok := limiters[key]
		if !ok {
			l = rate.NewLimiter(100000, 100000)
			if key == hot {
				l = rate.NewLimiter(rate.Every(time.Hour), 1)
			}
			limiters[key] = l
		}
		return l
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !limiter(r.Header.Get("X-Api-Key")).Allow() {
			http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
			return
		}
		next.ServeHTTP(w, r)
	})
}
