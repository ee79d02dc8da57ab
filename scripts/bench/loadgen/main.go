// Command loadgen is the fallback load generator of `make bench` for machines without wrk: a
// fixed number of keep-alive connections, each sending requests back to back (closed loop, like
// wrk), with latency percentiles from every request's duration. It prints one line in the same
// format as scripts/bench/wrk.lua's done() hook:
//
//	RESULT requests=N seconds=S rps=R p50_us=P p99_us=Q non2xx=X errors=E
//
// It is less efficient than wrk (a Go HTTP client costs more CPU per request than wrk's C
// parser), so on a small machine it steals more CPU from the servers; bench.sh says which
// generator produced a table.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

func main() {
	target := flag.String("url", "http://127.0.0.1:18080/", "URL to load")
	conc := flag.Int("c", 64, "concurrent connections")
	dur := flag.Duration("d", 10*time.Second, "duration")
	keys := flag.Int("keys", 0, "rotate X-Api-Key over this many keys (0: none)")
	hot := flag.String("hot", "", "send this X-Api-Key on every request")
	flag.Parse()

	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        *conc,
		MaxIdleConnsPerHost: *conc,
		MaxConnsPerHost:     *conc,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()

	type stats struct {
		lat          []time.Duration
		non2xx, errs int
	}
	all := make([]stats, *conc)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := &all[w]
			st.lat = make([]time.Duration, 0, 1<<16)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
			if err != nil {
				log.Fatal(err)
			}
			for i := w * 7919; ctx.Err() == nil; i++ {
				switch {
				case *hot != "":
					req.Header["X-Api-Key"] = []string{*hot}
				case *keys > 0:
					req.Header["X-Api-Key"] = []string{"key-" + strconv.Itoa(i%*keys)}
				}
				t := time.Now()
				res, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						st.errs++
					}
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				st.lat = append(st.lat, time.Since(t))
				if res.StatusCode < 200 || res.StatusCode > 399 {
					st.non2xx++
				}
			}
		}()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	var lat []time.Duration
	non2xx, errs := 0, 0
	for _, st := range all {
		lat = append(lat, st.lat...)
		non2xx += st.non2xx
		errs += st.errs
	}
	if len(lat) == 0 {
		fmt.Fprintln(os.Stderr, "loadgen: no request completed")
		os.Exit(1)
	}
	slices.Sort(lat)
	pct := func(p float64) int64 { return lat[int(p*float64(len(lat)-1))].Microseconds() }
	fmt.Printf("RESULT requests=%d seconds=%.2f rps=%.0f p50_us=%d p99_us=%d non2xx=%d errors=%d\n",
		len(lat), secs, float64(len(lat))/secs, pct(0.50), pct(0.99), non2xx, errs)
}
