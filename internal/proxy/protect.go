package proxy

// Upstream protection in the forward path (internal/protect): the policies judge first; a
// request about to be forwarded asks for a concurrency slot, waits for one up to the queue
// timeout, and is shed when it gets none. The slot is held until the reverse proxy is done with
// the request (the answer copied to its end, streams and upgrades included, or the client gone)
// and given back with the upstream's latency, which moves an adaptive limit.

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/protect"
)

// shedRetryAfter is the Retry-After of a shed request, in seconds: overload is usually over
// within seconds, and a longer wait would idle the upstream once it recovers.
const shedRetryAfter = 1

// Slots is what the handler needs from the upstream protection; *protect.Limiter satisfies it.
// It must be safe for concurrent use.
type Slots interface {
	// Acquire takes a slot for a request of class c, waiting up to the queue timeout: nil with
	// a slot, protect.ErrShed without, or ctx's error when it ended while waiting.
	Acquire(ctx context.Context, c protect.Class) (waited time.Duration, err error)
	// Release gives back a slot of class c at now (zero: it reads its own clock if it needs
	// one); rtt is the upstream's latency when sampled.
	Release(c protect.Class, now time.Time, rtt time.Duration, sampled bool)
	// Sample reports whether this request's latency should be measured for Release: when
	// not, no clock is read for it.
	Sample() bool
}

var _ Slots = (*protect.Limiter)(nil)

// Protection is Options.Protect.
type Protection struct {
	// Slots hands out the upstream's concurrency slots. (Required)
	Slots Slots
	// Classify is a request's priority class. (Optional) default: every request is Default.
	Classify func(*http.Request) protect.Class
	// Status of a shed request: 503 (gRPC UNAVAILABLE) or 429 (RESOURCE_EXHAUSTED).
	// (Optional) default 503.
	Status int
}

// protection is the handler's compiled Protection: the shed answers rendered once.
type protection struct {
	slots    Slots
	classify func(*http.Request) protect.Class
	status   int
	body     []byte   // problem+json
	retry    []string // Retry-After
	grpcCode codes.Code
	grpcMsg  []string
	grpcDet  []string // grpc-status-details-bin with RetryInfo
}

func newProtection(p *Protection) (*protection, error) {
	if p.Slots == nil {
		return nil, errors.New("proxy: protect: slots are required")
	}
	st := p.Status
	if st == 0 {
		st = http.StatusServiceUnavailable
	}
	if st != http.StatusServiceUnavailable && st != http.StatusTooManyRequests {
		return nil, errors.New("proxy: protect: status " + strconv.Itoa(st) + ": want 503 or 429")
	}
	pr := &protection{slots: p.Slots, classify: p.Classify, status: st, retry: answer.RetryAfter(shedRetryAfter), grpcCode: grpcCode(st)}
	if pr.classify == nil {
		pr.classify = func(*http.Request) protect.Class { return protect.Default }
	}
	const msg = "The upstream is overloaded; retry after 1 second."
	pr.body = answer.AppendProblem(nil, answer.Problem{Type: answer.ProblemOverloaded, Status: st, Detail: msg, RetryAfter: shedRetryAfter})
	pr.grpcMsg = []string{grpcMessage(msg)}
	s, err := status.New(pr.grpcCode, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(shedRetryAfter * time.Second)})
	if err != nil {
		return nil, err
	}
	b, err := proto.Marshal(s.Proto())
	if err != nil {
		return nil, err
	}
	pr.grpcDet = []string{base64.RawStdEncoding.EncodeToString(b)}
	return pr, nil
}

// sendGuarded is send behind a concurrency slot: it waits for one, sheds the request when there
// is none, and otherwise forwards it and gives the slot back when the forward is over (in a
// defer: the reverse proxy aborts a response whose upstream body fails with a panic).
func (h *Handler) sendGuarded(w http.ResponseWriter, r *http.Request, st *reqState, rp *httputil.ReverseProxy) {
	p := h.prot
	class := p.classify(r)
	if _, err := p.slots.Acquire(r.Context(), class); err != nil {
		switch {
		case errors.Is(err, protect.ErrShed):
			h.shed(w, r, st, class)
		case errors.Is(r.Context().Err(), context.DeadlineExceeded):
			h.giveBackShed(r, st)
			callDeadline(w, r, "The call's deadline passed while it waited for an upstream slot.")
		default:
			h.giveBackShed(r, st) // the client left while it waited: nothing reached the upstream
			h.m.canceled[stageWait].Inc()
		}
		return
	}
	if !p.slots.Sample() {
		// A fixed limit learns nothing from latency, and at high rates an adaptive one needs
		// only some requests timed: no clock reads (on some virtual machines one costs a
		// quarter of a microsecond).
		defer p.slots.Release(class, time.Time{}, 0, false)
		h.send(w, r, st, rp)
		return
	}
	st.pw = timingWriter{ResponseWriter: w, start: time.Now()}
	defer func() {
		start, first := st.pw.start, st.pw.first
		st.pw = timingWriter{} // do not keep the response alive in the pool
		switch st.fw.fate {
		case fateNone, fateUndelivered:
			// The upstream never saw it: its latency says nothing.
			p.slots.Release(class, time.Time{}, 0, false)
		default:
			if first.IsZero() {
				first = time.Now() // no answer (the client left, a reset): at least this long
			}
			p.slots.Release(class, first, first.Sub(start), true)
		}
	}()
	h.send(&st.pw, r, st, rp)
}

// shed answers a request that got no slot and gives back what the policies charged for it.
func (h *Handler) shed(w http.ResponseWriter, r *http.Request, st *reqState, class protect.Class) {
	p := h.prot
	if ce := h.log.Check(zap.InfoLevel, "upstream overloaded: request shed"); ce != nil {
		ce.Write(zap.String("priority", class.String()), zap.String("protocol", protocolNames[st.proto]))
	}
	hdr := w.Header()
	if st.grpc {
		hdr[answer.HeaderRetryAfter] = p.retry
		writeGRPC(w, r, p.grpcCode, p.grpcMsg, p.grpcDet)
	} else {
		answer.SetProblemHeaders(hdr, p.retry)
		w.WriteHeader(p.status)
		_, _ = w.Write(p.body) // the client may be gone; there is nobody left to tell
	}
	h.giveBackShed(r, st)
}

// giveBackShed gives back every charge of an admitted group whose request was not forwarded
// because of the protection: a shed request consumes no rate-limit budget. It uses giveBack's
// path (the store's Release: a concurrency slot is freed; any other charge refunded as far as
// the store can do so exactly, see bucket.Releaser) and marks the group given back, so that
// the give-back that runs after the answer releases nothing twice.
func (h *Handler) giveBackShed(r *http.Request, st *reqState) {
	if st.decision != decAllowed || h.releaser == nil {
		return // no charge was taken (no policy matched, or the store failed open)
	}
	st.givenBack = true
	st.taken = st.taken[:0]
	for i, c := range st.plan.Charges {
		if st.results[i].Allowed {
			st.taken = append(st.taken, bucket.Taken{Charge: c, At: st.now, Token: st.results[i].Token})
		}
	}
	if len(st.taken) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.storeTimeout)
	defer cancel()
	if err := h.releaser.Release(ctx, h.now(), st.taken); err != nil {
		h.m.shared.ReleaseErrors.Inc()
		if ce := h.log.Check(zap.WarnLevel, "rate-limit store release failed"); ce != nil {
			ce.Write(zap.Int("charges", len(st.taken)), zap.Error(err))
		}
	}
	clear(st.taken)
}

// timingWriter records when the upstream's answer began (its status, or a protocol switch):
// the latency sample of an adaptive limit, which a long stream's duration must not inflate.
// http.ResponseController finds flushes through Unwrap, hijacks through Hijack.
type timingWriter struct {
	http.ResponseWriter
	start, first time.Time
}

func (w *timingWriter) mark() {
	if w.first.IsZero() {
		w.first = time.Now()
	}
}

func (w *timingWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		w.mark()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *timingWriter) Write(b []byte) (int, error) {
	w.mark()
	return w.ResponseWriter.Write(b)
}

func (w *timingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *timingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.mark()
	}
	return c, brw, err
}
