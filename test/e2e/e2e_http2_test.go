package e2e

// End-to-end tests of HTTP/2: h2c on the proxy listener, upstream_protocol (http1, h2c, auto),
// h2 to https upstreams, trailers, bidirectional streaming and cancellation, through the real
// binary over real sockets.

import (
	"bufio"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// h2cClient speaks only HTTP/2 with prior knowledge, as gRPC clients do.
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}, Timeout: 20 * time.Second}
}

// h2cUpstream serves h on HTTP/1.1 and h2c.
func h2cUpstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.Config.Protocols = new(http.Protocols)
	s.Config.Protocols.SetHTTP1(true)
	s.Config.Protocols.SetUnencryptedHTTP2(true)
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// protoEcho answers with the protocol the upstream saw and a trailer.
func protoEcho(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Trailer", "X-Checksum")
	fmt.Fprintf(w, "upstream saw %s", r.Proto)
	w.Header().Set("X-Checksum", "c0ffee")
}

func doGet(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

func TestHTTP2H2CEndToEnd(t *testing.T) {
	up := h2cUpstream(t, protoEcho)
	g := startGateway(t, up.URL, "upstream_protocol: h2c\n"+ipPolicy)
	c := h2cClient()
	for i := 0; i < 3; i++ {
		resp, body := doGet(t, c, g.proxy+"/x")
		if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/2.0" {
			t.Fatalf("request %d: got %d over %s, want 200 over HTTP/2.0 (%s)", i, resp.StatusCode, resp.Proto, body)
		}
		if want := "upstream saw HTTP/2.0"; body != want {
			t.Errorf("request %d: got body %q, want %q", i, body, want)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != "c0ffee" {
			t.Errorf("request %d: trailer X-Checksum got %q, want c0ffee", i, got)
		}
		if got, want := resp.Header.Get("X-RateLimit-Remaining"), fmt.Sprint(2-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining got %q, want %q", i, got, want)
		}
	}
	// Each stream is one request to the limiter: the fourth is over the burst.
	resp, body := doGet(t, c, g.proxy+"/x")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("request 4: got %d (Retry-After %q), want 429 with Retry-After (%s)", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// curl, where present, speaks h2c with prior knowledge too.
	if curl, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command(curl, "-sS", "--http2-prior-knowledge", "-o", os.DevNull,
			"-w", "%{http_version} %{http_code}", g.proxy+"/x").CombinedOutput()
		if err != nil {
			t.Fatalf("curl: %v: %s", err, out)
		}
		if got, want := string(out), "2 429"; got != want {
			t.Errorf("curl --http2-prior-knowledge: got %q, want %q", got, want)
		}
	} else {
		t.Log("curl not found: the curl h2c check did not run")
	}
	for series, want := range map[string]float64{
		`ratelimit_protocol_decisions_total{protocol="http2",result="allowed"}`: 3,
		`ratelimit_protocol_decisions_total{protocol="http2",result="limited"}`: 2, // Go's and curl's
		`ratelimit_protocol_decisions_total{protocol="http1",result="limited"}`: 0,
	} {
		if got := metric(t, g.admin, series); got != want {
			t.Errorf("%s got %v, want %v", series, got, want)
		}
	}
	// HTTP/1.1 still works on the same port, and h2c to the upstream whatever the client spoke.
	up2 := h2cUpstream(t, protoEcho)
	g2 := startGateway(t, up2.URL, "upstream_protocol: h2c\n"+ipPolicy)
	resp, body = doGet(t, http.DefaultClient, g2.proxy+"/x")
	if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/1.1" || body != "upstream saw HTTP/2.0" {
		t.Errorf("HTTP/1.1 client: got %d over %s, body %q; want 200 over HTTP/1.1, upstream saw HTTP/2.0", resp.StatusCode, resp.Proto, body)
	}
}

func TestHTTP2UpstreamProtocolAuto(t *testing.T) {
	up := h2cUpstream(t, protoEcho)
	g := startGateway(t, up.URL, "upstream_protocol: auto\n"+lenientPolicy)
	for _, tc := range []struct {
		client *http.Client
		want   string
	}{
		{http.DefaultClient, "upstream saw HTTP/1.1"},
		{h2cClient(), "upstream saw HTTP/2.0"},
	} {
		resp, body := doGet(t, tc.client, g.proxy+"/x")
		if resp.StatusCode != http.StatusOK || body != tc.want {
			t.Errorf("client over %s: got %d %q, want 200 %q", resp.Proto, resp.StatusCode, body, tc.want)
		}
	}
	// The default stays HTTP/1.1 to the upstream.
	g2 := startGateway(t, up.URL, lenientPolicy)
	if _, body := doGet(t, h2cClient(), g2.proxy+"/x"); body != "upstream saw HTTP/1.1" {
		t.Errorf("default upstream_protocol, h2c client: got %q, want upstream saw HTTP/1.1", body)
	}
}

const lenientPolicy = `policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 1000/s
    burst: 1000
`

// TestHTTP2TLSUpstream: an https upstream gets h2 through ALPN when upstream_protocol asks for
// HTTP/2, and HTTP/1.1 otherwise. The gateway trusts the test upstream's certificate through
// SSL_CERT_FILE, as it would a private CA.
func TestHTTP2TLSUpstream(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(protoEcho))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, up.URL, "upstream_protocol: auto\n"+lenientPolicy, "SSL_CERT_FILE="+caFile)
	for _, tc := range []struct {
		client *http.Client
		want   string
	}{
		{http.DefaultClient, "upstream saw HTTP/1.1"},
		{h2cClient(), "upstream saw HTTP/2.0"},
	} {
		resp, body := doGet(t, tc.client, g.proxy+"/x")
		if resp.StatusCode != http.StatusOK || body != tc.want {
			t.Errorf("client over %s: got %d %q, want 200 %q", resp.Proto, resp.StatusCode, body, tc.want)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != "c0ffee" {
			t.Errorf("client over %s: trailer got %q, want c0ffee", resp.Proto, got)
		}
	}
}

// TestHTTP2BidiStreamAndCancel: request and response bodies stream both ways at once through
// the gateway, and a client that cancels its stream frees the upstream's stream.
func TestHTTP2BidiStreamAndCancel(t *testing.T) {
	canceled := make(chan struct{})
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			fmt.Fprintf(w, "echo %s\n", sc.Text())
			_ = rc.Flush()
		}
		<-r.Context().Done()
		close(canceled)
	})
	g := startGateway(t, up.URL, "upstream_protocol: h2c\n"+lenientPolicy)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.proxy+"/stream", pr)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Proto != "HTTP/2.0" {
		t.Fatalf("got %d over %s, want 200 over HTTP/2.0", resp.StatusCode, resp.Proto)
	}
	lines := bufio.NewReader(resp.Body)
	for i := range 3 {
		// Each echo must arrive before the next line is sent: nothing is buffered whole.
		if _, err := fmt.Fprintf(pw, "ping %d\n", i); err != nil {
			t.Fatal(err)
		}
		got, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
		if want := fmt.Sprintf("echo ping %d\n", i); got != want {
			t.Fatalf("echo %d: got %q, want %q", i, got, want)
		}
	}
	// Go's HTTP/2 client notices a canceled context only while it waits; with the request body
	// blocked in a Read, closing the response body is what resets the stream (RST_STREAM).
	cancel()
	resp.Body.Close()
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's stream was still open 10s after the client canceled")
	}
	if got := metric(t, g.admin, `ratelimit_requests_total{policy="per-ip",result="allowed"}`); got != 1 {
		t.Errorf("allowed charges: got %v, want 1 (one stream, one request)", got)
	}
}

// TestGRPCStreamOutlivesReadTimeout: a gRPC call's request body is its client stream, which may
// rightly last longer than server.read_timeout; the gateway lifts that timeout for gRPC calls
// over HTTP/2 (a plain HTTP/2 request keeps it). Streamed here as gRPC frames are: the body
// keeps flowing, paced, for longer than the read timeout.
func TestGRPCStreamOutlivesReadTimeout(t *testing.T) {
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() {
			fmt.Fprintf(w, "echo %s\n", sc.Text())
			_ = rc.Flush()
		}
	})
	g := startGateway(t, up.URL, "upstream_protocol: h2c\nserver:\n  read_timeout: 1s\n"+lenientPolicy)
	for _, tc := range []struct {
		contentType string
		wantAll     bool
	}{
		{"application/grpc", true},
		{"application/octet-stream", false},
	} {
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPost, g.proxy+"/pkg.Svc/Stream", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", tc.contentType)
		resp, err := h2cClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		lines := bufio.NewReader(resp.Body)
		got := 0
		start := time.Now()
		for i := 0; time.Since(start) < 1800*time.Millisecond; i++ {
			if _, err := fmt.Fprintf(pw, "ping %d\n", i); err != nil {
				break
			}
			if _, err := lines.ReadString('\n'); err != nil {
				break
			}
			got++
			time.Sleep(200 * time.Millisecond) // pacing the stream past read_timeout, not waiting for an event
		}
		pw.Close()
		resp.Body.Close()
		elapsed := time.Since(start)
		if tc.wantAll && elapsed < 1800*time.Millisecond {
			t.Errorf("%s: the stream ended after %v (%d echoes), want it to outlive read_timeout 1s", tc.contentType, elapsed, got)
		}
		if !tc.wantAll && elapsed >= 1800*time.Millisecond {
			t.Errorf("%s: the stream lasted %v (%d echoes), want read_timeout 1s to cut it", tc.contentType, elapsed, got)
		}
	}
}
