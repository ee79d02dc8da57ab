// Command bare429 is the floor of the 429 path, load (d)'s reference: a bare net/http handler
// that answers 429 from a per-key golang.org/x/time/rate map (X-Api-Key, one mutex), with a
// Retry-After header and a short body, and forwards nothing (it answers 200 to a conforming key).
// What ratelimit-proxy's (d) costs beyond it is ours; what it costs itself is net/http's.
//
// With -gateway-response it sends what the gateway sends instead: the same seven headers and a
// problem+json body of the same length, so that the difference between the two runs is the
// price of the gateway's response contract, and what remains beyond this one is the gateway's
// own work (policy plan, store, metrics, logging, server settings).
package main

import (
	"flag"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

var body = []byte(`{"title":"Too Many Requests","status":429}` + "\n")

// gatewayBody has the length of ratelimit-proxy's 429 body for the bench's hot key.
var gatewayBody = []byte(`{"type":"https://ratelimit-proxy.dev/problems/rate-limited","title":"Too Many Requests","status":429,"detail":"Rate limit of policy \"per-api-key\" exceeded; retry after 3600 seconds.","policy":"per-api-key","retry_after_seconds":3600}` + "\n")

func main() {
	addr := flag.String("listen", "127.0.0.1:18085", "address to listen on")
	full := flag.Bool("gateway-response", false, "send the gateway's 429 headers and a body of its length")
	flag.Parse()
	var mu sync.Mutex
	limiters := make(map[string]*rate.Limiter)
	ctype := []string{"application/problem+json"}
	noStore, nosniff, one, zero := []string{"no-store"}, []string{"nosniff"}, []string{"1"}, []string{"0"}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		mu.Lock()
		l := limiters[key]
		if l == nil {
			l = rate.NewLimiter(rate.Every(time.Hour), 1)
			limiters[key] = l
		}
		res := l.Reserve()
		mu.Unlock()
		d := res.Delay()
		if d == 0 {
			w.WriteHeader(http.StatusOK)
			return
		}
		res.Cancel()
		h := w.Header()
		h["Content-Type"] = ctype
		h["Retry-After"] = []string{strconv.FormatInt(int64(d/time.Second)+1, 10)}
		if !*full {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write(body)
			return
		}
		h["Cache-Control"] = noStore
		h["X-Content-Type-Options"] = nosniff
		h["X-Ratelimit-Limit"] = one
		h["X-Ratelimit-Remaining"] = zero
		h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(time.Now().Add(d).Unix(), 10)}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(gatewayBody)
	})
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
