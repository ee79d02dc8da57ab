package e2e

// End-to-end tests of issue 26's items 9 and 10: HTTP/2 requests that claim to be gRPC stay
// bounded by a body timeout, and the server's own error lines carry no client address.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stalledCall sends, over h2c, a POST whose content-type says gRPC and whose body sends five
// bytes and then, every gap, another byte until `more` were sent; then it ends the body when
// end is set, else stalls until the test ends. It returns the answer's HTTP status,
// grpc-status and body, or an error when none came before the client gave up (20 s).
func stalledCall(t *testing.T, url string, more int, gap time.Duration, end bool) (int, string, string, error) {
	t.Helper()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	go func() {
		if _, err := pw.Write([]byte{0, 0, 0, 0, 9}); err != nil {
			return
		}
		for i := 0; i < more; i++ {
			time.Sleep(gap) // a client that keeps its stream alive, message by message
			if _, err := pw.Write([]byte{1}); err != nil {
				return
			}
		}
		if end {
			pw.Close()
		}
	}()
	req, _ := http.NewRequest("POST", url+"/pkg.Svc/Upload", pr)
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := h2cClient().Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	gs := resp.Header.Get("Grpc-Status")
	if gs == "" {
		gs = resp.Trailer.Get("Grpc-Status")
	}
	return resp.StatusCode, gs, string(body), nil
}

// TestSidestep2GRPCClaimBounded (issue 26 item 9): a client that adds content-type
// application/grpc to a request on a gateway whose upstream is not gRPC (upstream_protocol
// http1, no grpc_routes) is bounded by read_timeout like any request; where gRPC calls are
// forwarded, a stalled body is cut at server.grpc_idle_timeout, while a stream that keeps
// sending lasts past it.
func TestSidestep2GRPCClaimBounded(t *testing.T) {
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("Grpc-Status", "0")
		fmt.Fprintf(w, "%d", n)
	})
	t.Run("not a gRPC upstream", func(t *testing.T) {
		g := startGateway(t, up.URL, "server: {read_timeout: 1s}\n"+ipPolicy)
		code, gs, _, err := stalledCall(t, g.proxy, 0, 0, false)
		if err != nil {
			t.Fatalf("a stalled body claiming gRPC: no answer (%v); want it cut at read_timeout (1s)", err)
		}
		if code != http.StatusRequestTimeout && gs != "4" {
			t.Errorf("a stalled body claiming gRPC: got %d grpc-status %q, want 408 or DEADLINE_EXCEEDED", code, gs)
		}
	})
	t.Run("gRPC upstream", func(t *testing.T) {
		g := startGateway(t, up.URL, "upstream_protocol: h2c\nserver: {grpc_idle_timeout: 2s}\n"+ipPolicy)
		code, gs, _, err := stalledCall(t, g.proxy, 0, 0, false)
		if err != nil {
			t.Fatalf("a stalled gRPC body: no answer (%v); want it cut at grpc_idle_timeout (2s)", err)
		}
		if gs != "4" {
			t.Errorf("a stalled gRPC body: got %d grpc-status %q, want DEADLINE_EXCEEDED", code, gs)
		}
		// 15 messages 200ms apart (3s, past the idle timeout of 2s): never idle for 2s, so
		// the upstream gets all 20 bytes and answers.
		code, gs, body, err := stalledCall(t, g.proxy, 15, 200*time.Millisecond, true)
		if err != nil || gs != "0" || body != "20" {
			t.Errorf("a gRPC body that sends for 3s: got %d grpc-status %q body %q %v, want the upstream's answer: 20 bytes, grpc-status 0", code, gs, body, err)
		}
	})
}

// TestLeakNoClientAddressInLogs (issue 26 item 10): an attack run from 127.0.0.23 (a body cut
// off at read_timeout, a broken HTTP/2 connection, failed TLS handshakes) leaves lines in the
// log, and not one of them carries the client's address.
func TestLeakNoClientAddressInLogs(t *testing.T) {
	const client = "127.0.0.23"
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(client)}}
	dial := func(addr string) net.Conn {
		t.Helper()
		c, err := dialer.Dial("tcp", strings.TrimPrefix(addr, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(15 * time.Second))
		return c
	}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	g := startGateway(t, up.URL, "server: {read_timeout: 1s}\nlog: {level: debug}\n"+ipPolicy)

	// A body that stalls: cut at read_timeout, logged as "client body failed".
	c := dial(g.proxy)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: g\r\nContent-Length: 100\r\n\r\nonly ten..")
	b, _ := io.ReadAll(c)
	c.Close()
	if !strings.Contains(string(b), " 408 ") {
		t.Errorf("a stalled body: got %q, want a 408", b)
	}
	// A broken HTTP/2 connection: the preface, then a DATA frame on stream 0.
	c = dial(g.proxy)
	io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00junk!")
	io.ReadAll(c)
	c.Close()

	ca := newTestCA(t, "leak-ca")
	tg, _, _ := tlsGateway(t, ca, up.URL, "", "log: {level: debug}\n"+ipPolicy)
	for _, junk := range []string{"", "\x16\x03\x01\x00\x05hello", "garbage that is no TLS"} {
		c = dial(tg.proxy)
		io.WriteString(c, junk)
		if cw, ok := c.(*net.TCPConn); ok {
			cw.CloseWrite()
		}
		io.ReadAll(c)
		c.Close()
	}
	// A real handshake from the client's address still works (and is logged nowhere).
	tc, err := tls.DialWithDialer(dialer, "tcp", strings.TrimPrefix(tg.proxy, "http://"), &tls.Config{InsecureSkipVerify: true})
	if err == nil {
		tc.Close()
	}

	eventually(t, "the attack's log lines", func() bool {
		return strings.Contains(g.logs.String(), "client body failed") && strings.Contains(tg.logs.String(), "TLS handshake error")
	})
	for name, logs := range map[string]string{"plain": g.logs.String(), "tls": tg.logs.String()} {
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, client) {
				t.Errorf("%s gateway log line carries the client's address %s: %s", name, client, line)
			}
		}
	}
}

// TestLeakNoClientAddressInGRPCLogs (issue 26 item 10): grpc-go writes its own log (grpclog)
// straight to stderr, and at GRPC_GO_LOG_SEVERITY_LEVEL=info a failed TLS handshake on the RLS
// port is logged with the client's address (`ServerHandshake("A") failed`). The gateway routes
// grpclog into its JSON log (logger "grpc"), through the pseudonymiser, at the severity
// grpc-go's own variables ask for.
func TestLeakNoClientAddressInGRPCLogs(t *testing.T) {
	const client = "127.0.0.23"
	ca := newTestCA(t, "grpclog-ca")
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "e2e.yaml"), []byte(rlsRules), 0o600); err != nil {
		t.Fatal(err)
	}
	rlsAddr := freePort(t)
	g, _, _ := tlsGateway(t, ca, newUpstream(t, nil).URL, "", fmt.Sprintf("%s\nrls:\n  listen: %s\n  config_dir: %s\n", ipPolicy, rlsAddr, rules),
		"GRPC_GO_LOG_SEVERITY_LEVEL=info", "GRPC_GO_LOG_VERBOSITY_LEVEL=2")
	dialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(client)}}
	for _, junk := range []string{"garbage that is no TLS", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"} {
		c, err := dialer.Dial("tcp", rlsAddr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, junk)
		c.(*net.TCPConn).CloseWrite()
		io.ReadAll(c)
		c.Close()
	}
	eventually(t, "grpc-go's line about the failed handshake", func() bool {
		return strings.Contains(g.logs.String(), "failed to create ServerTransport")
	})
	for _, line := range strings.Split(g.logs.String(), "\n") {
		if strings.Contains(line, client) {
			t.Errorf("log line carries the client's address %s: %s", client, line)
		}
		if strings.Contains(line, "ServerTransport") && !strings.Contains(line, `"logger":"grpc"`) {
			t.Errorf("grpc-go's line is not in the JSON log (logger grpc): %s", line)
		}
	}
}

// TestRLSSilentConnectionClosed: a connection to the RLS port that never completes its
// handshake (no TLS, no HTTP/2 preface) is closed after server.read_header_timeout, as the
// proxy's is, instead of grpc-go's default of 120 s: an idle flood cannot hold sockets.
func TestRLSSilentConnectionClosed(t *testing.T) {
	rules := t.TempDir()
	if err := os.WriteFile(filepath.Join(rules, "e2e.yaml"), []byte(rlsRules), 0o600); err != nil {
		t.Fatal(err)
	}
	rlsAddr := freePort(t)
	startGateway(t, newUpstream(t, nil).URL, fmt.Sprintf("server: {read_header_timeout: 300ms}\n%s\nrls:\n  listen: %s\n  config_dir: %s\n", ipPolicy, rlsAddr, rules))
	c, err := net.Dial("tcp", rlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(10 * time.Second)) // the bound of a failing run, not a wait
	_, err = io.ReadAll(c)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a silent connection was still open after %v, want it closed after read_header_timeout (300ms)", time.Since(start).Round(time.Millisecond))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("closed after %v, want about read_header_timeout", took)
	}
}
