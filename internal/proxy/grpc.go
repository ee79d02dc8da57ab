package proxy

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// gRPC answers. A request whose content-type is application/grpc (or application/grpc+proto,
// +json, ...; see isGRPC) and that the gateway answers itself gets what a gRPC client can read:
// HTTP 200 and a trailers-only response (one HEADERS frame that ends the stream) with
// grpc-status and grpc-message, never a problem+json body, which no gRPC library would parse.
// The rate-limit headers travel as metadata beside them.
//
// Mapping of the gateway's own answers (HTTP status it would give -> gRPC code):
//
//	429 over a limit                  8 RESOURCE_EXHAUSTED, with google.rpc.RetryInfo
//	401 bad or missing credentials   16 UNAUTHENTICATED
//	503 store down (on_error deny)   14 UNAVAILABLE
//	502 upstream unreachable         14 UNAVAILABLE
//	504 upstream timeout              4 DEADLINE_EXCEEDED
//	408 request body cut off          4 DEADLINE_EXCEEDED
//	500 policies could not plan      13 INTERNAL
//	the call's grpc-timeout ran out   4 DEADLINE_EXCEEDED (while the gateway waited)

const (
	hdrGRPCStatus  = "Grpc-Status"
	hdrGRPCMessage = "Grpc-Message"
	hdrGRPCDetails = "Grpc-Status-Details-Bin"
)

// isGRPC reports whether r is a gRPC call: its content-type is application/grpc, alone or with
// a +subtype or parameters. gRPC-Web (application/grpc-web...) is not: its clients read the
// status from the body, so they get the HTTP answers.
func isGRPC(r *http.Request) bool {
	ct := r.Header["Content-Type"]
	if len(ct) != 1 {
		return false
	}
	const prefix = "application/grpc"
	v := ct[0]
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return false
	}
	return len(v) == len(prefix) || v[len(prefix)] == '+' || v[len(prefix)] == ';'
}

// grpcCode maps the HTTP status of a gateway answer to its gRPC code.
func grpcCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return codes.Unavailable
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		return codes.DeadlineExceeded
	default:
		return codes.Internal
	}
}

// grpcStatusValues are the grpc-status header values of codes 0 to 16, shared read-only.
var grpcStatusValues = func() (v [17][]string) {
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}[:1:1]
	}
	return v
}()

// writeGRPC writes a trailers-only gRPC answer: the content-type of the call, grpc-status and
// grpc-message (and grpc-status-details-bin when details is not nil) as headers of an HTTP 200
// without a body. net/http sends such a response as one HEADERS frame with END_STREAM, which is
// gRPC's trailers-only form. Headers already set (the rate-limit ones, Retry-After) go with it
// as metadata.
func writeGRPC(w http.ResponseWriter, r *http.Request, code codes.Code, msg []string, details []string) {
	h := w.Header()
	h[hdrContentType] = r.Header["Content-Type"]
	h[hdrGRPCStatus] = grpcStatusValues[code]
	h[hdrGRPCMessage] = msg
	if details != nil {
		h[hdrGRPCDetails] = details
	}
	w.WriteHeader(http.StatusOK)
}

// writeAnswer writes the gateway's own answer p: a gRPC status to a gRPC call, else problem+json.
// It returns buf for reuse.
func writeAnswer(w http.ResponseWriter, r *http.Request, buf []byte, p answer.Problem) []byte {
	if r != nil && isGRPC(r) {
		if p.RetryAfter > 0 {
			w.Header()[answer.HeaderRetryAfter] = answer.RetryAfter(p.RetryAfter)
		}
		writeGRPC(w, r, grpcCode(p.Status), []string{grpcMessage(p.Detail)}, nil)
		return buf
	}
	return answer.WriteProblem(w, buf, p)
}

// grpcRejection is a pre-rendered RESOURCE_EXHAUSTED of one policy, like rejection for HTTP.
type grpcRejection struct {
	typ              string
	retry            time.Duration // the RetryInfo delay, in whole milliseconds
	limit, reset     int64
	remaining        int64 // 0 unless a weighted call was refused with less than its cost left
	retryAfter       []string
	vals             [3]string // X-RateLimit-Limit, -Remaining, -Reset
	message, details []string
}

// newGRPCRejection renders the answer to a call over policy name's limit that may be retried
// after retry (RetryInfo, the message) or retrySecs whole seconds (Retry-After).
func newGRPCRejection(typ, name string, retry time.Duration, retrySecs, limit, reset, remaining int64) *grpcRejection {
	g := &grpcRejection{typ: typ, retry: retry, limit: limit, reset: reset, remaining: remaining, retryAfter: answer.RetryAfter(retrySecs)}
	g.vals = [3]string{strconv.FormatInt(limit, 10), strconv.FormatInt(remaining, 10), strconv.FormatInt(reset, 10)}
	var b strings.Builder
	if typ == answer.ProblemConcurrency {
		b.WriteString("Concurrency limit of policy \"")
	} else {
		b.WriteString("Rate limit of policy \"")
	}
	b.WriteString(name)
	// The message states the RetryInfo delay itself (one source for the wait a client reads);
	// only the retry-after metadata rounds it up to whole seconds, as the HTTP header does.
	b.WriteString("\" exceeded; retry after ")
	b.WriteString(retry.String())
	b.WriteString(".")
	msg := b.String()
	g.message = []string{grpcMessage(msg)}
	g.details = []string{retryDetails(msg, retry)}
	return g
}

// retryDetails is grpc-status-details-bin for RESOURCE_EXHAUSTED with a google.rpc.RetryInfo
// of delay: the serialized google.rpc.Status, base64 without padding as gRPC's -bin metadata
// is sent.
func retryDetails(msg string, delay time.Duration) string {
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	if err != nil {
		return "" // only for a detail that cannot be marshalled; RetryInfo always can
	}
	b, err := proto.Marshal(st.Proto())
	if err != nil {
		return ""
	}
	return base64.RawStdEncoding.EncodeToString(b)
}

// grpcRetryDelay is the RetryInfo delay for a wait: rounded up to whole milliseconds (so that a
// client retrying after it is never early, and renderings can be shared), at least 1ms.
func grpcRetryDelay(d time.Duration) time.Duration {
	if d <= time.Millisecond {
		return time.Millisecond
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// grpcMessage percent-encodes msg for grpc-message: every byte outside printable ASCII, and
// '%', as %XX (the gRPC over HTTP/2 spec).
func grpcMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// maxGRPCTimeout bounds a grpc-timeout: eight digits of hours is longer than any deadline
// time.Duration can hold.
const maxGRPCTimeout = time.Duration(1<<63 - 1)

// parseGRPCTimeout parses a grpc-timeout value: 1 to 8 digits and a unit, H M S m u n (the
// gRPC over HTTP/2 spec). ok is false for anything else, which is then ignored (as grpc-go's
// server does not: it fails the call; the upstream will say so).
func parseGRPCTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 || v[0] == '+' || v[0] == '-' {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	if n > int64(maxGRPCTimeout/unit) {
		return maxGRPCTimeout, true
	}
	return time.Duration(n) * unit, true
}

// grpcRoute reports whether r's path may carry gRPC calls (Options.GRPCRoutes): elsewhere a
// request that says application/grpc is an ordinary one, bounded by the server's read timeout.
func (h *Handler) grpcRoute(r *http.Request) bool {
	if h.grpcAll {
		return true
	}
	for _, p := range h.grpcAt {
		if strings.HasPrefix(r.URL.Path, p) {
			return true
		}
	}
	return false
}

// grpcDeadline prepares a gRPC call: its grpc-timeout becomes a deadline on the request's
// context, so that the gateway's own waits (store calls, a leaky-bucket hold) and the upstream
// call end when the caller gives up. Over HTTP/2 the stream's read deadline (server.read_timeout,
// which Go's HTTP/2 server applies to each stream's body) is replaced: a gRPC stream's body is
// the call's client stream, which may rightly last longer than any read timeout, but not stay
// silent for ever. With idle > 0 the body must bring data every idle (see idleBody), and never
// past the call's deadline; with idle 0 only the call's deadline bounds it. cancel must be
// called when the request is done.
func grpcDeadline(w http.ResponseWriter, r *http.Request, idle time.Duration) (*http.Request, context.CancelFunc) {
	var deadline time.Time
	cancel := context.CancelFunc(func() {})
	if v := r.Header["Grpc-Timeout"]; len(v) == 1 {
		if d, ok := parseGRPCTimeout(v[0]); ok {
			var ctx context.Context
			ctx, cancel = context.WithTimeout(r.Context(), d)
			r = r.WithContext(ctx)
			deadline, _ = ctx.Deadline()
		}
	}
	// Only on HTTP/2, where the deadline is the stream's own: on HTTP/1.1 it would be the
	// connection's (gRPC needs HTTP/2 anyway), and read_timeout stays. A ResponseWriter that
	// cannot (a test recorder) keeps the server's read timeout.
	if r.ProtoMajor != 2 {
		return r, cancel
	}
	rc := http.NewResponseController(w)
	if idle <= 0 || r.Body == nil || r.Body == http.NoBody {
		_ = rc.SetReadDeadline(deadline)
		return r, cancel
	}
	b := &idleBody{ReadCloser: r.Body, rc: rc, idle: idle, call: deadline}
	if rc.SetReadDeadline(b.next()) != nil {
		return r, cancel
	}
	r.Body = b
	return r, func() { b.stop(); cancel() }
}

// idleBody is the body of a gRPC call over HTTP/2 under server.grpc_idle_timeout: every read
// that brings data moves the stream's read deadline to idle from now (never past the call's
// own deadline), so a stream that keeps sending messages lasts as long as it likes, and one
// that stalls fails with a read timeout, answered DEADLINE_EXCEEDED (see clientError).
//
// The body outlives the handler: an upstream that answers before reading the whole body
// (Unimplemented does) ends the reverse proxy and the handler while the HTTP/2 transport's own
// goroutine still reads the body to send it. From then on the ResponseWriter is not the
// handler's to touch (Go's HTTP/2 server clears the stream's state: a data race), so stop,
// called as the handler returns, ends the deadline moves; the reads go on, bounded by the
// deadline last set.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	call time.Time // the call's deadline; zero: none

	mu      sync.Mutex
	stopped bool
}

// stop ends the deadline moves: the handler is returning.
func (b *idleBody) stop() {
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
}

func (b *idleBody) next() time.Time {
	d := time.Now().Add(b.idle)
	if !b.call.IsZero() && b.call.Before(d) {
		return b.call
	}
	return d
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && err == nil {
		b.mu.Lock()
		if !b.stopped {
			_ = b.rc.SetReadDeadline(b.next())
		}
		b.mu.Unlock()
	}
	return n, err
}

// rejectGRPC is reject for a gRPC call: RESOURCE_EXHAUSTED with the wait in a RetryInfo detail
// and the rate-limit headers as metadata. Like the HTTP 429, the policy's last rendering is
// reused while the numbers stay the same (here to the millisecond of the RetryInfo delay).
func (h *Handler) rejectGRPC(w http.ResponseWriter, r *http.Request, st *reqState, hc policy.Headers,
	pick int, ps *policyState, typ string, res bucket.Result, retrySecs int64) {
	name := st.plan.Policies[pick].Name
	delay := grpcRetryDelay(res.RetryAfter)
	if hc.IETF || ps == nil {
		st.buf = setRateLimitHeaders(w.Header(), st.buf[:0], hc, st, pick, res)
		g := newGRPCRejection(typ, name, delay, retrySecs, res.Limit, 0, res.Remaining)
		w.Header()[answer.HeaderRetryAfter] = g.retryAfter
		writeGRPC(w, r, codes.ResourceExhausted, g.message, g.details)
		return
	}
	reset := answer.ResetValue(hc.Reset == policy.ResetDelta, st.now, res.Reset)
	g := ps.lastGRPC.Load()
	if g == nil || g.typ != typ || g.retry != delay || g.limit != res.Limit || g.reset != reset || g.remaining != res.Remaining {
		g = newGRPCRejection(typ, name, delay, retrySecs, res.Limit, reset, res.Remaining)
		ps.lastGRPC.Store(g)
	}
	hdr := w.Header()
	hdr[answer.HeaderLimit] = g.vals[0:1:1]
	hdr[answer.HeaderRemaining] = g.vals[1:2:2]
	hdr[answer.HeaderReset] = g.vals[2:3:3]
	hdr[answer.HeaderRetryAfter] = g.retryAfter
	writeGRPC(w, r, codes.ResourceExhausted, g.message, g.details)
}
