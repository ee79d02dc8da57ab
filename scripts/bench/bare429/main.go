// Command bare429 is the floor of the 429 path, load (d)'s reference: a bare net/http handler
// that answers 429 from a per-key golang.org/x/time/rate map (X-Api-Key, one mutex), with a
// Retry-After header and a short body, and forwards nothing (it answers 200 to a conforming key).
// What ratelimit-proxy's (d) costs beyond it is ours; what it costs itself is net/http's.
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

func main() {
	addr := flag.String("listen", "127.0.0.1:18085", "address to listen on")
	flag.Parse()
	var mu sync.Mutex
	limiters := make(map[string]*rate.Limiter)
	ctype := []string{"application/problem+json"}
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
		w.Header()["Content-Type"] = ctype
		w.Header()["Retry-After"] = []string{strconv.FormatInt(int64(d/time.Second)+1, 10)}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write(body)
	})
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
