// Command rls is `make bench-rls`: Envoy's rate limit service under load, and its decision cost
// beside the proxy's, in one run.
//
//  1. BenchmarkDecision (decision_test.go): the proxy's handler, the RLS in process and the RLS
//     over a loopback gRPC connection, three limits per request, on a memory store.
//  2. The real binary serving RLS alone, on the memory store and then on DynamoDB Local (started
//     here when DYNAMODB_ENDPOINT is unset): a Go load generator over a pool of gRPC connections
//     sends ShouldRateLimit calls of three descriptors drawn from 10,000 distinct values, and
//     reports calls per second, p50 and p99 latency, and the gateway's CPU per call.
//
// It writes .cache/bench/rls.md and prints it; docs/benchmarks.md records results.
//
//	go run ./scripts/bench/rls -h
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// valuesN is how many distinct values each descriptor draws from.
const valuesN = 10_000

// benchRules: three descriptors per call, one per algorithm family, limits that admit
// everything (the admitting path is the common one, and the one that writes).
const benchRules = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
`

func benchRequest(i int) *pb.RateLimitRequest {
	v := strconv.Itoa(i)
	d := func(k, val string) *rlext.RateLimitDescriptor {
		return &rlext.RateLimitDescriptor{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: k, Value: val}}}
	}
	return &pb.RateLimitRequest{Domain: "bench", Descriptors: []*rlext.RateLimitDescriptor{
		d("user", "user-"+v), d("api_key", "key-"+v), d("route", "route-"+v),
	}}
}

type options struct {
	binary    string
	duration  time.Duration
	warmup    time.Duration
	conns     int
	workers   int
	dynWork   int
	dynamo    bool
	goBench   bool
	benchTime string
	out       string
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/ratelimit-proxy", "the gateway binary (make build)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured load per store")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured load before it")
	flag.IntVar(&o.conns, "conns", 4, "gRPC connections in the pool (Envoy keeps one per worker thread)")
	flag.IntVar(&o.workers, "workers", 64, "concurrent calls (memory)")
	flag.IntVar(&o.dynWork, "dynamodb-workers", 8, "concurrent calls on DynamoDB Local (one Java process on the same cores)")
	flag.BoolVar(&o.dynamo, "dynamodb", true, "also run on DynamoDB Local")
	flag.BoolVar(&o.goBench, "gobench", true, "run BenchmarkDecision first")
	flag.StringVar(&o.benchTime, "benchtime", "1s", "-benchtime of BenchmarkDecision")
	flag.StringVar(&o.out, "out", ".cache/bench/rls.md", "where the results go")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-rls:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	var md bytes.Buffer
	fmt.Fprintf(&md, "# bench-rls, %s\n\n%d CPUs (%s/%s), %s.\n\n", time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	if o.goBench {
		fmt.Fprintln(os.Stderr, "BenchmarkDecision (proxy vs RLS, memory store, 3 limits per request)...")
		cmd := exec.Command("go", "test", "-run", "^$", "-bench", "BenchmarkDecision", "-benchtime", o.benchTime, "-count", "3", "./scripts/bench/rls/")
		cmd.Stderr = os.Stderr
		outb, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("go test -bench: %w\n%s", err, outb)
		}
		md.WriteString("## Decision cost, one run (go test -bench BenchmarkDecision -count 3)\n\n```\n")
		sc := bufio.NewScanner(bytes.NewReader(outb))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "Benchmark") || strings.HasPrefix(sc.Text(), "cpu:") {
				md.WriteString(sc.Text() + "\n")
			}
		}
		md.WriteString("```\n\n")
	}

	md.WriteString(fmt.Sprintf("## The binary under load: %d concurrent calls (%d on DynamoDB Local) over %d gRPC connections, %s measured after %s, 3 descriptors per call from %d values each, on_error deny\n\n",
		o.workers, o.dynWork, o.conns, o.duration, o.warmup, valuesN))
	md.WriteString("| store | calls/s | descriptor decisions/s | p50 | p99 | gateway CPU per call | OVER_LIMIT | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	rows := []struct {
		name  string
		store func() (string, []string, func(), error)
	}{
		{"memory", func() (string, []string, func(), error) {
			return "store:\n  backend: memory\n  on_error: deny\n", nil, func() {}, nil
		}},
	}
	if o.dynamo {
		rows = append(rows, struct {
			name  string
			store func() (string, []string, func(), error)
		}{"dynamodb (Local)", dynamoStore})
	}
	for _, r := range rows {
		block, env, stop, err := r.store()
		if err != nil {
			fmt.Fprintf(&md, "| %s | skipped: %v | | | | | | |\n", r.name, err)
			continue
		}
		lo := o
		if r.name != "memory" {
			lo.workers = o.dynWork
		}
		res, err := runLoad(lo, block, env)
		stop()
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		fmt.Fprintf(&md, "| %s | %.0f | %.0f | %s | %s | %s | %d | %d |\n", r.name, res.rate, 3*res.rate,
			res.p50.Round(time.Microsecond), res.p99.Round(time.Microsecond), res.cpuPerCall.Round(time.Microsecond), res.over, res.errors)
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.out, md.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Print(md.String())
	return nil
}

// dynamoStore finds or starts DynamoDB Local and returns the store block of a fresh table.
func dynamoStore() (string, []string, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), dynamolocal.StartTimeout)
	defer cancel()
	var inst *dynamolocal.Instance
	var err error
	// Java may not answer within the start script's 30 s on a loaded machine: try again.
	for attempt := range 3 {
		if inst, err = dynamolocal.Find(ctx); err == nil {
			break
		}
		if inst != nil {
			_ = inst.Stop()
		}
		fmt.Fprintf(os.Stderr, "DynamoDB Local, attempt %d: %v\n", attempt+1, err)
	}
	if err != nil {
		return "", nil, nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	// on_error deny: a store failure is an error the load generator counts, never a fast OK.
	block := fmt.Sprintf("store:\n  backend: dynamodb\n  timeout: 3s\n  on_error: deny\n  dynamodb:\n    table: bench-rls-%s\n    endpoint: %s\n    create_table: true\n", hex.EncodeToString(b[:]), inst.Endpoint)
	return block, dynamolocal.Env(), func() { _ = inst.Stop() }, nil
}

type result struct {
	rate         float64
	p50, p99     time.Duration
	cpuPerCall   time.Duration
	over, errors int
}

// runLoad starts the gateway with storeBlock, loads it, and stops it.
func runLoad(o options, storeBlock string, env []string) (result, error) {
	dir, err := os.MkdirTemp("", "bench-rls")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(benchRules), 0o600); err != nil {
		return result{}, err
	}
	ports, err := harness.FreeAddrs(2)
	if err != nil {
		return result{}, err
	}
	cfg := fmt.Sprintf("admin_listen: %s\nrls:\n  listen: %s\n  config_dir: %s\n%s", ports[0], ports[1], dir, storeBlock)
	cfgPath := filepath.Join(dir, "config.yaml.conf") // not *.yaml: the rules folder is dir
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return result{}, err
	}
	var logs bytes.Buffer
	cmd := exec.Command(o.binary, "serve", "--config", cfgPath)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	if err := harness.WaitReady(context.Background(), "http://"+ports[0]+"/readyz", nil, 60*time.Second); err != nil {
		return result{}, fmt.Errorf("%w\n%s", err, logs.String())
	}

	conns := make([]pb.RateLimitServiceClient, o.conns)
	for i := range conns {
		c, err := grpc.NewClient(ports[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		conns[i] = pb.NewRateLimitServiceClient(c)
	}
	reqs := make([]*pb.RateLimitRequest, valuesN)
	for i := range reqs {
		reqs[i] = benchRequest(i)
	}

	var firstErr atomic.Pointer[error]
	load := func(d time.Duration, record bool) (lat []time.Duration, over, errs int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for w := range o.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := conns[w%len(conns)]
				var mine []time.Duration
				myOver, myErrs := 0, 0
				for i := w; time.Now().Before(end); i += o.workers {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					t0 := time.Now()
					resp, err := c.ShouldRateLimit(ctx, reqs[i%valuesN])
					el := time.Since(t0)
					cancel()
					switch {
					case err != nil:
						myErrs++
						firstErr.CompareAndSwap(nil, &err)
					case resp.GetOverallCode() != pb.RateLimitResponse_OK:
						myOver++
					}
					if record {
						mine = append(mine, el)
					}
				}
				mu.Lock()
				lat = append(lat, mine...)
				over += myOver
				errs += myErrs
				mu.Unlock()
			}()
		}
		wg.Wait()
		return lat, over, errs
	}
	load(o.warmup, false)
	cpu0, err := cpuTime(cmd.Process.Pid)
	if err != nil {
		return result{}, err
	}
	t0 := time.Now()
	lat, over, errs := load(o.duration, true)
	elapsed := time.Since(t0)
	cpu1, _ := cpuTime(cmd.Process.Pid)
	if len(lat) == 0 {
		return result{}, fmt.Errorf("no calls completed\n%s", logs.String())
	}
	if e := firstErr.Load(); e != nil {
		fmt.Fprintf(os.Stderr, "first error: %v\ngateway log tail:\n%s\n", *e, tail(logs.String(), 2000))
	}
	slices.Sort(lat)
	return result{
		rate:       float64(len(lat)) / elapsed.Seconds(),
		p50:        lat[len(lat)/2],
		p99:        lat[len(lat)*99/100],
		cpuPerCall: (cpu1 - cpu0) / time.Duration(len(lat)),
		over:       over,
		errors:     errs,
	}, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// cpuTime is the process's user and system CPU time so far (Linux /proc).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start after the last ')'.
	fs := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fs) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat: %q", b)
	}
	ut, _ := strconv.ParseInt(fs[11], 10, 64)
	st, _ := strconv.ParseInt(fs[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / ticks, nil
}
