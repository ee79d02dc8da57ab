package proxy

// The forward's bookkeeping: what became of a request handed to the upstream (its fate, which
// decides charge_on refunds), and how its body ended (a body the client broke is the client's
// fault, never the upstream's).

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
)

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

// forwardWriter is the one writer a request's answer goes through when something must be known
// about it (st.writer installs it, once per request): the access log's and the give-backs'
// status, a forward's fate and write stall bound, the protection's latency sample. It records
// the status of the answer: the first final status written (a 101 for a protocol upgrade
// counts: it is the answer of a WebSocket request), or 200 for a body written without one; and
// for a forwarded request whether the upstream's answer arrived (fateAnswered) or the gateway
// answered itself, which the error handler marks before it writes. Unwrap keeps
// http.ResponseController (flushes, deadlines) working through it; Hijack is its own.
type forwardWriter struct {
	http.ResponseWriter
	status int // 0 while nothing final was written
	fate   forwardFate
	h2     bool        // the request came over HTTP/2: see arm
	body   *clientBody // the request's body, nil without one: for the error handler
	// stall is server.write_stall_timeout while forwarding (0: none, or the writer has no
	// deadlines): every write and flush must go through within it (see stallWrite).
	stall time.Duration
	// timed: first records when the answer began (its status, a body, or a protocol switch),
	// the protection's latency sample, which a long stream's duration must not inflate.
	timed bool
	first time.Time
}

// answered records that an answer with this status began.
func (w *forwardWriter) answered(status int) {
	if w.status == 0 {
		w.status = status
		if w.timed {
			w.first = time.Now()
		}
	}
	if w.fate == fateForwarded {
		w.fate = fateAnswered
	}
}

func (w *forwardWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.answered(code)
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *forwardWriter) Write(b []byte) (int, error) {
	w.answered(http.StatusOK)
	if w.stall > 0 {
		return w.stallWrite(b)
	}
	return w.ResponseWriter.Write(b)
}

// stallChunk is the most one write hands on under one deadline: a client that reads, however
// slowly, takes a piece this size within write_stall_timeout, or it has stopped (at the
// default 30s, a client reading under 550 bytes a second is cut).
const stallChunk = 16 << 10

// stallWrite is Write under server.write_stall_timeout: each piece of b (stallChunk at most)
// must go through within it, so an answer whose client stopped reading fails its write
// within the timeout (and the reverse proxy ends the request, freeing its slot), while one
// being read, however long it lasts or stays silent between writes, goes on.
func (w *forwardWriter) stallWrite(b []byte) (n int, err error) {
	for len(b) > 0 {
		piece := b[:min(len(b), stallChunk)]
		w.arm()
		m, err := w.ResponseWriter.Write(piece)
		n += m
		if err != nil {
			w.disarm()
			return n, err
		}
		b = b[m:]
	}
	w.disarm()
	return n, nil
}

// arm sets the write deadline for the next write or flush. A writer without deadlines (a test
// recorder) turns the bound off for the rest of the request.
func (w *forwardWriter) arm() {
	if err := http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.stall)); err != nil {
		w.stall = 0
	}
}

// disarm clears an HTTP/2 stream's write deadline after a write went through: there it is a
// timer that resets the stream when it fires, even with no write pending, which would cut a
// stream that is silent between messages. An HTTP/1.1 deadline stays: it fails only a write
// still (or newly) in progress past it, every later write arms its own, and it also covers
// what net/http writes after the handler returns (the rest of its buffer, the chunked end).
func (w *forwardWriter) disarm() {
	if w.h2 && w.stall > 0 {
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Time{})
	}
}

// FlushError flushes under the write deadline (see stallWrite); http.ResponseController finds
// it before Unwrap.
func (w *forwardWriter) FlushError() error {
	if w.stall == 0 {
		return http.NewResponseController(w.ResponseWriter).Flush()
	}
	w.arm()
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.disarm()
	return err
}

func (w *forwardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the connection over for a protocol switch: the reverse proxy writes the
// upstream's 101 to it past WriteHeader, so the upstream's answer is recorded here. The
// connection's write deadline is cleared first: a tunnel's writes are its own business.
func (w *forwardWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.stall > 0 {
		_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Time{})
	}
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.answered(http.StatusSwitchingProtocols)
	}
	return c, brw, err
}

// writer returns the request's one forwardWriter around w: w itself when it is that writer
// already, else st.fw made anew around w.
func (st *reqState) writer(w http.ResponseWriter) *forwardWriter {
	if fw, ok := w.(*forwardWriter); ok && fw == &st.fw {
		return fw
	}
	st.fw = forwardWriter{ResponseWriter: w}
	return &st.fw
}

// gatewayAnswers marks the answer about to be written as the gateway's own, with the fate f.
// w is the writer the reverse proxy handed its error handler: a *forwardWriter when the request
// went through send.
func gatewayAnswers(w http.ResponseWriter, f forwardFate) {
	if fw, ok := w.(*forwardWriter); ok && fw.fate == fateForwarded {
		fw.fate = f
	}
}

// bodySettle bounds how long send waits for a body read that is failing to say how it failed,
// once the request's context has ended: net/http cancels the context from inside the failing
// Read (a read timeout, a closed connection), a moment before that Read returns.
const bodySettle = time.Second

// send hands r to the reverse proxy rp through st.fw (st.writer), which records the forward's fate, and r's
// body (if any) through a clientBody, which records how reading it ended: a forward that fails
// because the client's body failed is the client's fault (see clientError), not the upstream's.
func (h *Handler) send(w http.ResponseWriter, r *http.Request, st *reqState, rp *httputil.ReverseProxy) {
	fw := st.writer(w)
	fw.fate, fw.stall, fw.h2 = fateForwarded, h.stall, r.ProtoMajor == 2
	if fw.stall > 0 && !fw.h2 {
		// What net/http writes once the handler returns (the rest of its buffer, the chunked
		// end) is bounded too. (ServeHTTP lets go of the writer and the body when the request
		// ends, also when the reverse proxy aborts the response with a panic.)
		defer fw.arm()
	}
	if r.Body == nil || r.Body == http.NoBody {
		rp.ServeHTTP(fw, r)
		return
	}
	body, ok := r.Body.(*clientBody) // sendGuarded's, stamping the body's end
	if !ok {
		body = &clientBody{ReadCloser: r.Body}
		r.Body = body
	}
	fw.body = body
	rp.ServeHTTP(fw, r)
	if fw.status != 0 || r.Context().Err() == nil {
		return
	}
	// The context ended while the body was being read, and the error handler left the answer
	// to us (upstreamError). Over HTTP/1.1, server.read_timeout cutting a slow body off also
	// cancels the context, so the reverse proxy took it for a client that left and wrote
	// nothing, and net/http would then send an empty 200: the client is still there and owed
	// a 408. Told apart from a client that left by the body's own error.
	err := body.result()
	if errors.Is(err, io.EOF) {
		return // read to its end: a client that left, counted by upstreamError
	}
	if err == nil {
		err = body.settle(bodySettle)
	}
	if reason, ok := bodyFault(err); ok && reason == clientBodyTimeout {
		h.clientError(fw, r, reason, err)
		return
	}
	// The client left mid-upload (its connection closed, its stream reset) or the body was
	// not being read when it did. Nobody to answer; but a client that only closed its half of
	// the connection still reads, and an empty 200 would tell it the upload went through.
	h.m.canceled[stageUpstream].Inc()
	gatewayAnswers(fw, fateUnanswered)
	if err != nil {
		fw.Header().Set("Connection", "close")
		writeAnswer(fw, r, nil, answer.Problem{Type: answer.ProblemBadBody, Status: http.StatusBadRequest,
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
			zap.String("protocol", protocolNames[protocolOf(r, isGRPC(r))]), h.clientErrField(err))
	}
	if r.ProtoMajor == 1 {
		// The rest of the body, if any, is still on the connection: it cannot carry another
		// request. (HTTP/2 resets only the stream; its connection serves on.)
		w.Header().Set("Connection", "close")
	}
	if reason == clientBodyTimeout {
		h.m.bodyTimeouts.Inc()
		writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemBodyTimeout, Status: http.StatusRequestTimeout,
			Detail: "The request body was not received in full in time."})
		return
	}
	writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemBadBody, Status: http.StatusBadRequest,
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
	stamp bool // record when the body ended (ended), for the upstream's latency
	mu    sync.Mutex
	err   error         // the first read error; io.EOF: read to its end
	wake  chan struct{} // made by settle, closed when err is set
	ended time.Time     // with stamp, when Read returned io.EOF
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, http.ErrBodyReadAfterClose) {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
			if b.stamp && err == io.EOF {
				b.ended = time.Now()
			}
			if b.wake != nil {
				close(b.wake)
			}
		}
		b.mu.Unlock()
	}
	return n, err
}

// endedAt is when the body was read to its end (with stamp), zero while it has not (or when it
// failed).
func (b *clientBody) endedAt() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ended
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
	if err == nil || errors.Is(err, io.EOF) {
		return 0, false
	}
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return clientBodyTimeout, true
	}
	return clientBodyMalformed, true
}

// undelivered reports whether a transport error means that the request never reached the
// upstream: the connection to it could not be made (refused, no route, a dial timeout).
// Anything later (TLS, a reset, a timeout waiting for the answer) may have followed a request
// the upstream received.
func undelivered(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
