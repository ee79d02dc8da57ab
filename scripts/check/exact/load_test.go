package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestLoadRequestsAreNeverResent: a server that reads a request and drops its connection
// without answering, as a SIGKILLed replica does. Go's transport re-sends a plain GET on a
// fresh connection (the control: the server sees it twice); the load's requests reach it once.
func TestLoadRequestsAreNeverResent(t *testing.T) {
	var mu sync.Mutex
	arrivals := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Check-Id")
		mu.Lock()
		arrivals[id]++
		n := arrivals[id]
		mu.Unlock()
		if id != "warm" && n == 1 {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = c.Close() // read, never answered
			}
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		req  func(id string) *http.Request
		want int
	}{
		{"plain GET", func(string) *http.Request { r, _ := http.NewRequest(http.MethodGet, srv.URL, nil); return r }, 2},
		{"loadRequest GET", func(string) *http.Request { return loadRequest(http.MethodGet, srv.URL) }, 1},
		{"loadRequest POST", func(string) *http.Request { return loadRequest(http.MethodPost, srv.URL) }, 1},
	} {
		client := newClient()
		// A first request leaves a connection in the pool: only a reused one is retried.
		warm := tc.req("warm")
		warm.Header.Set("X-Check-Id", "warm")
		res, err := client.Do(warm)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(res.Body) // read to its end, or the connection is not reused
		res.Body.Close()
		req := tc.req(tc.name)
		req.Header.Set("X-Check-Id", tc.name)
		if res, err := client.Do(req); err == nil {
			res.Body.Close()
		}
		mu.Lock()
		got := arrivals[tc.name]
		delete(arrivals, "warm")
		mu.Unlock()
		if got != tc.want {
			t.Errorf("%s: the server saw it %d times, want %d", tc.name, got, tc.want)
		}
		client.CloseIdleConnections()
	}
}
