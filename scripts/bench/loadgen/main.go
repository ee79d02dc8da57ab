// Command loadgen is the fallback load generator of `make bench` for machines without wrk, and
// the generator of its HTTP/2 and gRPC rows (wrk speaks neither): a fixed number of workers,
// each sending requests back to back (closed loop, like wrk), with latency percentiles from
// every request's duration. It prints one line in the same format as scripts/bench/wrk.lua's
// done() hook:
//
//	RESULT requests=N seconds=S rps=R p50_us=P p99_us=Q non2xx=X errors=E
//
// -proto chooses what the workers speak:
//   - http1 (default): one keep-alive HTTP/1.1 connection per worker;
//   - h2c: HTTP/2 with prior knowledge, the workers spread over -h2conns connections (streams
//     multiplexed on each, as HTTP/2 clients do);
//   - grpc: unary grpc.health.v1.Health/Check calls with grpc-go over -h2conns connections; a
//     call that fails with a status counts as non2xx (RESOURCE_EXHAUSTED for the rejected rows).
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
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// firstFailure prints the first failed call's status: non2xx counts them, this says why.
var firstFailure sync.Once

func main() {
	target := flag.String("url", "http://127.0.0.1:18080/", "URL to load (grpc: its host:port is dialled)")
	conc := flag.Int("c", 64, "concurrent workers (http1: connections)")
	dur := flag.Duration("d", 10*time.Second, "duration")
	keys := flag.Int("keys", 0, "rotate X-Api-Key over this many keys (0: none)")
	hot := flag.String("hot", "", "send this X-Api-Key on every request")
	proto := flag.String("proto", "http1", "http1, h2c or grpc")
	h2conns := flag.Int("h2conns", 4, "h2c and grpc: connections the workers share")
	flag.Parse()

	key := func(i int) string {
		switch {
		case *hot != "":
			return *hot
		case *keys > 0:
			return "key-" + strconv.Itoa(i%*keys)
		}
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()

	// do sends request i of worker w: latency recorded by the caller; ok false for a non-2xx
	// answer (or a gRPC status), err for a failure to get any.
	var do func(w, i int) (ok bool, err error)
	switch *proto {
	case "http1", "h2c":
		clients := httpClients(*proto, *conc, *h2conns)
		reqs := make([]*http.Request, *conc)
		for w := range reqs {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, *target, nil)
			if err != nil {
				log.Fatal(err)
			}
			reqs[w] = req
		}
		do = func(w, i int) (bool, error) {
			req := reqs[w]
			if k := key(i); k != "" {
				req.Header["X-Api-Key"] = []string{k}
			}
			res, err := clients[w%len(clients)].Do(req)
			if err != nil {
				return false, err
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			return res.StatusCode >= 200 && res.StatusCode <= 399, nil
		}
	case "grpc":
		u, err := url.Parse(*target)
		if err != nil {
			log.Fatal(err)
		}
		conns := make([]healthpb.HealthClient, *h2conns)
		for i := range conns {
			cc, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				log.Fatal(err)
			}
			defer cc.Close()
			conns[i] = healthpb.NewHealthClient(cc)
		}
		do = func(w, i int) (bool, error) {
			cctx := ctx
			if k := key(i); k != "" {
				cctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", k)
			}
			_, err := conns[w%len(conns)].Check(cctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				return true, nil
			}
			if st, isStatus := status.FromError(err); isStatus && ctx.Err() == nil {
				firstFailure.Do(func() { fmt.Fprintf(os.Stderr, "loadgen: first failed call: %v\n", st) })
				return false, nil
			}
			return false, err
		}
	default:
		log.Fatalf("-proto %q: want http1, h2c or grpc", *proto)
	}

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
			for i := w * 7919; ctx.Err() == nil; i++ {
				t := time.Now()
				ok, err := do(w, i)
				if err != nil {
					if ctx.Err() == nil {
						st.errs++
					}
					continue
				}
				st.lat = append(st.lat, time.Since(t))
				if !ok {
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

// httpClients returns the clients the workers use: one shared HTTP/1.1 client with a connection
// per worker, or h2conns HTTP/2 clients with one connection each.
func httpClients(proto string, conc, h2conns int) []*http.Client {
	dial := (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	if proto == "http1" {
		return []*http.Client{{Transport: &http.Transport{
			DialContext:         dial,
			MaxIdleConns:        conc,
			MaxIdleConnsPerHost: conc,
			MaxConnsPerHost:     conc,
			DisableCompression:  true,
		}}}
	}
	out := make([]*http.Client, h2conns)
	for i := range out {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		out[i] = &http.Client{Transport: &http.Transport{
			DialContext:        dial,
			Protocols:          p,
			DisableCompression: true,
			// One connection per client: its streams are multiplexed on it. More streams than the
			// server allows wait rather than open a second connection.
			HTTP2: &http.HTTP2Config{StrictMaxConcurrentRequests: true},
		}}
	}
	return out
}
