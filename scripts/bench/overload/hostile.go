package main

// The hostile-clients comparison (issue 32 item 15): the adaptive gateway under the same honest
// load twice, without and then with hostile clients beside it, and the honest clients' goodput,
// p99 and the adaptive limit of both runs. The honest clients stand behind a trusted edge
// (127.0.0.1, which sets X-Priority and X-Forwarded-For for 1,000 client addresses); the hostile
// ones connect from 127.0.0.2, which is not trusted:
//
//   - slow uploads: 16 connections that send a small body's headers and then 1 byte a second,
//     and 4 that trickle a 10 MB body at 1 KB a second (past protect.max_buffered_body);
//   - slow readers: 20 connections that ask for a 4 MB answer and never read it;
//   - abandoned requests: 25 a second that the client gives up on after 3 ms;
//   - a self-declared critical: 10 requests a second with X-Priority: critical.
//
// Every hostile connection that the gateway closes is opened again at once. The honest load is
// -hostile-load of the upstream's capacity (0.6 by default), and every client, the hostile one
// included, has a per-ip budget of 20 requests a second: what the hostile client costs the
// upstream by its own requests is bounded by that budget, as a rate limit is for; what this
// measures is whether it can take more than that, by holding slots, by teaching the adaptive
// limit a wrong latency, or by declaring its own priority.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// hostileReport is the report's "hostile" object.
type hostileReport struct {
	LoadPS  float64       `json:"honest_load_per_second"`
	Seconds float64       `json:"seconds_each"`
	Without hostileRun    `json:"without"`
	With    hostileRun    `json:"with"`
	Targets []target      `json:"targets"`
	Hostile hostileCounts `json:"hostile_clients"`
}

type hostileRun struct {
	GoodputPS float64 `json:"honest_goodput_per_second"`
	P99MS     float64 `json:"honest_p99_ms"`
	Shed      int     `json:"honest_shed"`
	Failed    int     `json:"honest_failed"`
	// Limit is the adaptive limit's mean over the run's second half.
	Limit float64 `json:"limit_mean_second_half"`
}

// hostileCounts is what the hostile clients got, for the with run.
type hostileCounts struct {
	CriticalOK     int `json:"self_declared_critical_ok"`
	CriticalShed   int `json:"self_declared_critical_shed_or_limited"`
	Abandoned      int `json:"abandoned_sent"`
	ReaderConns    int `json:"slow_reader_connections"`
	UploaderConns  int `json:"slow_upload_connections"`
	StreamUploads  int `json:"streaming_upload_connections"`
	UploadsAnswers int `json:"slow_upload_answers"`
}

const hostileConfig = `trusted_proxies: [127.0.0.1/32]
server: {write_stall_timeout: 2s}
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 20/s, burst: 20}
protect:
  concurrency: {adaptive: true, limit: %d, min_limit: 2, max_limit: 1000, queue_timeout: %s}
` + priorities

func runHostile(o options) (*hostileReport, error) {
	rep := &hostileReport{LoadPS: o.hostileLoad * float64(o.capacity) / o.service.Seconds(), Seconds: o.hostile.Seconds()}
	var err error
	if rep.Without, _, err = hostileRunOnce(o, false); err != nil {
		return nil, err
	}
	if rep.With, rep.Hostile, err = hostileRunOnce(o, true); err != nil {
		return nil, err
	}
	w, h := rep.Without, rep.With
	good := h.GoodputPS / w.GoodputPS
	lim := h.Limit / w.Limit
	rep.Targets = []target{
		{What: "hostile: honest goodput", Target: ">= 90% of without", Got: fmt.Sprintf("%.0f/s vs %.0f/s (%.0f%%)", h.GoodputPS, w.GoodputPS, 100*good), Met: good >= 0.9},
		{What: "hostile: adaptive limit", Target: "within 20% of without", Got: fmt.Sprintf("%.1f vs %.1f (%.0f%%)", h.Limit, w.Limit, 100*lim), Met: lim >= 0.8 && lim <= 1.2},
	}
	return rep, nil
}

// hostileRunOnce runs the honest load for o.hostile against a fresh gateway, with the hostile
// clients beside it or not.
func hostileRunOnce(o options, hostile bool) (hostileRun, hostileCounts, error) {
	var run hostileRun
	var hc hostileCounts
	up := &upstream{service: o.service, cap: o.capacity}
	big := strings.Repeat("b", 4<<20)
	mux := http.NewServeMux()
	mux.Handle("/", up)
	mux.HandleFunc("/big/", func(w http.ResponseWriter, r *http.Request) {
		up.work()
		_, _ = io.WriteString(w, big)
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		up.ServeHTTP(w, r)
	})
	upURL, closeUp, err := harness.Serve(mux)
	if err != nil {
		return run, hc, err
	}
	defer closeUp()
	addrs, err := harness.FreeAddrs(2)
	if err != nil {
		return run, hc, err
	}
	dir, err := os.MkdirTemp("", "bench-overload-hostile-")
	if err != nil {
		return run, hc, err
	}
	defer os.RemoveAll(dir)
	cfg := fmt.Sprintf("listen: %s\nadmin_listen: %s\nupstream: %s\nupstream_timeout: 30s\n", addrs[0], addrs[1], upURL) +
		fmt.Sprintf(hostileConfig, 5*o.capacity, o.queueTimeout, o.reserve)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return run, hc, err
	}
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return run, hc, err
	}
	defer logf.Close()
	cmd := exec.Command(o.bin, "serve", "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return run, hc, err
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
	admin, proxy := "http://"+addrs[1], addrs[0]
	if err := harness.WaitReady(context.Background(), admin+"/readyz", exited, 20*time.Second); err != nil {
		return run, hc, err
	}
	ctx, stop := context.WithTimeout(context.Background(), o.hostile)
	defer stop()
	var hwg sync.WaitGroup
	var hmu sync.Mutex
	if hostile {
		startHostile(ctx, &hwg, &hmu, &hc, proxy)
	}

	honest := &http.Client{Timeout: o.clientTimeout, Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, DisableCompression: true}}
	defer honest.CloseIdleConnections()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		limits    []float64
		wg        sync.WaitGroup
	)
	begin := time.Now()
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if time.Since(begin) > o.hostile/2 {
					l, _ := scrapeLimit(admin)
					mu.Lock()
					limits = append(limits, l)
					mu.Unlock()
				}
			}
		}
	}()
	rng := rand.New(rand.NewPCG(7, 11))
	rate := o.hostileLoad * float64(o.capacity) / o.service.Seconds()
	sent := 0
	tick := time.NewTicker(time.Millisecond)
	for now := range tick.C {
		el := now.Sub(begin)
		if el >= o.hostile {
			break
		}
		for due := int(rate * el.Seconds()); sent < due; sent++ {
			class, ip := 1, fmt.Sprintf("10.9.%d.%d", rng.IntN(4), rng.IntN(250))
			switch x := rng.Float64(); {
			case x < 0.2:
				class = 0
			case x >= 0.8:
				class = 2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				path := "/api/x"
				if class == 2 {
					path = "/batch/x"
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+proxy+path, nil)
				req.Header.Set("X-Forwarded-For", ip)
				if class == 0 {
					req.Header.Set("X-Priority", "critical")
				}
				t0 := time.Now()
				res, err := honest.Do(req)
				status := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					status = res.StatusCode
				}
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				switch status {
				case http.StatusOK:
					latencies = append(latencies, d)
				case http.StatusServiceUnavailable, http.StatusTooManyRequests:
					run.Shed++
				default:
					run.Failed++
				}
			}()
		}
	}
	tick.Stop()
	wg.Wait()
	stop()
	hwg.Wait()
	run.GoodputPS = float64(len(latencies)) / o.hostile.Seconds()
	if len(latencies) > 0 {
		slices.Sort(latencies)
		run.P99MS = ms(latencies[min(len(latencies)-1, len(latencies)*99/100)])
	}
	var sum float64
	for _, l := range limits {
		sum += l
	}
	if len(limits) > 0 {
		run.Limit = sum / float64(len(limits))
	}
	fmt.Printf("   hostile=%v: honest goodput %.0f/s, p99 %.0f ms, shed %d, failed %d, limit %.1f\n", hostile, run.GoodputPS, run.P99MS, run.Shed, run.Failed, run.Limit)
	return run, hc, nil
}

// hostileDialer connects from 127.0.0.2: a client the gateway does not trust.
var hostileDialer = &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}

// startHostile starts the hostile clients until ctx ends.
func startHostile(ctx context.Context, wg *sync.WaitGroup, mu *sync.Mutex, hc *hostileCounts, proxy string) {
	count := func(f func()) {
		mu.Lock()
		f()
		mu.Unlock()
	}
	loop := func(n int, each func()) {
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					each()
				}
			}()
		}
	}
	dial := func() net.Conn {
		c, err := hostileDialer.DialContext(ctx, "tcp", proxy)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			return nil
		}
		context.AfterFunc(ctx, func() { c.Close() })
		return c
	}
	// Slow small uploads: headers, then a byte a second.
	loop(16, func() {
		c := dial()
		if c == nil {
			return
		}
		defer c.Close()
		count(func() { hc.UploaderConns++ })
		if _, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"); err != nil {
			return
		}
		go func() {
			if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				res.Body.Close()
				count(func() { hc.UploadsAnswers++ })
			}
			c.Close()
		}()
		for i := 0; i < 100 && ctx.Err() == nil; i++ {
			if _, err := c.Write([]byte{'u'}); err != nil {
				return
			}
			sleepCtx(ctx, time.Second)
		}
	})
	// Streaming uploads: 10 MB at 1 KB a second.
	loop(4, func() {
		c := dial()
		if c == nil {
			return
		}
		defer c.Close()
		count(func() { hc.StreamUploads++ })
		if _, err := io.WriteString(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"); err != nil {
			return
		}
		chunk := make([]byte, 1024)
		for ctx.Err() == nil {
			if _, err := c.Write(chunk); err != nil {
				return
			}
			sleepCtx(ctx, time.Second)
		}
	})
	// Slow readers: a 4 MB answer, never read.
	loop(20, func() {
		c := dial()
		if c == nil {
			return
		}
		defer c.Close()
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4096)
		}
		count(func() { hc.ReaderConns++ })
		if _, err := io.WriteString(c, "GET /big/x HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return
		}
		// Never read; notice the gateway closing the connection by a write failing.
		for ctx.Err() == nil {
			sleepCtx(ctx, 500*time.Millisecond)
			if _, err := io.WriteString(c, "GET /big/x HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				return
			}
		}
	})
	client := &http.Client{Transport: &http.Transport{DialContext: hostileDialer.DialContext, MaxIdleConnsPerHost: 256}}
	every := func(rate float64, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					wg.Add(1)
					go func() { defer wg.Done(); f() }()
				}
			}
		}()
	}
	// Abandoned requests: given up on after 3 ms.
	every(25, func() {
		actx, cancel := context.WithTimeout(ctx, 3*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(actx, http.MethodGet, "http://"+proxy+"/api/abandoned", nil)
		count(func() { hc.Abandoned++ })
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
		}
	})
	// A self-declared critical.
	every(10, func() {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+proxy+"/api/vip", nil)
		req.Header.Set("X-Priority", "critical")
		res, err := client.Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		count(func() {
			if res.StatusCode == http.StatusOK {
				hc.CriticalOK++
			} else {
				hc.CriticalShed++
			}
		})
	})
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (h *hostileReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nhostile clients (adaptive, honest load %.0f/s for %.0fs each):\n", h.LoadPS, h.Seconds)
	fmt.Fprintf(w, "  %-8s %10s %9s %8s %8s %8s\n", "run", "good/s", "p99 ms", "shed", "failed", "limit")
	for _, r := range []struct {
		name string
		run  hostileRun
	}{{"without", h.Without}, {"with", h.With}} {
		fmt.Fprintf(w, "  %-8s %10.0f %9.1f %8d %8d %8.1f\n", r.name, r.run.GoodputPS, r.run.P99MS, r.run.Shed, r.run.Failed, r.run.Limit)
	}
	fmt.Fprintf(w, "  hostile: %+v\n", h.Hostile)
	for _, t := range h.Targets {
		mark := "MET"
		if !t.Met {
			mark = "NOT MET"
		}
		fmt.Fprintf(w, "  %-44s %-52s got %-40s %s\n", t.What, t.Target, t.Got, mark)
	}
}
