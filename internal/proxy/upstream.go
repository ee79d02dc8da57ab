package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
)

// Protocol is the HTTP version the gateway speaks to the upstream (config upstream_protocol).
type Protocol uint8

const (
	// HTTP1 speaks HTTP/1.1 to the upstream, whatever the client spoke. It is the zero value.
	HTTP1 Protocol = iota
	// H2C speaks HTTP/2 to the upstream: cleartext with prior knowledge to an http:// upstream,
	// h2 negotiated by ALPN to an https:// one (an upstream that does not offer h2 fails).
	H2C
	// Auto speaks HTTP/2 (as H2C) when the client's request came in over HTTP/2, else HTTP/1.1.
	Auto
)

// ParseProtocol parses a value of upstream_protocol: http1, h2c or auto.
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "http1", "":
		return HTTP1, nil
	case "h2c":
		return H2C, nil
	case "auto":
		return Auto, nil
	}
	return HTTP1, fmt.Errorf("proxy: upstream protocol %q: want http1, h2c or auto", s)
}

// NewTransport returns the default HTTP/1.1 upstream transport, tuned for a sidecar that
// multiplexes many concurrent clients onto one upstream:
//
//   - a keep-alive pool sized for concurrency (MaxIdleConns 1024, MaxIdleConnsPerHost 512; the
//     default of 2 per host means a new connection for most requests under load);
//   - IdleConnTimeout 90s and a 5s dial timeout;
//   - HTTP/1.1 only: upstreams of a sidecar are usually local plain-HTTP services, and one
//     HTTP/2 connection would serialise every client behind one TCP window (NewTransportFor
//     gives HTTP/2 where upstream_protocol asks for it);
//   - ResponseHeaderTimeout = responseHeaderTimeout (0: none): a stalled upstream answers 504
//     instead of holding the client; it ends when the headers arrive, so streams and slow
//     bodies are never cut by it;
//   - no proxy from the environment: a sidecar talks to its upstream directly.
func NewTransport(responseHeaderTimeout time.Duration) *http.Transport {
	t := baseTransport(responseHeaderTimeout)
	t.Protocols = new(http.Protocols)
	t.Protocols.SetHTTP1(true)
	return t
}

// NewH2Transport returns an upstream transport that speaks only HTTP/2: h2c with prior
// knowledge to http:// URLs and h2 (ALPN) to https:// ones. Besides NewTransport's settings it
// pings a connection that has been silent for 30s and drops it when the ping is not answered
// within 15s, so long-lived streams over a dead upstream connection fail instead of hanging.
// Streams beyond the upstream's concurrency limit open another connection rather than queue.
func NewH2Transport(responseHeaderTimeout time.Duration) *http.Transport {
	t := baseTransport(responseHeaderTimeout)
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	t.Protocols.SetHTTP2(true)
	t.HTTP2 = &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 15 * time.Second}
	return t
}

// NewTransportFor returns the upstream transport for p: NewTransport for HTTP1, NewH2Transport
// for H2C, and for Auto one that sends each request with the protocol major version it came in
// with (ReverseProxy's outbound request keeps the inbound ProtoMajor).
func NewTransportFor(p Protocol, responseHeaderTimeout time.Duration) http.RoundTripper {
	switch p {
	case H2C:
		return NewH2Transport(responseHeaderTimeout)
	case Auto:
		return byProto{h1: NewTransport(responseHeaderTimeout), h2: NewH2Transport(responseHeaderTimeout)}
	default:
		return NewTransport(responseHeaderTimeout)
	}
}

func baseTransport(responseHeaderTimeout time.Duration) *http.Transport {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext:           dialer.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
		ResponseHeaderTimeout: responseHeaderTimeout,
	}
}

// byProto is upstream_protocol auto: HTTP/2 requests go out over h2, the others over HTTP/1.1.
type byProto struct{ h1, h2 http.RoundTripper }

func (t byProto) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.ProtoMajor == 2 {
		return t.h2.RoundTrip(r)
	}
	return t.h1.RoundTrip(r)
}

// newReverseProxy builds the forwarding half of the handler.
func (h *Handler) newReverseProxy(upstream *url.URL, rt http.RoundTripper) *httputil.ReverseProxy {
	errLog, _ := zap.NewStdLogAt(h.log.Named("reverseproxy"), zapcore.WarnLevel) // only fails for invalid levels
	// Copy errors of a tunnel or a response name the client's connection too.
	errLog = ScrubLog(errLog, h.pseudonyms)
	return &httputil.ReverseProxy{
		Rewrite:      func(pr *httputil.ProxyRequest) { rewrite(pr, upstream) },
		Transport:    timedTransport{next: rt, hist: h.m.upstreamDuration, aborted: h.m.upstreamErr[upAborted]},
		ErrorHandler: h.upstreamError,
		// A 101 only for a forwarded Upgrade (see hopbyhop.go).
		ModifyResponse: checkSwitch,
		ErrorLog:       errLog,
		BufferPool:     copyBuffers{},
		// FlushInterval 0: ReverseProxy already flushes text/event-stream and responses of
		// unknown length after every write, which is what streaming clients need.
	}
}

// rewrite points the outbound request at the upstream and sets the forwarding headers.
//
// Host: pr.SetURL makes the outbound Host the upstream's, which is what virtual-hosted upstreams
// and TLS SNI expect; the client's Host travels in X-Forwarded-Host.
//
// ReverseProxy has already removed the inbound X-Forwarded-* headers from the outbound request.
// Whether the direct peer is a trusted proxy (per the request's policy set) is decided once, and
// only when the request carries one of them: for anyone else the client could forge them.
//   - X-Forwarded-For: a trusted peer's list is kept and the peer appended, as SetXForwarded
//     would; otherwise it is replaced by the peer.
//   - X-Forwarded-Proto: a trusted peer's value is kept when it is exactly one line saying http
//     or https (any case, surrounding spaces ignored; forwarded in lower case), so that an
//     upstream behind a TLS-terminating load balancer sees https; otherwise it is the scheme
//     of the connection to us.
//   - X-Forwarded-Host: a trusted peer's value is kept when it is exactly one non-empty line
//     (trimmed); otherwise it is the client's Host.
func rewrite(pr *httputil.ProxyRequest, upstream *url.URL) {
	pr.SetURL(upstream)
	in := pr.In.Header
	xff, xfp, xfh := in["X-Forwarded-For"], in["X-Forwarded-Proto"], in["X-Forwarded-Host"]
	host, _, err := net.SplitHostPort(pr.In.RemoteAddr)
	trusted := err == nil && len(xff)+len(xfp)+len(xfh) > 0 && trustedPeer(pr.In, host)

	vals := make([]string, 2) // one allocation for both header values
	vals[0] = pr.In.Host
	if trusted && len(xfh) == 1 {
		if v := strings.TrimSpace(xfh[0]); v != "" {
			vals[0] = v
		}
	}
	pr.Out.Header["X-Forwarded-Host"] = vals[0:1:1]
	if err == nil {
		vals[1] = host
		if trusted && len(xff) > 0 {
			vals[1] = strings.Join(xff, ", ") + ", " + host
		}
		pr.Out.Header["X-Forwarded-For"] = vals[1:2:2]
	}
	proto := protoHTTP
	if pr.In.TLS != nil {
		proto = protoHTTPS
	}
	if trusted && len(xfp) == 1 {
		switch v := strings.TrimSpace(xfp[0]); {
		case strings.EqualFold(v, "https"):
			proto = protoHTTPS
		case strings.EqualFold(v, "http"):
			proto = protoHTTP
		}
	}
	// The shared slices have capacity 1, so an Add on the outbound header copies instead of
	// writing into them.
	pr.Out.Header["X-Forwarded-Proto"] = proto
}

var (
	protoHTTP  = []string{"http"}
	protoHTTPS = []string{"https"}
)

// trustedPeer asks the request's own policy set whether host (the direct peer) is trusted.
func trustedPeer(r *http.Request, host string) bool {
	pols, ok := r.Context().Value(policiesKey{}).(Policies)
	if !ok {
		return false
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	return pols.Trusted(addr.Unmap())
}

// upstreamError answers a request the upstream did not answer. A client that went away gets
// nothing (there is nobody to read it); a client whose body failed gets 400 or 408 (see
// clientError); a timeout gets 504; everything else 502.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	var body *clientBody // the error handler gets the outbound request, whose body is wrapped
	if fw, ok := w.(*forwardWriter); ok {
		body = fw.body
	}
	if errors.Is(r.Context().Err(), context.Canceled) {
		if body != nil && !errors.Is(body.result(), io.EOF) {
			// The body had not ended: send tells a body cut off at server.read_timeout (a
			// client still there) from a client that left, once the body says which.
			return
		}
		h.m.canceled[stageUpstream].Inc()
		return
	}
	if body != nil {
		// A failed body fails the forward too, whatever error the transport made of it: the
		// client's doing, answered and counted as such.
		if berr := body.result(); berr != nil {
			if reason, ok := bodyFault(berr); ok {
				h.clientError(w, r, reason, berr)
				return
			}
		}
	}
	reason := classifyUpstream(err)
	if undelivered(err) {
		gatewayAnswers(w, fateUndelivered)
	} else {
		gatewayAnswers(w, fateUnanswered)
	}
	h.m.upstreamErr[reason].Inc()
	// Transport errors name the upstream, not the client; url.Error (if a custom Transport
	// returns one) would add the request URL and its query, which may hold credentials.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if ce := h.log.Check(zap.WarnLevel, "upstream error"); ce != nil {
		ce.Write(zap.String("reason", upstreamReasonNames[reason]),
			zap.String("protocol", protocolNames[protocolOf(r, isGRPC(r))]), zap.Error(err))
	}
	if reason == upTimeout {
		writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemTimeout, Status: http.StatusGatewayTimeout,
			Detail: "The upstream did not answer in time."})
		return
	}
	writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemBadGateway, Status: http.StatusBadGateway,
		Detail: "The upstream could not be reached."})
}

// classifyUpstream maps a transport error onto the fixed reason set of the metric.
func classifyUpstream(err error) int {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return upTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return upRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return upReset
	default:
		return upOther
	}
}

// timedTransport observes the time until response headers (RoundTrip returns then; the body
// streams afterwards), and counts responses whose body the upstream cut off: ReverseProxy only
// logs those and aborts the client's connection, so without this they would not be counted.
type timedTransport struct {
	next    http.RoundTripper
	hist    prometheus.Observer
	aborted prometheus.Counter
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	res, err := t.next.RoundTrip(r)
	if err != nil {
		return res, err
	}
	t.hist.Observe(time.Since(start).Seconds())
	// A 101's body is the upgraded connection, which ReverseProxy needs as an
	// io.ReadWriteCloser: it is not wrapped.
	if res.Body != nil && res.Body != http.NoBody && res.StatusCode != http.StatusSwitchingProtocols {
		res.Body = &upstreamBody{ReadCloser: res.Body, ctx: r.Context(), aborted: t.aborted}
	}
	return res, nil
}

// upstreamBody counts, once, a response body that ends in an error while the client is still
// there. When the client leaves, the outbound request's context is canceled and the read fails
// too; that is the client's doing and is counted as a cancellation elsewhere.
type upstreamBody struct {
	io.ReadCloser
	ctx     context.Context
	aborted prometheus.Counter
	counted bool // Read is called from one goroutine (ReverseProxy's copy loop)
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !b.counted && b.ctx.Err() == nil {
		b.counted = true
		b.aborted.Inc()
	}
	return n, err
}

// copyBufSize is ReverseProxy's own copy buffer size.
const copyBufSize = 32 << 10

var copyBufPool = sync.Pool{New: func() any { return new([copyBufSize]byte) }}

// copyBuffers lends ReverseProxy its body-copy buffers from a pool instead of allocating 32 KiB
// per request. Arrays are pooled by pointer so Put does not allocate.
type copyBuffers struct{}

func (copyBuffers) Get() []byte { return copyBufPool.Get().(*[copyBufSize]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if len(b) == copyBufSize {
		copyBufPool.Put((*[copyBufSize]byte)(b))
	}
}
