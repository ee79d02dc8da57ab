// Command overload is `make bench-overload`: the upstream protection (the protect block) under
// overload. An in-process upstream serves `capacity` requests in parallel in `service` each;
// beyond that requests queue inside it, so latency rises with load as in a real server, and it
// finishes the work of requests whose clients gave up (as most servers do). An open-loop
// generator offers an unloaded warm-up, then 0.5x, 1x, 2x and 4x the upstream's capacity, 20%
// critical (X-Priority: critical), 60% default and 20% sheddable (/batch), and then, still at
// 4x, the upstream's capacity halves. Three gateway processes (bin/ratelimit-proxy) run the same
// load one after the other: no protection, a fixed limit of the capacity, and the adaptive limit.
// It writes .cache/bench/overload.json (per configuration and step: offered and admitted per
// second per priority, p50/p99 of admitted requests, shed counts, goodput, and the limit over
// time), a plot beside it (overload.svg), and prints the targets against the run.
//
// Knobs are flags with environment defaults (BENCH_OVERLOAD_*): see -h. Everything listens on
// loopback; every process it starts is stopped at the end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

type options struct {
	capacity      int
	service       time.Duration
	step          time.Duration
	halved        time.Duration
	unloaded      time.Duration
	clientTimeout time.Duration
	queueTimeout  time.Duration
	reserve       float64
	hostile       time.Duration
	hostileOnly   bool
	hostileLoad   float64
	bin, out      string
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	var o options
	fs := flag.NewFlagSet("overload", flag.ExitOnError)
	fs.IntVar(&o.capacity, "capacity", harness.Atoi(envOr("BENCH_OVERLOAD_CAPACITY", "10")), "requests the upstream serves in parallel (BENCH_OVERLOAD_CAPACITY)")
	fs.DurationVar(&o.service, "service", harness.Dur(envOr("BENCH_OVERLOAD_SERVICE", "100ms")), "the upstream's service time (BENCH_OVERLOAD_SERVICE)")
	fs.DurationVar(&o.step, "step", harness.Dur(envOr("BENCH_OVERLOAD_STEP", "6s")), "length of each load step (BENCH_OVERLOAD_STEP)")
	fs.DurationVar(&o.halved, "halved", harness.Dur(envOr("BENCH_OVERLOAD_HALVED", "12s")), "length of the last step, at 4x with the capacity halved (BENCH_OVERLOAD_HALVED)")
	fs.DurationVar(&o.unloaded, "unloaded", harness.Dur(envOr("BENCH_OVERLOAD_UNLOADED", "3s")), "the unloaded warm-up at 0.1x, whose p99 is the latency target's base (BENCH_OVERLOAD_UNLOADED)")
	fs.DurationVar(&o.clientTimeout, "client-timeout", harness.Dur(envOr("BENCH_OVERLOAD_CLIENT_TIMEOUT", "2s")), "clients give up after this (BENCH_OVERLOAD_CLIENT_TIMEOUT)")
	fs.DurationVar(&o.queueTimeout, "queue-timeout", harness.Dur(envOr("BENCH_OVERLOAD_QUEUE_TIMEOUT", "10ms")), "protect.concurrency.queue_timeout of the protected runs (BENCH_OVERLOAD_QUEUE_TIMEOUT)")
	fs.Float64Var(&o.reserve, "reserve", harness.Atof(envOr("BENCH_OVERLOAD_RESERVE", "0.2")), "critical's reserve in the protected runs (BENCH_OVERLOAD_RESERVE)")
	fs.DurationVar(&o.hostile, "hostile", harness.Dur(envOr("BENCH_OVERLOAD_HOSTILE", "20s")), "length of each of the two hostile-clients runs, without and with them; 0s: skip (BENCH_OVERLOAD_HOSTILE)")
	fs.Float64Var(&o.hostileLoad, "hostile-load", harness.Atof(envOr("BENCH_OVERLOAD_HOSTILE_LOAD", "0.6")), "the honest load of the hostile-clients runs, a multiple of the capacity (BENCH_OVERLOAD_HOSTILE_LOAD)")
	fs.BoolVar(&o.hostileOnly, "hostile-only", false, "run only the hostile-clients comparison")
	fs.StringVar(&o.bin, "bin", "bin/ratelimit-proxy", "the gateway binary")
	fs.StringVar(&o.out, "out", ".cache/bench/overload.json", "the report; the plot goes beside it (.svg)")
	_ = fs.Parse(os.Args[1:])
	if o.capacity < 1 || o.service <= 0 || o.step <= 0 || o.halved <= 0 || o.unloaded <= 0 || o.clientTimeout <= 0 || o.queueTimeout < 0 || o.reserve < 0 || o.reserve >= 1 || o.hostile < 0 || o.hostileOnly && o.hostile == 0 || o.hostileLoad <= 0 {
		fmt.Fprintln(os.Stderr, "overload: every knob must be positive (see -h)")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
}

// configs are the three configurations, run one after the other on the same load.
func configs(o options) []config {
	return []config{
		{Name: "none"},
		{Name: "fixed", Protect: fmt.Sprintf("protect:\n  concurrency: {adaptive: false, limit: %d, queue_timeout: %s}\n", o.capacity, o.queueTimeout)},
		{Name: "adaptive", Protect: fmt.Sprintf("protect:\n  concurrency: {adaptive: true, limit: %d, min_limit: 2, max_limit: 1000, queue_timeout: %s}\n", 5*o.capacity, o.queueTimeout)},
	}
}

type config struct {
	Name    string `json:"name"`
	Protect string `json:"protect"`
}

const priorities = `  priorities:
    - name: critical
      match: {headers: {X-Priority: critical}}
      reserve: %g
    - name: sheddable
      match: {path_prefix: /batch}
`

// phases are the steps of one run: multiples of the (original) capacity, and whether the
// upstream's capacity is halved.
func phases(o options) []phase {
	return []phase{
		{Name: "unloaded", Load: 0.1, Dur: o.unloaded},
		{Name: "0.5x", Load: 0.5, Dur: o.step},
		{Name: "1x", Load: 1, Dur: o.step},
		{Name: "2x", Load: 2, Dur: o.step},
		{Name: "4x", Load: 4, Dur: o.step},
		{Name: "4x, capacity halved", Load: 4, Dur: o.halved, Halved: true},
	}
}

type phase struct {
	Name   string
	Load   float64
	Dur    time.Duration
	Halved bool
}

func run(o options) error {
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("%s: %w (run make build)", o.bin, err)
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	rep := report{Capacity: o.capacity, Reserve: o.reserve, ServiceMS: ms(o.service), QueueTimeoutMS: ms(o.queueTimeout),
		ClientTimeoutMS: ms(o.clientTimeout), CapacityPerSecond: float64(o.capacity) / o.service.Seconds()}
	for _, c := range configs(o) {
		if o.hostileOnly {
			break
		}
		fmt.Printf("== %s\n", c.Name)
		res, err := runConfig(o, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		rep.Configs = append(rep.Configs, res)
	}
	rep.evaluate(o)
	if o.hostile > 0 {
		fmt.Println("== hostile clients beside the honest ones (adaptive)")
		h, err := runHostile(o)
		if err != nil {
			return fmt.Errorf("hostile: %w", err)
		}
		rep.Hostile = h
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	svg := strings.TrimSuffix(o.out, filepath.Ext(o.out)) + ".svg"
	if err := os.WriteFile(svg, plot(&rep), 0o644); err != nil {
		return err
	}
	rep.print(os.Stdout)
	fmt.Printf("wrote %s and %s\n", o.out, svg)
	return nil
}

// upstream serves capacity requests at once, service each; the others wait in a FIFO inside
// it. It does not notice clients that gave up: their work is done all the same.
type upstream struct {
	service time.Duration
	mu      sync.Mutex
	cap     int
	busy    int
	queue   []chan struct{}
}

func (u *upstream) setCapacity(n int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.cap = n
	for u.busy < u.cap && len(u.queue) > 0 {
		u.busy++
		close(u.queue[0])
		u.queue = u.queue[1:]
	}
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	u.work()
	_, _ = io.WriteString(w, "ok")
}

// work waits for a server and does one request's work.
func (u *upstream) work() {
	u.mu.Lock()
	if u.busy < u.cap {
		u.busy++
		u.mu.Unlock()
	} else {
		ch := make(chan struct{})
		u.queue = append(u.queue, ch)
		u.mu.Unlock()
		<-ch
	}
	time.Sleep(u.service) // the work itself
	u.mu.Lock()
	if len(u.queue) > 0 && u.busy <= u.cap {
		close(u.queue[0]) // hand the server over
		u.queue = u.queue[1:]
	} else {
		u.busy--
	}
	u.mu.Unlock()
}

// sample is one request's fate.
type sample struct {
	phase   int
	class   int // 0 critical, 1 default, 2 sheddable
	start   time.Duration
	latency time.Duration
	outcome int
}

const (
	outOK = iota
	outShed
	outTimeout
	outError
)

var classNames = [3]string{"critical", "default", "sheddable"}

func runConfig(o options, c config) (configResult, error) {
	up := &upstream{service: o.service, cap: o.capacity}
	upURL, closeUp, err := harness.Serve(up)
	if err != nil {
		return configResult{}, err
	}
	defer closeUp()
	addrs, err := harness.FreeAddrs(2)
	if err != nil {
		return configResult{}, err
	}
	dir, err := os.MkdirTemp("", "bench-overload-")
	if err != nil {
		return configResult{}, err
	}
	defer os.RemoveAll(dir)
	protect := c.Protect
	if protect != "" {
		protect += fmt.Sprintf(priorities, o.reserve)
	}
	if protect != "" {
		// The load generator stands for the edge proxy that sets X-Priority: a priority
		// header is believed only from trusted_proxies.
		protect = "trusted_proxies: [127.0.0.1/32]\n" + protect
	}
	cfg := fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: %s\nupstream_timeout: 30s\npolicies:\n  - {name: lenient, key: global, algorithm: token_bucket, rate: 1000000/s, burst: 1000000}\n%s",
		addrs[0], addrs[1], upURL, protect)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return configResult{}, err
	}
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return configResult{}, err
	}
	defer logf.Close()
	cmd := exec.Command(o.bin, "serve", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return configResult{}, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(40 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	admin, proxy := "http://"+addrs[1], "http://"+addrs[0]
	if err := harness.WaitReady(context.Background(), admin+"/readyz", exited, 20*time.Second); err != nil {
		return configResult{}, err
	}

	client := &http.Client{Timeout: o.clientTimeout, Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: o.clientTimeout}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
	defer client.CloseIdleConnections()

	var (
		mu      sync.Mutex
		samples []sample
		limits  []limitPoint
		wg      sync.WaitGroup
	)
	begin := time.Now()
	stopScrape := make(chan struct{})
	scraped := make(chan struct{})
	go func() { // the limit over time
		defer close(scraped)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopScrape:
				return
			case <-t.C:
				l, in := scrapeLimit(admin)
				mu.Lock()
				limits = append(limits, limitPoint{T: time.Since(begin).Seconds(), Limit: l, Inflight: in})
				mu.Unlock()
			}
		}
	}()
	rng := rand.New(rand.NewPCG(7, 11)) // the same load for every configuration
	var phaseStarts []float64
	for pi, ph := range phases(o) {
		if ph.Halved {
			up.setCapacity(max(1, o.capacity/2))
		}
		phaseStarts = append(phaseStarts, time.Since(begin).Seconds())
		rate := ph.Load * float64(o.capacity) / o.service.Seconds()
		fmt.Printf("   %-20s %6.0f req/s for %v\n", ph.Name, rate, ph.Dur)
		start := time.Now()
		sent := 0
		tick := time.NewTicker(time.Millisecond)
		for now := range tick.C {
			el := now.Sub(start)
			if el >= ph.Dur {
				break
			}
			for due := int(rate * el.Seconds()); sent < due; sent++ {
				class := 1
				switch x := rng.Float64(); {
				case x < 0.2:
					class = 0
				case x >= 0.8:
					class = 2
				}
				wg.Add(1)
				go func(pi, class int) {
					defer wg.Done()
					s := send(client, proxy, class, begin)
					s.phase = pi
					mu.Lock()
					samples = append(samples, s)
					mu.Unlock()
				}(pi, class)
			}
		}
		tick.Stop()
	}
	wg.Wait()
	close(stopScrape)
	<-scraped
	up.setCapacity(o.capacity)
	return summarize(o, c, samples, limits, phaseStarts), nil
}

// send makes one request of class and returns its fate.
func send(client *http.Client, proxy string, class int, begin time.Time) sample {
	path := "/api/x"
	if class == 2 {
		path = "/batch/x"
	}
	req, _ := http.NewRequest(http.MethodGet, proxy+path, nil)
	if class == 0 {
		req.Header.Set("X-Priority", "critical")
	}
	t0 := time.Now()
	s := sample{class: class, start: t0.Sub(begin)}
	res, err := client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	s.latency = time.Since(t0)
	var ne net.Error
	switch {
	case err != nil && (errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)):
		s.outcome = outTimeout
	case err != nil:
		s.outcome = outError
	case res.StatusCode == http.StatusOK:
		s.outcome = outOK
	case res.StatusCode == http.StatusServiceUnavailable || res.StatusCode == http.StatusTooManyRequests:
		s.outcome = outShed
	default:
		s.outcome = outError
	}
	return s
}

// scrapeLimit reads the limit and in-flight gauges (-1 when the gateway has no protection).
func scrapeLimit(admin string) (limit, inflight float64) {
	limit, inflight = -1, -1
	c := http.Client{Timeout: time.Second}
	res, err := c.Get(admin + "/metrics")
	if err != nil {
		return
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		// A line that does not parse leaves the figure at zero, which the report shows.
		switch {
		case strings.HasPrefix(line, "ratelimit_upstream_concurrency_limit "):
			limit, _ = strconv.ParseFloat(strings.TrimPrefix(line, "ratelimit_upstream_concurrency_limit "), 64)
		case strings.HasPrefix(line, "ratelimit_upstream_inflight "):
			inflight, _ = strconv.ParseFloat(strings.TrimPrefix(line, "ratelimit_upstream_inflight "), 64)
		}
	}
	return
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
