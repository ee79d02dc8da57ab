// Command redis is `make bench-redis`: the Redis store's decisions per second, latency and CPU per
// decision (this process's, as the gateway's share, and redis-server's, read from /proc), on one
// key and over 10,000 keys, on a single node and a 3-node cluster, beside the memory store and,
// when DYNAMODB_ENDPOINT names one, DynamoDB Local; then a paced run at -rate decisions/s whose
// p99 is the target's. It writes .cache/bench/redis.json and prints a table. A benchmark, not a
// test: its numbers are the machine's.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/redislocal"
)

// row is one measured configuration.
type row struct {
	Store       string  `json:"store"`
	Keys        int     `json:"keys"`
	Workers     int     `json:"workers"`
	Decisions   int64   `json:"decisions"`
	Errors      int64   `json:"errors"`
	PerSecond   float64 `json:"decisions_per_second"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	CPUus       float64 `json:"cpu_us_per_decision_gateway"`
	StoreCPUus  float64 `json:"cpu_us_per_decision_store,omitempty"`
	Connections int64   `json:"store_connections,omitempty"`
	Paced       float64 `json:"paced_rate,omitempty"`
}

func main() {
	dur := flag.Duration("d", 5*time.Second, "duration of each row")
	workers := flag.Int("c", 64, "concurrent deciders")
	rate := flag.Float64("rate", 5000, "the paced row's decisions per second")
	out := flag.String("out", ".cache/bench/redis.json", "where the rows go")
	flag.Parse()
	if v := os.Getenv("BENCH_QUICK"); v == "1" {
		*dur = time.Second
	}
	ctx := context.Background()
	state, err := filepath.Abs(".cache/bench/redis-state")
	if err != nil {
		log.Fatal(err)
	}
	single, err := redislocal.Start(ctx, filepath.Join(state, "single"), redislocal.Single)
	defer func() { _ = single.Stop() }()
	if err != nil {
		log.Fatal(err)
	}
	cluster, err := redislocal.Start(ctx, filepath.Join(state, "cluster"), redislocal.Cluster)
	defer func() { _ = cluster.Stop() }()
	if err != nil {
		log.Fatal(err)
	}
	type target struct {
		name  string
		store bucket.Store
		pids  []int
		conns func() int64
	}
	var targets []target
	targets = append(targets, target{name: "memory", store: memstore.New(memstore.Options{})})
	sc := mustClient(redisstore.DialOptions{URL: single.URLs[0], Mode: redisstore.ModeSingle})
	targets = append(targets, target{name: "redis single", store: redisstore.New(sc, redisstore.Options{KeyPrefix: "bench:"}),
		pids: []int{single.PID("node0")}, conns: func() int64 { return clients(sc) }})
	cc := mustClient(redisstore.DialOptions{Mode: redisstore.ModeCluster, Addrs: cluster.Addrs()})
	targets = append(targets, target{name: "redis cluster", store: redisstore.New(cc, redisstore.Options{KeyPrefix: "bench:", Cluster: true}),
		pids: []int{cluster.PID("cluster0"), cluster.PID("cluster1"), cluster.PID("cluster2")}})
	if ep := os.Getenv(dynamolocal.EndpointVar); ep != "" {
		client, err := dynamolocal.NewClient(ctx, ep)
		if err == nil {
			table := "bench-redis-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
			if err = dynamo.CreateTable(ctx, client, table); err == nil {
				targets = append(targets, target{name: "dynamodb local", store: dynamo.New(client, dynamo.Options{Table: table})})
			}
		}
		if err != nil {
			log.Printf("DynamoDB Local left out: %v", err)
		}
	}
	// A limit no load reaches: every decision is a full read-decide-write.
	limit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1e8, Burst: 1e8}
	var rows []row
	for _, tg := range targets {
		for _, keys := range []int{1, 10_000} {
			r := measure(ctx, tg.store, limit, keys, *workers, *dur, 0, tg.pids)
			r.Store = tg.name
			if tg.conns != nil {
				r.Connections = tg.conns()
			}
			rows = append(rows, r)
			log.Printf("%-15s keys %-6d %8.0f decisions/s p50 %6.0f us p99 %6.0f us cpu %5.1f us (+ store %5.1f us)",
				r.Store, keys, r.PerSecond, r.P50us, r.P99us, r.CPUus, r.StoreCPUus)
		}
	}
	paced := measure(ctx, targets[1].store, limit, 10_000, *workers, *dur, *rate, targets[1].pids)
	paced.Store, paced.Paced = "redis single (paced)", *rate
	rows = append(rows, paced)
	log.Printf("paced %.0f/s on redis single: p50 %.0f us, p99 %.0f us", *rate, paced.P50us, paced.P99us)

	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		log.Fatal(err)
	}
	b, _ := json.MarshalIndent(rows, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Println("| store | keys | decisions/s | p50 µs | p99 µs | CPU µs/decision (gateway + store) |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %.1f + %.1f |\n", r.Store, r.Keys, r.PerSecond, r.P50us, r.P99us, r.CPUus, r.StoreCPUus)
	}
	fmt.Println("wrote", *out)
}

func mustClient(o redisstore.DialOptions) rueidis.Client {
	opt, err := redisstore.ClientOption(o)
	if err != nil {
		log.Fatal(err)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		log.Fatal(err)
	}
	return c
}

// clients is the node's connected clients: how few connections the concurrent deciders share.
func clients(c rueidis.Client) int64 {
	info, err := c.Do(context.Background(), c.B().Info().Section("clients").Build()).ToString()
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "connected_clients:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// measure runs workers deciders for d (paced at rate decisions/s in all when rate > 0) over keys
// keys, and returns the row with this process's and the store processes' CPU per decision.
func measure(ctx context.Context, s bucket.Store, l bucket.Limit, keys, workers int, d time.Duration, rate float64, pids []int) row {
	ks := make([]bucket.Key, keys)
	for i := range ks {
		copy(ks[i][:], fmt.Sprintf("bench-%d-%d", keys, i))
	}
	var (
		n, errs atomic.Int64
		mu      sync.Mutex
		lat     []time.Duration
		wg      sync.WaitGroup
	)
	cpu0, store0 := selfCPU(), procCPU(pids)
	start := time.Now()
	end := start.Add(d)
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(workers) / rate)
	}
	for w := range workers {
		wg.Go(func() {
			r := make([]bucket.Result, 1)
			mine := make([]time.Duration, 0, 4096)
			next := time.Now()
			for i := w; time.Now().Before(end); i += workers {
				if interval > 0 {
					next = next.Add(interval)
					if wait := time.Until(next); wait > 0 {
						time.Sleep(wait) // pacing the offered load
					}
				}
				c := []bucket.Charge{{Key: ks[i%keys], Limit: l}}
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				t0 := time.Now()
				_, err := s.Take(dctx, t0, c, r)
				mine = append(mine, time.Since(t0))
				cancel()
				if err != nil {
					errs.Add(1)
					continue
				}
				n.Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start)
	cpu, store := selfCPU()-cpu0, procCPU(pids)-store0
	slices.Sort(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)]) / 1e3
	}
	dn := max(n.Load(), 1)
	r := row{Keys: keys, Workers: workers, Decisions: n.Load(), Errors: errs.Load(), PerSecond: float64(n.Load()) / el.Seconds(),
		P50us: q(0.5), P99us: q(0.99), CPUus: float64(cpu) / 1e3 / float64(dn)}
	if len(pids) > 0 {
		r.StoreCPUus = float64(store) / 1e3 / float64(dn)
	}
	return r
}

// selfCPU is this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is the processes' user and system CPU time from /proc/PID/stat (clock ticks of 10 ms).
func procCPU(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command name (which may hold spaces) start after ") ".
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return total
}
