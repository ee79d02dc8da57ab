package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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
	return &httputil.ReverseProxy{
		Rewrite:      func(pr *httputil.ProxyRequest) { rewrite(pr, upstream) },
		Transport:    timedTransport{next: rt, hist: h.m.upstreamDuration, aborted: h.m.upstreamErr[upAborted]},
		ErrorHandler: h.upstreamError,
		ErrorLog:     errLog,
		BufferPool:   copyBuffers{},
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
		if body != nil && body.result() != io.EOF {
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
		writeAnswer(w, r, nil, problem{Type: problemTimeout, Status: http.StatusGatewayTimeout,
			Detail: "The upstream did not answer in time."})
		return
	}
	writeAnswer(w, r, nil, problem{Type: problemBadGateway, Status: http.StatusBadGateway,
		Detail: "The upstream could not be reached."})
}

// forwardFate is what became of a request handed to the reverse proxy, as far as the upstream
// is concerned. It decides whether a charge_on reservation may be given back.
type forwardFate uint8

const (
	// fateNone: the request was not forwarded (the gateway answered it itself, or the client
	// left before its turn in a leaky bucket). The zero value.
	fateNone forwardFate = iota
	// fateForwarded: handed to the upstream, which has not answered (yet). A request that ends
	// so was abandoned by its client while the upstream worked on it.
	fateForwarded
	// fateAnswered: the upstream sent its answer's status.
	fateAnswered
	// fateUnanswered: the upstream may have received the request but did not answer it (a
	// timeout, a reset), or the client's body failed: the gateway answered itself.
	fateUnanswered
	// fateUndelivered: the request never reached the upstream (its connection could not be
	// made); the gateway answered 502.
	fateUndelivered
)

// refundable reports whether a charge_on reservation may be given back when the answer is not
// listed: when the answer that counts is the upstream's own (fateAnswered), or when the upstream
// never saw the request (fateNone, fateUndelivered), whose answer is then the gateway's. A
// request that may have reached the upstream and got no answer from it keeps its charge, since
// the upstream may have done the work that charge_on guards (checked a password, counted a
// lockout, sent an SMS): otherwise a client could hang up before every answer and never pay.
func (f forwardFate) refundable() bool {
	return f == fateNone || f == fateAnswered || f == fateUndelivered
}

// forwardWriter is the writer the reverse proxy answers a forwarded request through. It records
// whether a final answer was written, and whether the upstream's answer arrived (fateAnswered,
// its status written) or the gateway answered itself, which the error handler marks before it
// writes. Unwrap keeps http.ResponseController (flushes, hijacks) working through it.
type forwardWriter struct {
	http.ResponseWriter
	fate  forwardFate
	wrote bool        // a final status (or a body) was written
	body  *clientBody // the request's body, nil without one: for the error handler
}

func (w *forwardWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.wrote = true
		if w.fate == fateForwarded {
			w.fate = fateAnswered
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *forwardWriter) Write(b []byte) (int, error) {
	w.wrote = true
	if w.fate == fateForwarded {
		w.fate = fateAnswered
	}
	return w.ResponseWriter.Write(b)
}

func (w *forwardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over for a protocol switch: the reverse proxy writes the
// upstream's 101 to it past WriteHeader, so the upstream's answer is recorded here.
func (w *forwardWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.wrote = true
		if w.fate == fateForwarded {
			w.fate = fateAnswered
		}
	}
	return c, brw, err
}

// gatewayAnswers marks the answer about to be written as the gateway's own, with the fate f.
// w is the writer the reverse proxy handed its error handler: a *forwardWriter when the request
// went through send.
func gatewayAnswers(w http.ResponseWriter, f forwardFate) {
	if fw, ok := w.(*forwardWriter); ok && fw.fate == fateForwarded {
		fw.fate = f
	}
}

// problemBadBody is the problem type of a 400 for a request body that broke its framing.
const problemBadBody = problemBase + "malformed-body"

// bodySettle bounds how long send waits for a body read that is failing to say how it failed,
// once the request's context has ended: net/http cancels the context from inside the failing
// Read (a read timeout, a closed connection), a moment before that Read returns.
const bodySettle = time.Second

// send hands r to the reverse proxy rp through st.fw, which records the forward's fate, and r's
// body (if any) through a clientBody, which records how reading it ended: a forward that fails
// because the client's body failed is the client's fault (see clientError), not the upstream's.
func (h *Handler) send(w http.ResponseWriter, r *http.Request, st *reqState, rp *httputil.ReverseProxy) {
	st.fw = forwardWriter{ResponseWriter: w, fate: fateForwarded}
	// Cleared also when the reverse proxy aborts the response with a panic: the pool must not
	// keep the response or the body alive. The fate stays for giveBack.
	defer func() { st.fw.ResponseWriter, st.fw.body = nil, nil }()
	if r.Body == nil || r.Body == http.NoBody {
		rp.ServeHTTP(&st.fw, r)
		return
	}
	body := &clientBody{ReadCloser: r.Body}
	r.Body = body
	st.fw.body = body
	rp.ServeHTTP(&st.fw, r)
	if st.fw.wrote || r.Context().Err() == nil {
		return
	}
	// The context ended while the body was being read, and the error handler left the answer
	// to us (upstreamError). Over HTTP/1.1, server.read_timeout cutting a slow body off also
	// cancels the context, so the reverse proxy took it for a client that left and wrote
	// nothing, and net/http would then send an empty 200: the client is still there and owed
	// a 408. Told apart from a client that left by the body's own error.
	err := body.result()
	if err == io.EOF {
		return // read to its end: a client that left, counted by upstreamError
	}
	if err == nil {
		err = body.settle(bodySettle)
	}
	if reason, ok := bodyFault(err); ok && reason == clientBodyTimeout {
		h.clientError(w, r, reason, err)
		return
	}
	// The client left mid-upload (its connection closed, its stream reset) or the body was
	// not being read when it did. Nobody to answer; but a client that only closed its half of
	// the connection still reads, and an empty 200 would tell it the upload went through.
	h.m.canceled[stageUpstream].Inc()
	gatewayAnswers(&st.fw, fateUnanswered)
	if err != nil {
		w.Header().Set("Connection", "close")
		writeAnswer(w, r, nil, problem{Type: problemBadBody, Status: http.StatusBadRequest,
			Detail: "The request body ended before its end."})
	}
}

// clientError answers a forwarded request whose body failed by the client's doing, with err
// the body's error: 408 when it was too slow, 400 when it broke its framing. It is counted in
// ratelimit_client_errors_total, never as an upstream error: a client can produce it at will,
// and it must page nobody.
func (h *Handler) clientError(w http.ResponseWriter, r *http.Request, reason int, err error) {
	h.m.clientErr[reason].Inc()
	gatewayAnswers(w, fateUnanswered)
	if ce := h.log.Check(zap.InfoLevel, "client body failed"); ce != nil {
		ce.Write(zap.String("reason", clientReasonNames[reason]),
			zap.String("protocol", protocolNames[protocolOf(r, isGRPC(r))]), zap.Error(err))
	}
	if r.ProtoMajor == 1 {
		// The rest of the body, if any, is still on the connection: it cannot carry another
		// request. (HTTP/2 resets only the stream; its connection serves on.)
		w.Header().Set("Connection", "close")
	}
	if reason == clientBodyTimeout {
		h.m.bodyTimeouts.Inc()
		writeAnswer(w, r, nil, problem{Type: problemBodyTimeout, Status: http.StatusRequestTimeout,
			Detail: "The request body was not received in full in time."})
		return
	}
	writeAnswer(w, r, nil, problem{Type: problemBadBody, Status: http.StatusBadRequest,
		Detail: "The request body is malformed or incomplete."})
}

// clientBody is a forwarded request's body. It records how reading it ended, so that a failed
// forward is put down to the client when its body failed, however the transport reports that
// (the reverse proxy's error handler only sees the transport's error, and an h2c upstream
// transport reports a body that timed out as its own timeout). Read is called by the
// transport's writer goroutine; result and settle by the handler. The transport never closes
// it (the reverse proxy hands the transport a wrapper whose Close does nothing), so every read
// error is the client's or its connection's, except a read after net/http closed the body
// once the handler returned.
type clientBody struct {
	io.ReadCloser
	mu   sync.Mutex
	err  error         // the first read error; io.EOF: read to its end
	wake chan struct{} // made by settle, closed when err is set
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, http.ErrBodyReadAfterClose) {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
			if b.wake != nil {
				close(b.wake)
			}
		}
		b.mu.Unlock()
	}
	return n, err
}

// result is how reading the body ended: io.EOF when read to its end, another error when it
// failed, nil while it has not ended (or only the transport's Close ended it).
func (b *clientBody) result() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// settle waits up to d for reading the body to end and returns result.
func (b *clientBody) settle(d time.Duration) error {
	b.mu.Lock()
	if b.err != nil {
		defer b.mu.Unlock()
		return b.err
	}
	if b.wake == nil {
		b.wake = make(chan struct{})
	}
	wake := b.wake
	b.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C:
	}
	return b.result()
}

// bodyFault maps how a client's body ended onto a client error reason; ok is false for a body
// read to its end (io.EOF) or not ended (nil). A timeout is server.read_timeout: HTTP/1.1 sets
// it as the connection's read deadline, HTTP/2 as a per-stream timer that fails the body with
// os.ErrDeadlineExceeded. Anything else broke the body's framing or cut it short.
func bodyFault(err error) (reason int, ok bool) {
	if err == nil || err == io.EOF {
		return 0, false
	}
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return clientBodyTimeout, true
	}
	return clientBodyMalformed, true
}

// statusWriter records the status of the answer: the first final status written (a 101 for a
// protocol upgrade counts: it is the answer of a WebSocket request), or 200 for a body written
// without one; 0 while nothing was. Unwrap keeps http.ResponseController working through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over for a protocol switch (WebSocket): the reverse proxy then
// writes the upstream's 101 to the connection itself, past WriteHeader, so the switch is
// recorded here. http.ResponseController finds this method before Unwrap.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, brw, err
}

// undelivered reports whether a transport error means that the request never reached the
// upstream: the connection to it could not be made (refused, no route, a dial timeout).
// Anything later (TLS, a reset, a timeout waiting for the answer) may have followed a request
// the upstream received.
func undelivered(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
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
