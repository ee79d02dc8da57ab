package proxy

// Upstream protection in the forward path (internal/protect): the policies judge first; a
// request about to be forwarded has its body read (when small: see bufferBody), asks for a
// concurrency slot, waits for one up to the queue timeout, and is shed when it gets none. The
// slot is held until the reverse proxy is done with the request (the answer copied to its end,
// streams and upgrades included, or the client gone; a client that stops reading is cut by
// server.write_stall_timeout) and given back with the upstream's latency, from the end of the
// request's body to the answer's headers, which moves an adaptive limit.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/protect"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/verdict"
)

// DefaultStreamShare is Protection.StreamShare's default.
const DefaultStreamShare = 0.1

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
	// Limit is the limit in force (slots).
	Limit() int
	// CountShed counts a request of class c shed by the proxy itself (a client past its share
	// of streaming uploads) where Acquire's sheds are counted.
	CountShed(c protect.Class)
}

var _ Slots = (*protect.Limiter)(nil)

// Protection is Options.Protect.
type Protection struct {
	// Slots hands out the upstream's concurrency slots. (Required)
	Slots Slots
	// Classify is a request's priority class; t says whose headers to believe (a header rule
	// matches only a request from a trusted peer). (Optional) default: every request is Default.
	Classify func(r *http.Request, t protect.Trust) protect.Class
	// MaxBufferedBody: a request body of at most this many bytes is read whole before the
	// request takes a slot, so that a slow upload holds none; larger bodies stream through
	// the slot, bounded by StreamShare. (Optional) 0: every body streams.
	MaxBufferedBody int64
	// StreamShare is the share of the limit one client's streaming-body requests may hold at
	// once (at least one slot). (Optional) default 0.1.
	StreamShare float64
	// Status of a shed request: 503 (gRPC UNAVAILABLE) or 429 (RESOURCE_EXHAUSTED).
	// (Optional) default 503.
	Status int
}

// protection is the handler's compiled Protection: the shed answers rendered once.
type protection struct {
	slots    Slots
	classify func(*http.Request, protect.Trust) protect.Class
	maxBody  int64
	share    float64
	streams  streams
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
	if p.MaxBufferedBody < 0 {
		return nil, errors.New("proxy: protect: max buffered body " + strconv.FormatInt(p.MaxBufferedBody, 10) + ": must not be negative")
	}
	share := p.StreamShare
	if share == 0 {
		share = DefaultStreamShare
	}
	if !(share > 0 && share <= 1) {
		return nil, errors.New("proxy: protect: stream share " + strconv.FormatFloat(share, 'g', -1, 64) + ": want (0, 1]")
	}
	pr := &protection{slots: p.Slots, classify: p.Classify, maxBody: p.MaxBufferedBody, share: share, status: st,
		retry: answer.RetryAfter(shedRetryAfter), grpcCode: grpcCode(st)}
	if pr.classify == nil {
		pr.classify = func(*http.Request, protect.Trust) protect.Class { return protect.Default }
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

// sendGuarded is send behind a concurrency slot: it reads a small body whole first (so that the
// slot covers the upstream's time, not the client's upload: see bufferBody), waits for a slot,
// sheds the request when there is none, and otherwise forwards it and gives the slot back when
// the forward is over (in a defer: the reverse proxy aborts a response whose upstream body
// fails with a panic).
func (h *Handler) sendGuarded(w http.ResponseWriter, r *http.Request, st *reqState, rp *httputil.ReverseProxy, pols Policies) {
	p := h.prot
	class := p.classify(r, pols)
	streaming := false
	if r.Body != nil && r.Body != http.NoBody && !st.grpc {
		var ok bool
		if streaming, ok = h.bufferBody(w, r); !ok {
			return // answered (or the client left); nothing reached the upstream
		}
	}
	if streaming {
		// A body past max_buffered_body streams through the slot: one client's such requests
		// hold at most its share of the limit, so that a client trickling large uploads
		// cannot take the slots everyone else needs.
		client := policy.ClientIP(policy.PeerAddr(r.RemoteAddr), r.Header, pols.Trusted)
		if !p.streams.take(client, p.streamSlots(p.slots.Limit())) {
			p.slots.CountShed(class)
			h.shed(w, r, st, class)
			return
		}
		defer p.streams.give(client)
	}
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
	// The sample runs from the end of the request's body to the answer's headers: the
	// upstream's time alone. A buffered body (or none) is in now; one that streams (a large
	// upload, a gRPC call) is stamped when it ends.
	start := time.Now()
	var body *clientBody
	if r.Body != nil && r.Body != http.NoBody && (streaming || st.grpc) {
		body = &clientBody{ReadCloser: r.Body, stamp: true}
		r.Body = body
	}
	fw := st.writer(w)
	fw.timed = true
	defer func() {
		first := fw.first
		sent := start
		if body != nil {
			sent = body.endedAt()
		}
		o := protect.Answered
		switch st.fw.fate {
		case fateNone, fateUndelivered:
			o = protect.NotSent
		case fateForwarded:
			o = protect.Abandoned // the client left before the answer
		case fateUnanswered:
			o = protect.Failed
			if r.Context().Err() != nil {
				o = protect.Abandoned // the client left, or its body failed
			}
		}
		if first.IsZero() {
			first = time.Now()
		}
		rtt, ok := protect.Latency(o, sent, first)
		p.slots.Release(class, first, rtt, ok)
	}()
	h.send(fw, r, st, rp)
}

// bufferBody reads r's body whole before a slot is taken, when it is no larger than
// max_buffered_body, and puts it back as an in-memory body of known length: the time a client
// takes to send it (a slow link, or a client trickling it on purpose) is then spent holding no
// upstream capacity, and server.read_timeout still bounds it. A larger body streams
// (streaming true): its first part read so far, then the rest from the client. ok is false
// when reading failed; the client was then answered (408 for a body too slow, 400 for a
// broken one) or had left.
func (h *Handler) bufferBody(w http.ResponseWriter, r *http.Request) (streaming, ok bool) {
	max := h.prot.maxBody
	if max <= 0 || r.ContentLength > max {
		return true, true
	}
	var buf []byte
	var err error
	if r.ContentLength >= 0 {
		buf = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, buf)
	} else {
		// Unknown length (chunked): read one byte past the bound to learn whether it fits.
		buf, err = io.ReadAll(io.LimitReader(r.Body, max+1))
	}
	if err != nil {
		if reason, isFault := bodyFault(err); isFault && (reason == clientBodyTimeout || r.Context().Err() == nil) {
			h.clientError(w, r, reason, err)
		} else {
			h.m.canceled[stageUpstream].Inc() // the client left mid-upload: nobody to answer
		}
		return false, false
	}
	if int64(len(buf)) > max {
		r.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), r.Body), body: r.Body}
		return true, true
	}
	r.ContentLength = int64(len(buf))
	r.TransferEncoding = nil
	if len(buf) == 0 {
		r.Body = http.NoBody
	} else {
		r.Body = &bufferedBody{Reader: bytes.NewReader(buf)}
	}
	return false, true
}

// bufferedBody is a request body read whole into memory.
type bufferedBody struct{ *bytes.Reader }

func (*bufferedBody) Close() error { return nil }

// prefixedBody is a body whose first part was read already: that part, then the rest.
type prefixedBody struct {
	io.Reader
	body io.Closer
}

func (b *prefixedBody) Close() error { return b.body.Close() }

// streams counts the slots each client's streaming-body requests hold. It is touched only by
// requests whose bodies stream (past max_buffered_body), so one mutex is enough.
type streams struct {
	mu   sync.Mutex
	held map[netip.Addr]int
}

// take counts one more streaming request of client if it holds fewer than most.
func (s *streams) take(client netip.Addr, most int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[client] >= most {
		return false
	}
	if s.held == nil {
		s.held = map[netip.Addr]int{}
	}
	s.held[client]++
	return true
}

func (s *streams) give(client netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[client]--; s.held[client] <= 0 {
		delete(s.held, client) // the map holds only clients with a stream open
	}
}

// streamSlots is one client's share of a limit for its streaming-body requests: at least 1.
func (p *protection) streamSlots(limit int) int {
	return max(1, int(float64(limit)*p.share))
}

// shed answers a request that got no slot and gives back what the policies charged for it.
func (h *Handler) shed(w http.ResponseWriter, r *http.Request, st *reqState, class protect.Class) {
	p := h.prot
	if ce := h.log.Check(zap.InfoLevel, "upstream overloaded: request shed"); ce != nil {
		ce.Write(zap.String("priority", class.String()), zap.String("protocol", protocolNames[st.proto]))
	}
	hdr := w.Header()
	if _, read := r.Body.(*bufferedBody); r.ProtoMajor == 1 && !read && r.Body != nil && r.Body != http.NoBody {
		// The body was not read (it streams, and the request never got to send it): net/http
		// would wait for it to discard it before the answer could go, as long as the client
		// takes to send it. The connection cannot carry another request then anyway.
		hdr.Set("Connection", "close")
	}
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
// release (the store's Release: a concurrency slot is freed; any other charge refunded as far as
// the store can do so exactly, see bucket.Releaser) and marks the group given back, so that
// the give-back that runs after the answer releases nothing twice.
func (h *Handler) giveBackShed(r *http.Request, st *reqState) {
	if st.decision != decAllowed || h.releaser == nil {
		return // no charge was taken (no policy matched, or the store failed open)
	}
	st.givenBack = true
	st.taken = verdict.AppendTaken(st.taken[:0], st.plan.Charges, st.results, st.now, nil)
	h.release(r, st)
}
