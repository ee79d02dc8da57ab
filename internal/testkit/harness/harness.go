// Package harness runs gateway processes for the harnesses.
//
// It is what the benchmark and check harnesses under scripts/ share to run gateway
// processes on loopback: free addresses, a loopback HTTP server, waiting for a process to be
// ready, and the numbers their flags read from the environment.
//
// It is support code for scripts/, not part of the gateway: nothing under cmd/ratelimit-proxy's
// non-test files imports it.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// FreeAddrs returns n distinct free loopback addresses. Their listeners stay open until all n are
// chosen, so that the kernel cannot hand one port out twice; each is free only until the process
// it is meant for binds it.
func FreeAddrs(n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

// Serve serves h on a free loopback port and returns its URL and a function that shuts it down.
func Serve(h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// ErrExited is WaitReady's error when the process exited first.
var ErrExited = errors.New("exited before it was ready")

// WaitReady polls url (a readiness endpoint) until it answers 200, exited is closed (ErrExited),
// ctx ends or limit has passed: polling a process, with a deadline.
func WaitReady(ctx context.Context, url string, exited <-chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return ErrExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", limit)
		}
	}
}

// Atoi, Atof and Dur read a flag's default from the environment. A value that does not parse
// becomes -1, which the harness's own checks then refuse, naming the flag.
func Atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// Atof: see Atoi.
func Atof(s string) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return -1
	}
	return f
}

// Dur: see Atoi.
func Dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		return -1
	}
	return d
}
