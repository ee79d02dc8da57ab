package dynamo_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// TestClientHonoursDeadline points the real SDK client at a server that accepts connections and
// never answers: the decision ends at its context deadline with the context's error, however the
// retryer is set up.
func TestClientHonoursDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	api, err := newLocalClient("http://" + ln.Addr().String())
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	r := make([]bucket.Result, 1)
	start := time.Now()
	admitted, err := s.Take(ctx, t0, []bucket.Charge{{Key: newKey(t), Limit: allAlgorithms[0]}}, r)
	elapsed := time.Since(start)
	if admitted || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got admitted=%v err=%v, want false and context.DeadlineExceeded", admitted, err)
	}
	if elapsed > time.Second {
		t.Errorf("returned after %v, want about the 50ms deadline", elapsed)
	}
}
