// Package redislocal starts Debian's redis-server for tests: one node, a 3-node cluster or a
// primary with a replica and a Sentinel.
//
// Tests use the nodes that scripts/test.sh exports (REDIS_URL, REDIS_CLUSTER_ADDRS), or, without
// them, nodes started with scripts/redis.sh in a temporary state directory of their own and
// stopped again. Starting a node takes a fraction of a second, so every test binary that needs
// one may start its own. It is support code for tests and benchmarks, never imported by the
// gateway.
package redislocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The variables scripts/test.sh exports: a single node's URL and a cluster's seed addresses
// (host:port, comma-separated).
const (
	URLVar     = "REDIS_URL"
	ClusterVar = "REDIS_CLUSTER_ADDRS"
)

// scriptPath is the script that installs, starts and stops the nodes, relative to the
// repository root.
const scriptPath = "scripts/redis.sh"

// Mode is what Start starts.
type Mode string

// The modes of scripts/redis.sh start.
const (
	Single   Mode = "single"
	Cluster  Mode = "cluster"
	Sentinel Mode = "sentinel"
)

// StartTimeout bounds a start (installing redis-server with apt-get on first use included).
const StartTimeout = 3 * time.Minute

// Instance is a set of running nodes. A nil *Instance is valid: Stop does nothing.
type Instance struct {
	// URLs are the nodes' redis://127.0.0.1:PORT, in the script's order: one for Single; the
	// three primaries for Cluster; the primary, the replica and the Sentinel for Sentinel.
	URLs []string

	stateDir   string // empty when nothing was started here
	removeDir  bool
	stopCalled bool
}

// Addrs returns the nodes' host:port.
func (i *Instance) Addrs() []string {
	out := make([]string, len(i.URLs))
	for k, u := range i.URLs {
		out[k] = strings.TrimPrefix(u, "redis://")
	}
	return out
}

// Find returns the nodes of mode that tests use: those the environment names (Single:
// REDIS_URL; Cluster: REDIS_CLUSTER_ADDRS), else nodes it starts in a fresh temporary state
// directory, which Stop stops and removes. Sentinel is always started here (a test that fails the
// primary over must own it).
func Find(ctx context.Context, mode Mode) (*Instance, error) {
	switch mode {
	case Single:
		if u := os.Getenv(URLVar); u != "" {
			return &Instance{URLs: []string{u}}, nil
		}
	case Cluster:
		if a := os.Getenv(ClusterVar); a != "" {
			inst := &Instance{}
			for _, s := range strings.Split(a, ",") {
				inst.URLs = append(inst.URLs, "redis://"+strings.TrimSpace(s))
			}
			return inst, nil
		}
	}
	dir, err := os.MkdirTemp("", "redis-local-")
	if err != nil {
		return nil, fmt.Errorf("redis local: state directory: %w", err)
	}
	inst, err := Start(ctx, dir, mode)
	if inst != nil {
		inst.removeDir = true
	} else {
		_ = os.RemoveAll(dir)
	}
	return inst, err
}

// Start starts the nodes of mode with scripts/redis.sh, keeping their files in stateDir. It
// stops first whatever an earlier run left there. On a failed start the returned Instance is not
// nil when a process may have been left behind: Stop it.
func Start(ctx context.Context, stateDir string, mode Mode) (*Instance, error) {
	script, err := Script()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("redis local: state directory: %w", err)
	}
	inst := &Instance{stateDir: stateDir}
	if err := inst.run(script, "stop"); err != nil {
		return inst, err
	}
	cmd := exec.CommandContext(ctx, script, "start", string(mode))
	// The nodes die with this process even if it never calls Stop (a test that panics).
	cmd.Env = append(inst.env(), "REDIS_LOCAL_OWNER_PID="+strconv.Itoa(os.Getpid()))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return inst, fmt.Errorf("%s start %s: %w: %s", scriptPath, mode, err, strings.TrimSpace(stderr.String()))
	}
	inst.URLs = strings.Fields(string(out))
	return inst, nil
}

// Stop stops what Start or Find started (and removes Find's state directory); for nodes that
// were already running it does nothing. A second Stop does nothing.
func (i *Instance) Stop() error {
	if i == nil || i.stateDir == "" || i.stopCalled {
		return nil
	}
	i.stopCalled = true
	script, err := Script()
	if err == nil {
		err = i.run(script, "stop")
	}
	if i.removeDir {
		if rerr := os.RemoveAll(i.stateDir); rerr != nil && err == nil {
			err = fmt.Errorf("redis local: remove state directory: %w", rerr)
		}
	}
	return err
}

// PID returns the process id of the node of the script's name (node0, cluster0..2, primary,
// replica, sentinel0), 0 when unknown.
func (i *Instance) PID(node string) int {
	if i == nil || i.stateDir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(i.stateDir, node, "pid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// Kill ends a node with SIGKILL (a crash: no shutdown, nothing saved). It fails for nodes this
// Instance did not start.
func (i *Instance) Kill(node string) error {
	pid := i.PID(node)
	if pid == 0 {
		return fmt.Errorf("redis local: no node %s started here", node)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("redis local: kill %s: %w", node, err)
	}
	return nil
}

// Restart starts a node that Kill ended again, on its port, from its configuration (without
// persistence it starts empty), and waits until it answers PING within ctx.
func (i *Instance) Restart(ctx context.Context, node string) error {
	if i == nil || i.stateDir == "" {
		return fmt.Errorf("redis local: no node %s started here", node)
	}
	dir := filepath.Join(i.stateDir, node)
	conf := filepath.Join(dir, "redis.conf")
	if _, err := os.Stat(conf); err != nil {
		return fmt.Errorf("redis local: restart %s: %w", node, err)
	}
	// The killed process must be gone first, or its port is still taken.
	for old := i.PID(node); old != 0 && syscall.Kill(old, 0) == nil; {
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis local: restart %s: pid %d still running: %w", node, old, ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling its end, bounded by ctx
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redis local: restart %s: %w", node, err)
	}
	defer logf.Close()
	bin := "redis-server"
	if b := os.Getenv("REDIS_SERVER_BIN"); b != "" { // scripts/redis.sh's server, e.g. valkey-server
		bin = b
	}
	cmd := exec.Command(bin, conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redis local: restart %s: %w", node, err)
	}
	go func() { _ = cmd.Wait() }() // reaped when it ends; Stop ends it by its pid file
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("redis local: restart %s: %w", node, err)
	}
	port, err := os.ReadFile(filepath.Join(dir, "port"))
	if err != nil {
		return fmt.Errorf("redis local: restart %s: %w", node, err)
	}
	addr := "127.0.0.1:" + strings.TrimSpace(string(port))
	for {
		if pingOK(addr) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis local: restart %s: no answer on %s: %w", node, addr, ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling the restarted node, bounded by ctx
		}
	}
}

// pingOK reports whether addr answers PING with PONG.
func pingOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	b := make([]byte, 7)
	n, _ := c.Read(b)
	return string(b[:n]) == "+PONG\r\n"
}

func (i *Instance) run(script, arg string) error {
	cmd := exec.Command(script, arg)
	cmd.Env = i.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", scriptPath, arg, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (i *Instance) env() []string {
	return append(os.Environ(), "REDIS_LOCAL_STATE_DIR="+i.stateDir)
}

// Lazy is one test binary's nodes of one mode: found on the first Get, stopped by Stop at the
// end of TestMain. The zero value needs Mode set; Get is safe for concurrent use.
type Lazy struct {
	Mode Mode

	once sync.Once
	inst *Instance
	err  error
}

// Get returns the instance, finding it on the first call; every call returns the same answer.
func (l *Lazy) Get() (*Instance, error) {
	l.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
		defer cancel()
		mode := l.Mode
		if mode == "" {
			mode = Single
		}
		l.inst, l.err = Find(ctx, mode)
	})
	return l.inst, l.err
}

// Stop stops what Get started, if anything; call it after m.Run in TestMain.
func (l *Lazy) Stop() {
	if err := l.inst.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

// Script returns the absolute path of scripts/redis.sh, looked for in the working directory and
// its parents.
func Script() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("redis local: %w", err)
	}
	for dir := wd; ; {
		p := filepath.Join(dir, filepath.FromSlash(scriptPath))
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("redis local: " + scriptPath + " not found in " + wd + " or any parent")
		}
		dir = parent
	}
}
