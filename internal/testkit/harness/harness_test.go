package harness

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"
)

func TestFreeAddrsAreDistinct(t *testing.T) {
	addrs, err := FreeAddrs(64)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice in one call", a)
		}
		seen[a] = true
	}
}

func TestWaitReady(t *testing.T) {
	ready := make(chan struct{})
	url, stop, err := Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	exited := make(chan struct{})
	close(exited)
	if err := WaitReady(context.Background(), url, exited, time.Minute); !errors.Is(err, ErrExited) {
		t.Errorf("not ready, exited: %v, want ErrExited", err)
	}
	if err := WaitReady(context.Background(), url, nil, 100*time.Millisecond); err == nil {
		t.Error("never ready: nil, want an error after the limit")
	}
	close(ready)
	if err := WaitReady(context.Background(), url, nil, time.Minute); err != nil {
		t.Errorf("ready: %v", err)
	}
}
