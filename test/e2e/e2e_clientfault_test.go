package e2e

// End-to-end tests of client faults: a request body that is malformed, incomplete or too slow is
// the client's doing, answered 400 or 408 and counted as a client error over HTTP/1.1 and
// HTTP/2 alike, never as an upstream error (which pages the on-call).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// wantNoUpstreamErrors fails when any ratelimit_upstream_errors_total series is not 0.
func wantNoUpstreamErrors(t *testing.T, admin string) {
	t.Helper()
	for _, r := range []string{"refused", "timeout", "reset", "other", "aborted"} {
		if got := metric(t, admin, fmt.Sprintf(`ratelimit_upstream_errors_total{reason=%q}`, r)); got != 0 {
			t.Errorf("ratelimit_upstream_errors_total{reason=%q} got %v, want 0: a client's body is not an upstream error", r, got)
		}
	}
}

// h2Status sends one request over a raw h2c connection: HEADERS with the given header fields,
// then DATA frames of data (the last with END_STREAM when end is set; otherwise the stream stays
// open), and returns the response's :status and body. The connection must be answered within
// limit.
func h2Status(t *testing.T, proxyURL string, fields [][2]string, data []byte, end bool, limit time.Duration) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(proxyURL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(limit))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range append([][2]string{{":method", "POST"}, {":scheme", "http"},
		{":authority", strings.TrimPrefix(proxyURL, "http://")}, {":path", "/upload"}}, fields...) {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteData(1, end, data); err != nil {
		t.Fatal(err)
	}
	status := 0
	var body bytes.Buffer
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			fmt.Sscan(f.Value, &status)
		}
	})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer (status %d so far, body %q): %v", status, body.String(), err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			if f.StreamID != 1 {
				continue
			}
			if _, err := dec.Write(f.HeaderBlockFragment()); err != nil {
				t.Fatal(err)
			}
			if f.StreamEnded() {
				return status, body.String()
			}
		case *http2.DataFrame:
			if f.StreamID != 1 {
				continue
			}
			body.Write(f.Data())
			if f.StreamEnded() {
				return status, body.String()
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("stream reset (%v) after status %d, body %q; want a complete answer", f.ErrCode, status, body.String())
		case *http2.GoAwayFrame:
			if status == 0 {
				t.Fatalf("GOAWAY (%v) before an answer", f.ErrCode)
			}
		}
	}
}

// TestClientBodyFaultsAreClientErrors sends bodies that fail in every way a client can make
// them fail, over HTTP/1.1 and HTTP/2, to a gateway in front of an upstream that reads them: each
// gets 400 (malformed or incomplete) or 408 (too slow, cut off at server.read_timeout) as
// problem+json, counted in ratelimit_client_errors_total, none as an upstream error.
func TestClientBodyFaultsAreClientErrors(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	})
	g := startGateway(t, up.URL, "server:\n  read_timeout: 1s\n"+countingPolicy)
	clientErrors := func(reason string) float64 {
		return metric(t, g.admin, fmt.Sprintf(`ratelimit_client_errors_total{reason=%q}`, reason))
	}

	t.Run("HTTP/2 body that never ends", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.proxy+"/upload", pr)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _, _ = pw.Write([]byte("the start of a body")) }()
		start := time.Now()
		resp, err := h2cClient().Do(req)
		if err != nil {
			t.Fatalf("h2 request with a body that never ends: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), `"status":408`) {
			t.Errorf("got %d %q, want a 408 problem", resp.StatusCode, body)
		}
		if took := time.Since(start); took < 900*time.Millisecond {
			t.Errorf("answered after %v, before server.read_timeout (1s)", took)
		}
		eventually(t, "the h2 body timeout counted", func() bool { return clientErrors("body_timeout") == 1 })
		wantNoUpstreamErrors(t, g.admin)
	})

	t.Run("HTTP/2 body shorter than its content-length", func(t *testing.T) {
		status, body := h2Status(t, g.proxy, [][2]string{{"content-length", "10"}}, []byte("12345"), true, 10*time.Second)
		if status != http.StatusBadRequest || !strings.Contains(body, `"status":400`) {
			t.Errorf("got %d %q, want a 400 problem", status, body)
		}
		eventually(t, "the h2 incomplete body counted", func() bool { return clientErrors("body_malformed") == 1 })
		wantNoUpstreamErrors(t, g.admin)
	})

	t.Run("HTTP/1.1 bad chunked encoding", func(t *testing.T) {
		c := dialRaw(t, g.proxy)
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nnot a chunk\r\n0\r\n\r\n")
		_, reply := closedWithin(t, c, time.Now(), 10*time.Second)
		if !strings.HasPrefix(reply, "HTTP/1.1 400 ") || !strings.Contains(reply, `"status":400`) {
			t.Errorf("got %q, want a 400 problem", reply)
		}
		eventually(t, "the bad chunk counted", func() bool { return clientErrors("body_malformed") == 2 })
		wantNoUpstreamErrors(t, g.admin)
	})

	t.Run("HTTP/1.1 body that stops", func(t *testing.T) {
		c := dialRaw(t, g.proxy)
		fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly this")
		_, reply := closedWithin(t, c, time.Now(), 10*time.Second)
		if !strings.HasPrefix(reply, "HTTP/1.1 408 ") || !strings.Contains(reply, `"status":408`) {
			t.Errorf("got %q, want a 408 problem", reply)
		}
		eventually(t, "the h1 body timeout counted", func() bool { return clientErrors("body_timeout") == 2 })
		wantNoUpstreamErrors(t, g.admin)
	})

	// None of them was a client that left: each was answered.
	if got := metric(t, g.admin, `ratelimit_client_canceled_total{stage="upstream"}`); got != 0 {
		t.Errorf(`ratelimit_client_canceled_total{stage="upstream"} got %v, want 0`, got)
	}
}

// TestClientBodyTimeoutH2CUpstream: with HTTP/2 to the upstream too, the transport that reads
// the stalled body is the h2c one, which reports the body's timeout as its own failure: still
// the client's 408, not the upstream's 504.
func TestClientBodyTimeoutH2CUpstream(t *testing.T) {
	up := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	})
	g := startGateway(t, up.URL, "upstream_protocol: h2c\nserver:\n  read_timeout: 1s\n"+countingPolicy)
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.proxy+"/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = pw.Write([]byte("the start of a body")) }()
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatalf("h2 request with a body that never ends: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("got %d %q, want a 408 problem", resp.StatusCode, body)
	}
	eventually(t, "the body timeout counted", func() bool {
		return metric(t, g.admin, `ratelimit_client_errors_total{reason="body_timeout"}`) == 1
	})
	wantNoUpstreamErrors(t, g.admin)
}
