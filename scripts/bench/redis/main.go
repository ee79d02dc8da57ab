// Command redis is `make bench-redis`: the Redis store measured two ways, in one run.
//
//  1. Through gateways (the benchmark): -replicas real processes of the built binary
//     (bin/ratelimit-proxy serve) on one redis-server, a Go load generator in front, for the proxy
//     (HTTP, one fixed-window policy keyed by X-Api-Key, an upstream in this process) and for the
//     RLS (gRPC ShouldRateLimit, one descriptor per call, envoyproxy/ratelimit's rule format):
//     on one key and over 10,000 keys back to back, then over 10,000 keys paced at -rate
//     decisions/s. Each row gives decisions/s, p50/p99, CPU per decision of the replicas (summed)
//     and of redis-server (/proc), and redis-server's commands and read events per decision
//     (INFO stats: fewer reads than decisions is pipelining). When ERL_BIN names a build of
//     envoyproxy/ratelimit's service, its replicas run the same rows on the same Redis with the
//     same rule file, and a deterministic call sequence checks that both give the same answers
//     on fixed windows.
//  2. The store alone, in this process: decisions/s, latency and CPU per decision on one key and
//     over 10,000 keys, on a single node and a 3-node cluster, beside the memory store and, when
//     DYNAMODB_ENDPOINT names one, DynamoDB Local; with the client's writes counted (a counting
//     net.Conn), so decisions per write shows the round trips shared.
//
// It writes .cache/bench/redis.json and prints tables. A benchmark, not a test: its numbers are
// the machine's, and the machine's load average is written beside them.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
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
	// PerClientWrite and PerRedisRead (redis single): decisions per write the client made on its
	// connections and per read event of redis-server; above 1 is round trips shared.
	PerClientWrite float64 `json:"decisions_per_client_write,omitempty"`
	PerRedisRead   float64 `json:"decisions_per_redis_read,omitempty"`
	Load1          float64 `json:"load_average_1m"`
}

// report is redis.json.
type report struct {
	When         string      `json:"when"`
	CPUs         int         `json:"cpus"`
	LoadBefore   float64     `json:"load_average_1m_before"`
	LoadAfter    float64     `json:"load_average_1m_after"`
	Gateways     []gwRow     `json:"gateways"`
	Ratios       *erlRatios  `json:"erl_ratios,omitempty"`
	SameAnswers  *sameChecks `json:"erl_same_answers,omitempty"`
	Store        []row       `json:"store"`
	GatewayError string      `json:"gateways_error,omitempty"`
}

func main() {
	dur := flag.Duration("d", 5*time.Second, "duration of each row")
	warmup := flag.Duration("warmup", time.Second, "unmeasured load before each row through gateways")
	workers := flag.Int("c", 64, "concurrent deciders")
	rate := flag.Float64("rate", 5000, "the paced rows' decisions per second")
	replicas := flag.Int("replicas", 8, "gateway processes on the one Redis")
	erlConfig := flag.String("erl-config", os.Getenv("ERL_CONFIG_DIR"), "with ERL_BIN: envoyproxy/ratelimit's test/integration/runtime/current/ratelimit/config, served unchanged by both for a same-answers check (ERL_CONFIG_DIR)")
	rounds := flag.Int("rounds", 3, "rounds of our RLS beside envoyproxy/ratelimit's, load by load (with ERL_BIN; without it the RLS rows run once)")
	bin := flag.String("bin", "bin/ratelimit-proxy", "the gateway binary (make build)")
	erlBin := flag.String("erl-bin", os.Getenv("ERL_BIN"), "envoyproxy/ratelimit's service binary, to run beside ours (ERL_BIN)")
	storeRows := flag.Bool("store", true, "also measure the store alone, in this process")
	out := flag.String("out", ".cache/bench/redis.json", "where the rows go")
	flag.Parse()
	if v := os.Getenv("BENCH_QUICK"); v == "1" {
		*dur = time.Second
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep := report{When: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), LoadBefore: loadAverage()}
	state, err := filepath.Abs(".cache/bench/redis-state")
	if err != nil {
		log.Fatal(err)
	}
	single, err := redislocal.Start(ctx, filepath.Join(state, "single"), redislocal.Single)
	defer func() { _ = single.Stop() }()
	if err != nil {
		log.Fatal(err)
	}
	info := mustClient(redisstore.DialOptions{URL: single.URLs[0], Mode: redisstore.ModeSingle}, nil)
	rg := &rig{redisURL: single.URLs[0], redisAddr: single.Addrs()[0], redisPID: single.PID("node0"), info: info,
		dir: filepath.Join(state, "gateways")}
	if err := os.MkdirAll(rg.dir, 0o755); err != nil {
		log.Fatal(err)
	}
	rep.Gateways, rep.SameAnswers, err = runGateways(ctx, rg, gwOptions{replicas: *replicas, workers: *workers,
		dur: *dur, warmup: *warmup, rate: *rate, bin: *bin, erlBin: *erlBin, rounds: *rounds, erlConfig: *erlConfig})
	if err != nil {
		log.Printf("through gateways: %v", err)
		rep.GatewayError = err.Error()
	}
	rep.Ratios = ratios(rep.Gateways)
	if *storeRows && ctx.Err() == nil {
		rep.Store = storeLevel(ctx, single, *workers, *dur, *rate)
	}
	rep.LoadAfter = loadAverage()

	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		log.Fatal(err)
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		log.Fatal(err)
	}
	printReport(rep)
	fmt.Println("wrote", *out)
	if rep.GatewayError != "" {
		os.Exit(1)
	}
}

// storeLevel is part 2: the store alone, in this process.
func storeLevel(ctx context.Context, single *redislocal.Instance, workers int, dur time.Duration, rate float64) []row {
	state, _ := filepath.Abs(".cache/bench/redis-state")
	cluster, err := redislocal.Start(ctx, filepath.Join(state, "cluster"), redislocal.Cluster)
	defer func() { _ = cluster.Stop() }()
	if err != nil {
		log.Printf("cluster left out: %v", err)
	}
	type target struct {
		name   string
		store  bucket.Store
		pids   []int
		conns  func() int64
		writes *atomic.Int64
		info   rueidis.Client
	}
	var targets []target
	targets = append(targets, target{name: "memory", store: memstore.New(memstore.Options{})})
	var writes atomic.Int64
	sc := mustClient(redisstore.DialOptions{URL: single.URLs[0], Mode: redisstore.ModeSingle}, &writes)
	targets = append(targets, target{name: "redis single", store: redisstore.New(sc, redisstore.Options{KeyPrefix: "bench:"}),
		pids: []int{single.PID("node0")}, conns: func() int64 { return clients(sc) }, writes: &writes, info: sc})
	if err == nil {
		cc := mustClient(redisstore.DialOptions{Mode: redisstore.ModeCluster, Addrs: cluster.Addrs()}, nil)
		targets = append(targets, target{name: "redis cluster", store: redisstore.New(cc, redisstore.Options{KeyPrefix: "bench:", Cluster: true}),
			pids: []int{cluster.PID("cluster0"), cluster.PID("cluster1"), cluster.PID("cluster2")}})
	}
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
	run := func(tg target, keys int, rate float64) row {
		var w0 int64
		var st0 redisStats
		if tg.writes != nil {
			w0 = tg.writes.Load()
			st0, _ = readStats(ctx, tg.info)
		}
		r := measure(ctx, tg.store, limit, keys, workers, dur, rate, tg.pids)
		r.Store, r.Paced, r.Load1 = tg.name, rate, loadAverage()
		if tg.writes != nil {
			st1, _ := readStats(ctx, tg.info)
			dn := float64(max(r.Decisions, 1))
			r.PerClientWrite = dn / float64(max(tg.writes.Load()-w0, 1))
			r.PerRedisRead = dn / max(st1.sub(st0).reads, 1)
		}
		if tg.conns != nil {
			r.Connections = tg.conns()
		}
		log.Printf("%-15s keys %-6d %s %8.0f decisions/s p50 %6.0f us p99 %6.0f us cpu %5.1f us (+ store %5.1f us)",
			r.Store, keys, pacedLabel(rate), r.PerSecond, r.P50us, r.P99us, r.CPUus, r.StoreCPUus)
		return r
	}
	for _, tg := range targets {
		for _, keys := range []int{1, 10_000} {
			rows = append(rows, run(tg, keys, 0))
		}
	}
	paced := run(targets[1], 10_000, rate)
	paced.Store = "redis single (paced)"
	return append(rows, paced)
}

// mustClient dials the store's client; with writes, its connections count their writes there.
func mustClient(o redisstore.DialOptions, writes *atomic.Int64) rueidis.Client {
	opt, err := redisstore.ClientOption(o)
	if err != nil {
		log.Fatal(err)
	}
	if writes != nil {
		countWrites(&opt, writes)
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

// runWait is the time the processes' threads spent runnable and waiting for a CPU: the second
// field of /proc/PID/task/TID/schedstat, summed over the threads alive now (a thread that ended
// takes its wait with it; Go's and redis-server's threads live as long as the process). On a
// shared host it is what separates a latency that is the gateway's from one that is the queue for
// the cores.
func runWait(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
			if err != nil {
				continue
			}
			if f := strings.Fields(string(b)); len(f) >= 2 {
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				total += time.Duration(ns)
			}
		}
	}
	return total
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
