package dynamo_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
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
	api, err := dynamolocal.NewClient(context.Background(), "http://"+ln.Addr().String())
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

// TestClientKeepsMaxAttemptsOverEnvironment: AWS_MAX_ATTEMPTS in the environment does not
// replace the client's two attempts per idempotent call: a server that always answers 500 sees
// exactly two requests. (A pin: with config v1.33 the loader ignores the variable when a retryer is given,
// and NewClient also sets the client's own RetryMaxAttempts, which would otherwise override it.)
func TestClientKeepsMaxAttemptsOverEnvironment(t *testing.T) {
	t.Setenv("AWS_MAX_ATTEMPTS", "5")
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`)
	}))
	defer srv.Close()
	api, err := dynamolocal.NewClient(context.Background(), srv.URL)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	s := dynamo.New(api, dynamo.Options{Table: "t"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A read: the SDK re-sends idempotent calls (a charge is sent once, see TestWritesSafeToResend).
	if err := s.Warm(ctx, 1); err == nil {
		t.Fatalf("Warm against a failing server: got no error, want one")
	}
	if got := hits.Load(); got != 2 {
		t.Errorf("requests for one call with AWS_MAX_ATTEMPTS=5: got %d, want 2", got)
	}
}
