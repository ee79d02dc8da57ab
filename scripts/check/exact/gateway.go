package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/harness"
)

// replica is one gateway: a `serve` process, restarted in place after a kill.
type replica struct {
	i int
	// offset is the replica's clock offset as the judge assumes it; ahead is how much further
	// ahead its clock really runs (the self-test's clock mutant; 0 otherwise).
	offset, ahead time.Duration
	env           []string // more environment (the self-test's mutant)
	proxy, admin  string   // host:port
	cfgPath       string
	logPath       string
	bin           string
	client        *http.Client

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	log     *os.File
}

func (r *replica) url() string { return "http://" + r.proxy }

// start runs the process (again, after a kill: same config, same addresses).
func (r *replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, "serve", "--config", r.cfgPath)
	cmd.Env = append(append(os.Environ(), dynamolocal.Env()...), r.env...)
	if off := r.offset + r.ahead; off != 0 {
		// The test gateway's clock seam (internal/testkit/gateway).
		cmd.Env = append(cmd.Env, "RATELIMIT_TEST_CLOCK_OFFSET="+off.String())
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A checker killed hard must not leave gateways behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start replica %d: %w", r.i, err)
	}
	exited := make(chan struct{})
	r.cmd, r.exited, r.log = cmd, exited, logf
	go func() {
		err := cmd.Wait()
		r.mu.Lock()
		r.exitErr = err
		r.mu.Unlock()
		close(exited)
	}()
	return nil
}

func (r *replica) state() (*exec.Cmd, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd, r.exited
}

// waitReady polls /readyz until it answers 200, the process exits or the deadline passes.
func (r *replica) waitReady(ctx context.Context, limit time.Duration) error {
	_, exited := r.state()
	if err := harness.WaitReady(ctx, "http://"+r.admin+"/readyz", exited, limit); err != nil {
		return fmt.Errorf("replica %d: %w (log: %s)", r.i, err, r.logPath)
	}
	return nil
}

// kill ends the process with SIGKILL and waits for it.
func (r *replica) kill() {
	cmd, exited := r.state()
	_ = cmd.Process.Kill()
	<-exited
	r.log.Close()
}

// stop ends the process with SIGTERM (a clean shutdown gives its leases back), then SIGKILL.
func (r *replica) stop() {
	cmd, exited := r.state()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
	default:
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			fmt.Fprintf(os.Stderr, "replica %d did not stop within 15s of SIGTERM; killing it\n", r.i)
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	r.client.CloseIdleConnections()
	r.log.Close()
}

// alive reports whether the process is still running.
func (r *replica) alive() bool {
	_, exited := r.state()
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// leaseUnits reads ratelimit_dynamodb_lease_units_total by outcome from the replica's /metrics.
func (r *replica) leaseUnits(ctx context.Context) (map[string]float64, error) {
	page, err := r.metrics(ctx)
	if err != nil {
		return nil, err
	}
	return parseLeaseUnits(page), nil
}

// storeCalls reads ratelimit_store_requests_total by op from the replica's /metrics: how often
// each kind of write (refund: a rejected group's give-backs) was sent.
func (r *replica) storeCalls(ctx context.Context) (map[string]float64, error) {
	page, err := r.metrics(ctx)
	if err != nil {
		return nil, err
	}
	return parseSamples(page, "ratelimit_store_requests_total", "op"), nil
}

func (r *replica) metrics(ctx context.Context) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.admin+"/metrics", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("replica %d metrics: %w", r.i, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, fmt.Errorf("replica %d metrics: %w", r.i, err)
	}
	return body, nil
}

// parseLeaseUnits picks the samples of ratelimit_dynamodb_lease_units_total{outcome="..."}.
func parseLeaseUnits(page []byte) map[string]float64 {
	return parseSamples(page, "ratelimit_dynamodb_lease_units_total", "outcome")
}

// parseSamples sums the samples of metric by the value of label.
func parseSamples(page []byte, metric, label string) map[string]float64 {
	name := metric + "{"
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(page))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(name):], "} ")
		if !ok {
			continue
		}
		for _, l := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(l, "="); ok && k == label {
				if f, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
					out[strings.Trim(v, `"`)] += f
				}
			}
		}
	}
	return out
}

// outstanding is leased − spent − refunded − expired: units neither spent nor accounted for.
func outstanding(u map[string]float64) float64 {
	return u["leased"] - u["spent"] - u["refunded"] - u["expired"]
}
