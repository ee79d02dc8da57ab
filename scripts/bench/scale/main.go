// Command scale is `make bench-scale`: many gateway replicas, each a separate
// `bin/ratelimit-proxy serve` process, share one pool on one DynamoDB Local table behind a
// throttling relay (internal/testkit/ddbrelay) that enforces a per-item write cap, as real DynamoDB's
// per-partition limit does. An open-loop generator offers about twice the pool's rate at a fixed
// rate, spread over the replicas on many keep-alive connections, for a steady phase, then moves
// the load from half the replicas to the other half for a shift phase. It writes
// .cache/bench/scale.json (the exact field set) and .cache/bench/scale-phases.json, and
// prints both.
//
// Every knob is a flag with an environment default (BENCH_SCALE_*): see -h. BENCH_SCALE_LEASE=0
// runs the policy without a shared pool lease (one conditional write per decision): the
// baseline. Every process it starts is stopped at the end, on errors and on Ctrl-C; the whole
// run is bounded by -timeout; everything listens on loopback.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// options are the run's knobs.
type options struct {
	replicas     int
	rate, burst  float64
	itemCap      int
	shards       int
	lease        bool
	load         float64 // offered rate as a multiple of the pool's rate
	warmup       time.Duration
	pause        time.Duration
	steady       time.Duration
	shift        time.Duration
	conns        int // keep-alive connections per replica
	storeTimeout time.Duration
	// storeDelay and storeJitter slow every call of the store: the relay waits storeDelay + U[0,
	// storeJitter] before it forwards it.
	storeDelay, storeJitter time.Duration
	bin                     string
	out                     string
	timeout                 time.Duration
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	var lease string
	fs.IntVar(&o.replicas, "replicas", harness.Atoi(envOr("BENCH_SCALE_REPLICAS", "8")), "gateway processes (BENCH_SCALE_REPLICAS)")
	fs.Float64Var(&o.rate, "rate", harness.Atof(envOr("BENCH_SCALE_RATE", "2000")), "the pool's rate per second (BENCH_SCALE_RATE)")
	fs.Float64Var(&o.burst, "burst", harness.Atof(envOr("BENCH_SCALE_BURST", "1000")), "the pool's burst (BENCH_SCALE_BURST)")
	fs.IntVar(&o.itemCap, "item-cap", harness.Atoi(envOr("BENCH_SCALE_ITEM_CAP", "200")), "writes per item per second the relay lets through (BENCH_SCALE_ITEM_CAP)")
	fs.IntVar(&o.shards, "shards", harness.Atoi(envOr("BENCH_SCALE_SHARDS", "4")), "items the pool is split over, with leases (BENCH_SCALE_SHARDS)")
	fs.StringVar(&lease, "lease", envOr("BENCH_SCALE_LEASE", "1"), "1: lease mode on a named pool; 0: the baseline without (BENCH_SCALE_LEASE)")
	fs.Float64Var(&o.load, "load", harness.Atof(envOr("BENCH_SCALE_LOAD", "2")), "offered rate as a multiple of the pool's rate (BENCH_SCALE_LOAD)")
	fs.DurationVar(&o.warmup, "warmup", harness.Dur(envOr("BENCH_SCALE_WARMUP", "3s")), "load before the measurement, not counted: warms the replicas' connections and DynamoDB Local's paths (BENCH_SCALE_WARMUP)")
	fs.DurationVar(&o.pause, "pause", harness.Dur(envOr("BENCH_SCALE_PAUSE", "2s")), "no load between the warm-up and the measurement, so that the pool is full again and every lease has gone back (BENCH_SCALE_PAUSE)")
	fs.DurationVar(&o.steady, "steady", harness.Dur(envOr("BENCH_SCALE_STEADY", "20s")), "steady phase (BENCH_SCALE_STEADY)")
	fs.DurationVar(&o.shift, "shift", harness.Dur(envOr("BENCH_SCALE_SHIFT", "10s")), "load-shift phase (BENCH_SCALE_SHIFT)")
	fs.IntVar(&o.conns, "conns", harness.Atoi(envOr("BENCH_SCALE_CONNS", "128")), "keep-alive connections per replica (BENCH_SCALE_CONNS)")
	fs.DurationVar(&o.storeTimeout, "store-timeout", harness.Dur(envOr("BENCH_SCALE_STORE_TIMEOUT", "200ms")), "the replicas' store.timeout (BENCH_SCALE_STORE_TIMEOUT)")
	fs.DurationVar(&o.storeDelay, "store-delay", harness.Dur(envOr("BENCH_SCALE_STORE_DELAY", "0s")), "the relay delays every call to the store by this much, plus -store-jitter (BENCH_SCALE_STORE_DELAY)")
	fs.DurationVar(&o.storeJitter, "store-jitter", harness.Dur(envOr("BENCH_SCALE_STORE_JITTER", "0s")), "and by a uniform random part in [0, this] (BENCH_SCALE_STORE_JITTER)")
	fs.StringVar(&o.bin, "bin", "bin/ratelimit-proxy", "the gateway binary")
	fs.StringVar(&o.out, "out", ".cache/bench", "where scale.json, scale-phases.json and the replicas' logs go")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch lease {
	case "1", "true":
		o.lease = true
	case "0", "false":
	default:
		return o, fmt.Errorf("-lease / BENCH_SCALE_LEASE %q: want 0 or 1", lease)
	}
	switch {
	case o.replicas < 2:
		return o, fmt.Errorf("-replicas %d: want at least 2 (the shift moves load between halves)", o.replicas)
	case o.rate <= 0 || o.burst < 0 || o.load <= 0:
		return o, fmt.Errorf("-rate %v, -burst %v, -load %v: want positive numbers", o.rate, o.burst, o.load)
	case o.itemCap < 1 || o.shards < 1 || o.conns < 1:
		return o, fmt.Errorf("-item-cap %d, -shards %d, -conns %d: want at least 1", o.itemCap, o.shards, o.conns)
	case o.storeDelay < 0 || o.storeJitter < 0:
		return o, fmt.Errorf("-store-delay %v, -store-jitter %v: want no negative duration", o.storeDelay, o.storeJitter)
	case o.steady <= 0 || o.shift < 0 || o.warmup < 0 || o.pause < 0:
		return o, fmt.Errorf("-steady %v, -shift %v, -warmup %v, -pause %v: want a positive steady phase and no negative one", o.steady, o.shift, o.warmup, o.pause)
	}
	return o, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("gateway binary: %w (make bench-scale builds it)", err)
	}

	// Cleanups run in reverse order on every return, including Ctrl-C (ctx ends, the waits
	// return, run returns).
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()

	// Its own instance in its own state directory (Start stops one a killed run left there).
	var ddb *dynamolocal.Instance
	if ep := os.Getenv("BENCH_SCALE_DYNAMODB_ENDPOINT"); ep != "" {
		// A DynamoDB Local already running (a machine too busy to start Java within the
		// script's 30 s): used as is, not stopped, its CPU not counted.
		ddb = &dynamolocal.Instance{Endpoint: ep}
	} else {
		ddb, err = dynamolocal.Start(ctx, filepath.Join(o.out, "scale-dynamodb-local"))
	}
	for try := 2; err != nil && ctx.Err() == nil && try <= 5; try++ {
		// The script gives Java 30 s to answer, which a machine busy with other work can miss.
		fmt.Fprintf(stdout, "%v; try %d of 5\n", err, try)
		ddb, err = dynamolocal.Start(ctx, filepath.Join(o.out, "scale-dynamodb-local"))
	}
	if ddb != nil {
		cleanups = append(cleanups, func() {
			if err := ddb.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		})
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "DynamoDB Local at %s\n", ddb.Endpoint)

	table := "bench-scale-" + randomHex(4)
	client, err := dynamolocal.NewClient(ctx, ddb.Endpoint)
	if err != nil {
		return err
	}
	if err := createTable(ctx, client, table); err != nil {
		return err
	}
	// Warm DynamoDB Local with writes straight to it, outside the relay and the measurement:
	// rounds of one second until the median is under 10 ms, at most 15 rounds.
	p50, rounds, err := dynamolocal.WarmUp(ctx, client, table, "bench-scale-warm-up", 15)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "DynamoDB Local warmed up: UpdateItem p50 %v after %d s of writes from 8 goroutines\n", p50.Round(10*time.Microsecond), rounds)

	relay, err := ddbrelay.New(ddb.Endpoint, ddbrelay.Options{
		WritesPerItemPerSecond: o.itemCap, Delay: o.storeDelay, Jitter: o.storeJitter, Seed: uint64(time.Now().UnixNano()),
	})
	if err != nil {
		return err
	}
	timed := &timedHandler{h: relay}
	relayURL, closeRelay, err := harness.Serve(timed)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, closeRelay)

	upstreamURL, closeUpstream, err := harness.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	}))
	if err != nil {
		return err
	}
	cleanups = append(cleanups, closeUpstream)

	reps := make([]*replica, o.replicas)
	var stopped bool
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		var wg sync.WaitGroup
		for _, r := range reps {
			if r != nil {
				wg.Add(1)
				go func() { defer wg.Done(); r.stop() }()
			}
		}
		wg.Wait()
	}
	cleanups = append(cleanups, stopAll)
	// Every replica's two addresses are chosen together, before any starts: a port is free only
	// until its process binds it, and chosen one replica at a time the kernel could hand the
	// port of a replica still starting to the next (one replica's admin address then answered
	// by another's proxy, which the readiness check and the metrics scrape cannot tell apart).
	addrs, err := harness.FreeAddrs(2 * len(reps))
	if err != nil {
		return err
	}
	for i := range reps {
		r, err := startReplica(ctx, o, i, addrs[2*i], addrs[2*i+1], table, relayURL, upstreamURL)
		if r != nil {
			reps[i] = r
		}
		if err != nil {
			return err
		}
	}
	for _, r := range reps {
		if err := r.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	mode := "lease (pool bench-account, " + strconv.Itoa(o.shards) + " shards)"
	if !o.lease {
		mode = "no lease (baseline)"
	}
	fmt.Fprintf(stdout, "%d replicas ready; pool %.0f/s burst %.0f, item cap %d writes/s, %s; offering %.0f/s for %v warm-up (not counted), %v pause, %v steady + %v shift\n",
		o.replicas, o.rate, o.burst, o.itemCap, mode, o.load*o.rate, o.warmup, o.pause, o.steady, o.shift)
	fmt.Fprintf(stdout, "store: every call delayed %v + U[0, %v] by the relay; store.timeout %v\n", o.storeDelay, o.storeJitter, o.storeTimeout)

	cpuBefore := cpuSeconds(reps, ddb)
	loadBefore := loadAvg()
	// What the replicas counted before the measurement (the warm-up's decisions) is taken off
	// what they count at its end.
	var before scraped
	measure := func() error {
		relay.ResetStats()
		cpuBefore, loadBefore = cpuSeconds(reps, ddb), loadAvg()
		var err error
		before, err = scrapeAll(ctx, reps)
		return err
	}
	// A probe beside the load: serial UpdateItems straight to DynamoDB Local (not through the
	// relay, not counted), to tell a slow DynamoDB Local from slow replicas.
	probeCtx, stopProbe := context.WithCancel(ctx)
	probeDone := make(chan []time.Duration, 1)
	go func() { probeDone <- probe(probeCtx, client, table, 50*time.Millisecond) }()
	counts, loadErr := offer(ctx, o, reps, stdout, measure)
	stopProbe()
	probeLat := <-probeDone
	cpuAfter := cpuSeconds(reps, ddb)
	if loadErr != nil {
		return loadErr
	}

	// A replica that died during the load makes the numbers meaningless: say which and why.
	for _, r := range reps {
		select {
		case <-r.exited:
			return fmt.Errorf("replica %d exited during the load: %w; %s (log: %s)", r.i, r.exitErr, firstPanicLine(r.log.Name()), r.log.Name())
		default:
		}
	}
	// The decision-time histograms, before the replicas stop: every decision's, and (lease
	// mode) those answered from a lease without a round trip, which the target is about.
	after, err := scrapeAll(ctx, reps)
	if err != nil {
		return err
	}
	hs, leaseHs, counters := after.minus(before)
	storeLat := relay.Stats().Latency // the measurement's, before the shutdown's give-backs
	// Stop the replicas before reading the relay: the writes of a clean shutdown (lease
	// refunds) are part of the cost.
	stopAll()
	st := relay.Stats()
	p99All := quantile(0.99, merge(hs...))
	if p99All != p99All { // NaN: no decisions observed
		p99All = 0
	}
	p99 := p99All
	if o.lease {
		if p99 = quantile(0.99, merge(leaseHs...)); p99 != p99 {
			p99 = 0
		}
	}
	res := result(o.replicas, o.rate, o.burst, o.itemCap, counts,
		relayCounts{forwarded: st.Writes.Forwarded, throttled: st.Writes.Throttled, hottest: st.Hottest.Attempted(),
			storeP50: storeLat.P50, storeP99: storeLat.P99}, p99)
	ph := phases(o.rate, o.burst, counts)

	if err := writeJSON(filepath.Join(o.out, "scale.json"), res); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(o.out, "scale-phases.json"), ph); err != nil {
		return err
	}
	printReport(stdout, o, res, ph, st, cpuBefore, cpuAfter)
	fmt.Fprintf(stdout, "load average (1 min) before the load %s, after %s\n", loadBefore, loadAvg())
	fmt.Fprintf(stdout, "replicas' counters, summed (non-zero), in the measurement and before it (warm-up):\n")
	names := make([]string, 0, len(counters))
	for k := range counters {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if counters[k] != 0 || before.counters[k] != 0 {
			fmt.Fprintf(stdout, "  %-70s %10.0f %10.0f\n", k, counters[k], before.counters[k])
		}
	}
	fmt.Fprintf(stdout, "p99 of every decision (ratelimit_store_duration_seconds, waits for a renewal included): %.3f ms\n", p99All*1000)
	if lat := timed.latencies(); len(lat) > 0 {
		n := len(lat)
		fmt.Fprintf(stdout, "relay: %d requests answered (forwarded or throttled) in p50 %v, p99 %v, max %v\n", n,
			lat[n/2].Round(10*time.Microsecond), lat[n*99/100].Round(10*time.Microsecond), lat[n-1].Round(10*time.Microsecond))
	}
	if n := len(probeLat); n > 0 {
		sort.Slice(probeLat, func(i, j int) bool { return probeLat[i] < probeLat[j] })
		fmt.Fprintf(stdout, "DynamoDB Local during the load, %d serial UpdateItems straight to it: p50 %v, p99 %v, max %v\n", n,
			probeLat[n/2].Round(10*time.Microsecond), probeLat[n*99/100].Round(10*time.Microsecond), probeLat[n-1].Round(10*time.Microsecond))
	}
	var other int64
	for _, p := range ph {
		other += p.Other + p.Unsent
	}
	if other > 0 {
		fmt.Fprintf(stdout, "\nWARNING: %d answers were neither 200 nor 429 (or could not be sent); a good run has none\n", other)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createTable creates the table as the gateway's create_table does (pk S, on demand, TTL), with
// the harness's own client straight to DynamoDB Local, so that no replica races another for it.
func createTable(ctx context.Context, client *dynamodb.Client, table string) error {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return dynamo.CreateTable(cctx, client, table)
}

// timedHandler records how long h took to answer each request.
type timedHandler struct {
	h   http.Handler
	mu  sync.Mutex
	lat []time.Duration
}

func (t *timedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	t.h.ServeHTTP(w, r)
	d := time.Since(start)
	t.mu.Lock()
	t.lat = append(t.lat, d)
	t.mu.Unlock()
}

// latencies returns the recorded durations, sorted.
func (t *timedHandler) latencies() []time.Duration {
	t.mu.Lock()
	lat := slices.Clone(t.lat)
	t.mu.Unlock()
	slices.Sort(lat)
	return lat
}

// probe sends one UpdateItem at a time to an item no gateway uses, every interval, until ctx
// ends, and returns their latencies.
func probe(ctx context.Context, client *dynamodb.Client, table string, interval time.Duration) []time.Duration {
	var lat []time.Duration
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return lat
		case <-tick.C:
		}
		t := time.Now()
		_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(table),
			Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "bench-scale-probe"}},
			UpdateExpression:          aws.String("ADD #n :one"),
			ExpressionAttributeNames:  map[string]string{"#n": "n"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
		})
		if err == nil {
			lat = append(lat, time.Since(t))
		}
	}
}

// replica is one gateway process.
type replica struct {
	i            int
	proxy, admin string
	cmd          *exec.Cmd
	log          *os.File
	exited       chan struct{}
	exitErr      error
	client       *http.Client
	sem          chan struct{}
}

// replicaConfig is the gateway's configuration: the contract for the lease fields.
func replicaConfig(o options, proxy, admin, table, relayURL, upstreamURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: %s
admin_listen: %s
upstream: %s
log:
  level: warn
store:
  backend: dynamodb
  on_error: deny          # an error must never count as admitted
  timeout: %s
  dynamodb: {table: %s, endpoint: %s, region: us-east-1, create_table: false}
policies:
  - name: account
    key: global
    algorithm: token_bucket
    rate: %s/s
    burst: %s
`, proxy, admin, upstreamURL, o.storeTimeout, table, relayURL,
		strconv.FormatFloat(o.rate, 'f', -1, 64), strconv.FormatFloat(o.burst, 'f', -1, 64))
	if o.lease {
		fmt.Fprintf(&b, `    pool: bench-account
    lease:
      enabled: true
      shards: %d
`, o.shards)
	}
	return b.String()
}

// startReplica starts replica i on proxy address pa and admin address aa.
func startReplica(ctx context.Context, o options, i int, pa, aa, table, relayURL, upstreamURL string) (*replica, error) {
	dir := filepath.Join(o.out, "scale-replicas")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i))
	if err := os.WriteFile(cfgPath, []byte(replicaConfig(o, pa, aa, table, relayURL, upstreamURL)), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("replica-%d.log", i)))
	if err != nil {
		return nil, err
	}
	r := &replica{
		i: i, proxy: "http://" + pa, admin: "http://" + aa, log: logf, exited: make(chan struct{}),
		sem: make(chan struct{}, o.conns),
	}
	r.client = &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConns:        o.conns,
			MaxIdleConnsPerHost: o.conns,
			MaxConnsPerHost:     o.conns,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		},
	}
	r.cmd = exec.Command(o.bin, "serve", "--config", cfgPath)
	r.cmd.Env = append(os.Environ(), dynamolocal.Env()...)
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	// A harness killed hard must not leave gateways behind.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start replica %d: %w", i, err)
	}
	go func() { r.exitErr = r.cmd.Wait(); close(r.exited) }()
	return r, ctx.Err()
}

// waitReady polls /readyz until it answers 200, the process exits or the deadline passes.
func (r *replica) waitReady(ctx context.Context, limit time.Duration) error {
	if err := harness.WaitReady(ctx, r.admin+"/readyz", r.exited, limit); err != nil {
		if errors.Is(err, harness.ErrExited) {
			err = fmt.Errorf("%w: %w", err, r.exitErr)
		}
		return fmt.Errorf("replica %d: %w (log: %s)", r.i, err, r.log.Name())
	}
	return nil
}

// stop ends the replica with SIGTERM (a clean shutdown returns its leases), then SIGKILL.
func (r *replica) stop() {
	select {
	case <-r.exited:
	default:
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(15 * time.Second):
			fmt.Fprintf(os.Stderr, "replica %d did not stop within 15s of SIGTERM; killing it\n", r.i)
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	}
	r.client.CloseIdleConnections()
	r.log.Close()
}

// scraped is what the report reads from every replica's metrics: the decision-time histograms,
// one per replica (every decision's, and those answered from a lease), and the diagnosed
// counters summed.
type scraped struct {
	all, lease []histogram
	counters   map[string]float64
}

// scrapeAll reads every replica's metrics.
func scrapeAll(ctx context.Context, reps []*replica) (scraped, error) {
	sc := scraped{counters: map[string]float64{}}
	for _, r := range reps {
		page, err := r.metrics(ctx)
		if err != nil {
			return sc, err
		}
		h, err := parseHistogram(bytes.NewReader(page), "ratelimit_store_duration_seconds")
		if err != nil {
			return sc, fmt.Errorf("replica %d: %w", r.i, err)
		}
		lh, err := parseHistogram(bytes.NewReader(page), "ratelimit_dynamodb_lease_local_decision_seconds")
		if err != nil {
			return sc, fmt.Errorf("replica %d: %w", r.i, err)
		}
		if err := addCounters(bytes.NewReader(page), sc.counters); err != nil {
			return sc, fmt.Errorf("replica %d: %w", r.i, err)
		}
		sc.all, sc.lease = append(sc.all, h), append(sc.lease, lh)
	}
	return sc, nil
}

// minus is what was counted since before (a zero before: everything).
func (sc scraped) minus(before scraped) (all, lease []histogram, counters map[string]float64) {
	counters = maps.Clone(sc.counters)
	for k, v := range before.counters {
		counters[k] -= v
	}
	for i := range sc.all {
		var b, lb histogram
		if i < len(before.all) {
			b, lb = before.all[i], before.lease[i]
		}
		all, lease = append(all, sub(sc.all[i], b)), append(lease, sub(sc.lease[i], lb))
	}
	return all, lease, counters
}

// metrics scrapes the replica's /metrics page.
func (r *replica) metrics(ctx context.Context) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.admin+"/metrics", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("replica %d metrics: %w", r.i, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("replica %d metrics: status %d", r.i, res.StatusCode)
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("replica %d metrics: %w", r.i, err)
	}
	return b, nil
}

// phaseCounters is what the generator counts in one phase, from many goroutines.
type phaseCounters struct {
	offered, ok, limited, other, unsent atomic.Int64
	// start and okPerSecond: the admitted requests by the second of the phase they were sent
	// in, to tell a loss at the start (cold connections, the first leases) from a steady one.
	start       time.Time
	okPerSecond [120]atomic.Int64
	mu          sync.Mutex
	statuses    map[string]int64 // the "other" answers by status or error
}

func (c *phaseCounters) otherAnswer(what string) {
	c.other.Add(1)
	c.mu.Lock()
	c.statuses[what]++
	c.mu.Unlock()
}

// offer runs the phases: steady (every replica gets an equal share of load x rate), then shift
// (the first half of the replicas gets nothing, the second half twice its share, so the total
// stays the same). Each replica's share is sent open loop: the request due at t is sent at t
// whether or not earlier ones were answered, on one of the replica's keep-alive connections; a
// request due when every connection is busy is counted unsent.
//
// A warm-up phase at the steady rates comes first, and a pause without load; neither is counted,
// and measure is called at the end of the pause (the relay's counts start over). A fleet that
// just started pays for cold connections, a cold DynamoDB Local and pools that have not seen
// their demand yet; the targets are about a fleet at work. The pause lets the pool fill up to its
// burst again (as the exact bound assumes) and every lease expire or go back.
func offer(ctx context.Context, o options, reps []*replica, stdout io.Writer, measure func() error) ([]phaseCounts, error) {
	total := o.load * o.rate
	n := len(reps)
	type phaseSpec struct {
		name  string
		d     time.Duration
		rates []float64
	}
	steady := make([]float64, n)
	shifted := make([]float64, n)
	for i := range reps {
		steady[i] = total / float64(n)
		if i >= n/2 {
			shifted[i] = total / float64(n-n/2)
		}
	}
	var specs []phaseSpec
	if o.warmup > 0 {
		specs = append(specs, phaseSpec{"warm-up", o.warmup, steady})
	}
	specs = append(specs, phaseSpec{"steady", o.steady, steady})
	if o.shift > 0 {
		specs = append(specs, phaseSpec{"shift", o.shift, shifted})
	}

	var inflight sync.WaitGroup
	var out []phaseCounts
	for _, sp := range specs {
		if sp.name == "steady" {
			if o.warmup > 0 {
				if err := sleepCtx(ctx, o.pause); err != nil {
					return nil, err
				}
			}
			if err := measure(); err != nil {
				return nil, err
			}
		}
		start := time.Now()
		c := &phaseCounters{statuses: map[string]int64{}, start: start}
		end := start.Add(sp.d)
		var gens sync.WaitGroup
		for i, r := range reps {
			if sp.rates[i] == 0 {
				continue
			}
			gens.Add(1)
			go func() {
				defer gens.Done()
				generate(ctx, r, sp.rates[i], start, end, c, &inflight)
			}()
		}
		gens.Wait()
		elapsed := time.Since(start)
		if err := ctx.Err(); err != nil {
			inflight.Wait()
			return nil, err
		}
		// The phase's answers: its requests are counted by when they were sent, so wait for
		// them before reading the counts.
		inflight.Wait()
		pc := phaseCounts{
			name: sp.name, durationS: elapsed.Seconds(),
			offered: c.offered.Load(), ok: c.ok.Load(), limited: c.limited.Load(),
			other: c.other.Load(), unsent: c.unsent.Load(),
		}
		fmt.Fprintf(stdout, "  %s phase: offered %d, 200 %d, 429 %d, other %d, unsent %d; admitted by second:",
			sp.name, pc.offered, pc.ok, pc.limited, pc.other, pc.unsent)
		for i := 0; i < len(c.okPerSecond) && time.Duration(i)*time.Second < elapsed; i++ {
			fmt.Fprintf(stdout, " %d", c.okPerSecond[i].Load())
		}
		fmt.Fprintln(stdout)
		if len(c.statuses) > 0 {
			keys := make([]string, 0, len(c.statuses))
			for k := range c.statuses {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintf(stdout, "  %s phase, answers neither 200 nor 429:", sp.name)
			for _, k := range keys {
				fmt.Fprintf(stdout, " %s=%d", k, c.statuses[k])
			}
			fmt.Fprintln(stdout)
		}
		if sp.name != "warm-up" {
			out = append(out, pc)
		}
	}
	return out, nil
}

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// generate sends rate requests per second to r from start until end, catching up after a late
// tick so that the count sent by time t is floor((t-start) x rate).
func generate(ctx context.Context, r *replica, rate float64, start, end time.Time, c *phaseCounters, inflight *sync.WaitGroup) {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var sent int64
	for {
		now := time.Now()
		if now.After(end) {
			now = end
		}
		due := int64(now.Sub(start).Seconds() * rate)
		for ; sent < due; sent++ {
			select {
			case r.sem <- struct{}{}:
			default:
				c.unsent.Add(1)
				continue
			}
			c.offered.Add(1)
			inflight.Add(1)
			go func() {
				defer inflight.Done()
				defer func() { <-r.sem }()
				send(ctx, r, c)
			}()
		}
		if !now.Before(end) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func send(ctx context.Context, r *replica, c *phaseCounters) {
	sec := int(time.Since(c.start) / time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.proxy+"/", nil)
	res, err := r.client.Do(req)
	if err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			c.otherAnswer("client-timeout")
		default:
			c.otherAnswer("transport-error")
		}
		return
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	switch res.StatusCode {
	case http.StatusOK:
		c.ok.Add(1)
		if sec >= 0 && sec < len(c.okPerSecond) {
			c.okPerSecond[sec].Add(1)
		}
	case http.StatusTooManyRequests:
		c.limited.Add(1)
	default:
		c.otherAnswer(strconv.Itoa(res.StatusCode))
	}
}

// cpu is CPU seconds (user + system) per process group at one instant.
type cpu struct {
	replicas, dynamodb, harness float64
}

// cpuSeconds reads /proc/PID/stat (Linux; zero elsewhere).
func cpuSeconds(reps []*replica, ddb *dynamolocal.Instance) cpu {
	var c cpu
	for _, r := range reps {
		c.replicas += procCPU(r.cmd.Process.Pid)
	}
	c.dynamodb = procCPU(ddb.PID())
	c.harness = procCPU(os.Getpid())
	return c
}

// clockTicks is USER_HZ, 100 on every Linux platform Go supports.
const clockTicks = 100

func procCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; the fields after its closing ')' are fixed.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	// utime and stime are fields 14 and 15 of the line, 12 and 13 after the ')'.
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clockTicks
}

// firstPanicLine returns the first "panic:" or "fatal error:" line of a log, or a placeholder.
func firstPanicLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
			return l
		}
	}
	return "no panic in its log"
}

// loadAvg is the 1-minute load average (Linux), to tell a quiet machine from a shared one.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func printReport(w io.Writer, o options, res Result, ph []Phase, st ddbrelay.Stats, before, after cpu) {
	b, _ := json.MarshalIndent(res, "", "  ")
	fmt.Fprintf(w, "\n%s\n%s\n", filepath.Join(o.out, "scale.json"), b)
	fmt.Fprintf(w, "(p99_decision_ms: with leases, the replicas' ratelimit_dynamodb_lease_local_decision_seconds, decisions answered from a lease without a round trip; without, every decision's ratelimit_store_duration_seconds; histograms merged, the 99th percentile interpolated linearly within its bucket, as histogram_quantile does; buckets are sqrt(10) apart)\n")
	b, _ = json.MarshalIndent(ph, "", "  ")
	fmt.Fprintf(w, "\n%s\n%s\n", filepath.Join(o.out, "scale-phases.json"), b)

	fmt.Fprintf(w, "\nrelay: %d writes forwarded, %d throttled, %d unattributed, %d other requests\n",
		st.Writes.Forwarded, st.Writes.Throttled, st.Unattributed, st.Reads)
	ops := make([]string, 0, len(st.Ops))
	for op := range st.Ops {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		s := st.Ops[op]
		fmt.Fprintf(w, "  %-20s requests %7d  writes forwarded %7d throttled %7d\n", op, s.Requests, s.Writes.Forwarded, s.Writes.Throttled)
	}
	items := map[ddbrelay.Item]int64{}
	for _, win := range st.Windows {
		for it, c := range win.Items {
			items[it] += c.Forwarded
		}
	}
	fmt.Fprintf(w, "  hottest item %q: %d writes in the second from %s (%d forwarded, %d throttled); %d items written\n",
		st.Hottest.Item.Key, st.Hottest.Attempted(), st.Hottest.Start.Format("15:04:05"), st.Hottest.Forwarded, st.Hottest.Throttled, len(items))
	load := res.DurationS
	fmt.Fprintf(w, "\nCPU during the load (%.1f s on %d cores): replicas %.1f s, DynamoDB Local %.1f s, harness (generator + relay + upstream) %.1f s\n",
		load, runtime.NumCPU(), after.replicas-before.replicas, after.dynamodb-before.dynamodb, after.harness-before.harness)
}
