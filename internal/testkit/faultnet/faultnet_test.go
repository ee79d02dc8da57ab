package faultnet

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newProxy(t *testing.T, body string) *Proxy {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	p, err := New(strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// fetch does one request on a fresh connection and returns the body or the error.
func fetch(t *testing.T, p *Proxy, timeout time.Duration) (string, error) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout}
	resp, err := c.Get("http://" + p.Addr() + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestFaults(t *testing.T) {
	body := strings.Repeat("x", 100_000)
	p := newProxy(t, body)

	if got, err := fetch(t, p, 5*time.Second); err != nil || got != body {
		t.Fatalf("pass: got %d bytes, %v; want %d bytes", len(got), err, len(body))
	}

	p.Set(Fault{Mode: Reset})
	if _, err := fetch(t, p, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("reset: got error %v, want a connection reset", err)
	}

	p.Set(Fault{Mode: ResetAfter, After: 1000})
	if got, err := fetch(t, p, 5*time.Second); err == nil {
		t.Errorf("reset-after: got %d bytes and no error, want a truncated answer", len(got))
	}

	p.Set(Fault{Mode: Stall})
	start := time.Now()
	if _, err := fetch(t, p, 200*time.Millisecond); err == nil {
		t.Error("stall: got an answer, want a client timeout")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("stall: failed after %v, want it to hang until the 200ms client timeout", d)
	}

	p.Set(Fault{Delay: 150 * time.Millisecond})
	start = time.Now()
	if got, err := fetch(t, p, 5*time.Second); err != nil || got != body {
		t.Errorf("delay: got %d bytes, %v", len(got), err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("delay: answered after %v, want at least 150ms", d)
	}

	p.Set(Fault{})
	p.Refuse()
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("refuse: dial got %v, want connection refused", err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	if got, err := fetch(t, p, 5*time.Second); err != nil || got != body {
		t.Errorf("after Listen: got %d bytes, %v", len(got), err)
	}
	if got := p.Accepted(); got != 6 {
		t.Errorf("Accepted got %d, want 6", got)
	}
}
