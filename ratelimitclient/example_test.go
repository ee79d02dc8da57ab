package ratelimitclient_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/ratelimitclient"
)

// A client that is told to come back later does so, after the server's floor plus jitter.
func Example() {
	// A stand-in for the gateway: the first request is over the limit.
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0") // the gateway sends whole seconds, at least 1
			http.Error(w, "over the limit", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "hello")
	}))
	defer srv.Close()

	rt, err := ratelimitclient.New(ratelimitclient.Options{
		MaxAttempts: 4,
		BaseDelay:   20 * time.Millisecond, // jitter window of the first retry: [0, 20ms)
	})
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: rt}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%s %s", resp.Status, body)
	fmt.Println("requests the server saw:", calls.Load())
	// Output:
	// 200 OK hello
	// requests the server saw: 2
}

// When the server's wait would outlast the request's deadline, the caller gets the 429 at once
// instead of an error at the deadline.
func Example_deadline() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		http.Error(w, "over the limit", http.StatusTooManyRequests)
	}))
	defer srv.Close()

	client := &http.Client{Transport: &ratelimitclient.Transport{}} // the zero Transport: defaults
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		log.Fatal(err)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status, "Retry-After:", resp.Header.Get("Retry-After"))
	fmt.Println("answered before the deadline:", time.Since(start) < 5*time.Second)
	// Output:
	// 429 Too Many Requests Retry-After: 30
	// answered before the deadline: true
}

func ExampleRetryDelay() {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	h := http.Header{}
	h.Set("RateLimit", `"per-ip";r=0;t=3, "per-key";r=12;t=60`)
	fmt.Println(ratelimitclient.RetryDelay(h, now))

	h.Set("Retry-After", "1") // Retry-After comes first
	fmt.Println(ratelimitclient.RetryDelay(h, now))

	h.Set("Retry-After", "Wed, 02 Jan 2030 03:05:00 GMT")
	fmt.Println(ratelimitclient.RetryDelay(h, now))

	fmt.Println(ratelimitclient.RetryDelay(http.Header{}, now))
	// Output:
	// 3s true
	// 1s true
	// 55s true
	// 0s false
}
