package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// gwRow is one measured configuration through gateway processes.
type gwRow struct {
	Front    string  `json:"front"`
	Replicas int     `json:"replicas"`
	Keys     int     `json:"keys"`
	Workers  int     `json:"workers"`
	Paced    float64 `json:"paced_rate,omitempty"`
	// Round of the RLS rows beside envoyproxy/ratelimit's (1, 2, ...); the proxy's rows are round 1.
	Round     int     `json:"round"`
	Decisions int64   `json:"decisions"`
	Errors    int64   `json:"errors"`
	Over      int64   `json:"over_limit"`
	PerSecond float64 `json:"decisions_per_second"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
	// P99SchedUs (paced rows): from each call's scheduled send, so that a generator or a gateway
	// that fell behind shows in it (no coordinated omission).
	P99SchedUs float64 `json:"p99_from_schedule_us,omitempty"`
	GatewayCPU float64 `json:"cpu_us_per_decision_gateways"`
	RedisCPU   float64 `json:"cpu_us_per_decision_redis"`
	LoadgenCPU float64 `json:"cpu_us_per_decision_loadgen"`
	// GatewayWait and RedisWait: the time the replicas' and redis-server's threads spent
	// runnable but waiting for a CPU (schedstat), per decision: the share of the latency that
	// is the host's queue for its cores rather than work.
	GatewayWait float64 `json:"run_queue_wait_us_per_decision_gateways"`
	RedisWait   float64 `json:"run_queue_wait_us_per_decision_redis"`
	// StoreWithin1ms (ours): the share of the replicas' store calls that took at most 1 ms, from
	// their ratelimit_store_duration_seconds histogram.
	StoreWithin1ms float64 `json:"store_calls_within_1ms,omitempty"`
	// RedisCommands and RedisReads: redis-server's commands and read events per decision; a read
	// event below 1 per decision is pipelining (several decisions' commands in one read).
	// RedisScripts: EVALSHA and EVAL per decision (1: one script, one round trip, per decision);
	// RedisCommands counts the commands scripts call too.
	RedisScripts  float64 `json:"redis_scripts_per_decision"`
	RedisCommands float64 `json:"redis_commands_per_decision"`
	RedisReads    float64 `json:"redis_reads_per_decision"`
	Load1         float64 `json:"load_average_1m"`
}

// doer sends call i of worker w: ok false for a refused one (429, OVER_LIMIT), err for a failure.
type doer func(ctx context.Context, w, i int) (ok bool, err error)

// httpDoer loads the proxy replicas: one keep-alive connection per worker, worker w on replica
// w mod n, X-Api-Key rotating over keys.
func httpDoer(addrs []string, workers, keys int) doer {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: workers,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		urls[i] = "http://" + a + "/"
	}
	keyv := make([][]string, keys)
	for i := range keyv {
		keyv[i] = []string{"key-" + strconv.Itoa(i)}
	}
	return func(ctx context.Context, w, i int) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, urls[w%len(urls)], nil)
		if err != nil {
			return false, err
		}
		req.Header["X-Api-Key"] = keyv[i%keys]
		res, err := client.Do(req)
		if err != nil {
			return false, err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		switch {
		case res.StatusCode == http.StatusOK:
			return true, nil
		case res.StatusCode == http.StatusTooManyRequests:
			return false, nil
		}
		return false, fmt.Errorf("status %d", res.StatusCode)
	}
}

// grpcClients dials one connection per replica (Envoy keeps one per worker thread).
func grpcClients(addrs []string) ([]pb.RateLimitServiceClient, func(), error) {
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	out := make([]pb.RateLimitServiceClient, len(addrs))
	for i, a := range addrs {
		c, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, c)
		out[i] = pb.NewRateLimitServiceClient(c)
	}
	return out, closeAll, nil
}

// rlsDoer loads RLS replicas (ours or theirs) with one descriptor per call (one decision).
func rlsDoer(clients []pb.RateLimitServiceClient, keys int) doer {
	reqs := make([]*pb.RateLimitRequest, keys)
	for i := range reqs {
		reqs[i] = &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlext.RateLimitDescriptor{
			{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: "key", Value: "key-" + strconv.Itoa(i)}}},
		}}
	}
	return func(ctx context.Context, w, i int) (bool, error) {
		res, err := clients[w%len(clients)].ShouldRateLimit(ctx, reqs[i%keys])
		if err != nil {
			return false, err
		}
		return res.GetOverallCode() == pb.RateLimitResponse_OK, nil
	}
}

// loadResult is what one load run measured.
type loadResult struct {
	n, errs, over int64
	elapsed       time.Duration
	lat, sched    []time.Duration // sorted
	firstErr      error
}

// runLoad runs workers callers for d: back to back (rate 0) or each on its own schedule so that
// together they offer rate calls per second.
func runLoad(ctx context.Context, do doer, workers int, d time.Duration, rate float64) loadResult {
	var (
		r        loadResult
		n, errs  atomic.Int64
		over     atomic.Int64
		mu       sync.Mutex
		wg       sync.WaitGroup
		firstErr atomic.Pointer[error]
	)
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(workers) / rate)
	}
	start := time.Now()
	end := start.Add(d)
	for w := range workers {
		wg.Go(func() {
			mine := make([]time.Duration, 0, 4096)
			var mineSched []time.Duration
			// Staggered starts: the paced workers' sends spread over the interval.
			next := start.Add(time.Duration(int64(interval) * int64(w) / int64(workers)))
			for i := w * 7919; ; i++ {
				if interval > 0 {
					if wait := time.Until(next); wait > 0 {
						time.Sleep(wait) // pacing the offered load
					}
				}
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				ok, err := do(cctx, w, i)
				el := time.Since(t0)
				cancel()
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				} else {
					n.Add(1)
					if !ok {
						over.Add(1)
					}
					mine = append(mine, el)
					if interval > 0 {
						mineSched = append(mineSched, time.Since(next))
					}
				}
				next = next.Add(interval)
			}
			mu.Lock()
			r.lat = append(r.lat, mine...)
			r.sched = append(r.sched, mineSched...)
			mu.Unlock()
		})
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	r.n, r.errs, r.over = n.Load(), errs.Load(), over.Load()
	if e := firstErr.Load(); e != nil {
		r.firstErr = *e
	}
	slices.Sort(r.lat)
	slices.Sort(r.sched)
	return r
}

func quantileUs(lat []time.Duration, p float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)]) / 1e3
}

// loadAverage is the 1-minute load average (/proc/loadavg).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscan(string(b), &l)
	return l
}
