package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
)

func TestBodyFault(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason int
		ok     bool
	}{
		{nil, 0, false},
		{io.EOF, 0, false},
		{fmt.Errorf("%w", os.ErrDeadlineExceeded), clientBodyTimeout, true}, // HTTP/2 read timeout
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, clientBodyTimeout, true},
		{errors.New("invalid byte in chunk length"), clientBodyMalformed, true},
		{io.ErrUnexpectedEOF, clientBodyMalformed, true},
		{errors.New("request declared a Content-Length of 10 but only wrote 5 bytes"), clientBodyMalformed, true},
	} {
		reason, ok := bodyFault(tc.err)
		if reason != tc.reason || ok != tc.ok {
			t.Errorf("bodyFault(%v) = %d, %v; want %d, %v", tc.err, reason, ok, tc.reason, tc.ok)
		}
	}
}

// settle returns the body's error as soon as a Read records it, and nil after its bound when
// none does.
func TestClientBodySettle(t *testing.T) {
	pr, pw := io.Pipe()
	b := &clientBody{ReadCloser: pr}
	go func() { _, _ = io.Copy(io.Discard, b) }()
	want := errors.New("broken")
	go pw.CloseWithError(want)
	if got := b.settle(time.Minute); !errors.Is(got, want) {
		t.Errorf("settle = %v, want %v", got, want)
	}
	idle := &clientBody{ReadCloser: io.NopCloser(strings.NewReader(""))}
	if got := idle.settle(time.Millisecond); got != nil {
		t.Errorf("settle of a body nobody reads = %v, want nil", got)
	}
	_, _ = io.Copy(io.Discard, idle)
	if got := idle.result(); !errors.Is(got, io.EOF) {
		t.Errorf("result after reading to the end = %v, want io.EOF", got)
	}
}

// A body with broken chunked encoding fails the forward: the client's fault, answered 400 and
// counted as a client error, not a 502 upstream error.
func TestClientError_BadChunkedBody(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	})
	hs := newHarness(t, (&fakePolicies{}).add("p", false, 1), newFakeLimiter(true), up, nil)
	c, err := net.Dial("tcp", strings.TrimPrefix(hs.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
	reply, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(reply), "HTTP/1.1 400 ") || !strings.Contains(string(reply), answer.ProblemBadBody) {
		t.Errorf("got %q, want a 400 %s problem", reply, answer.ProblemBadBody)
	}
	hs.waitServed(1)
	wantCounter(t, hs.reg, 1, "ratelimit_client_errors_total", "reason", "body_malformed")
	wantCounter(t, hs.reg, 0, mUpstreamErrors, "reason", "other")
}
