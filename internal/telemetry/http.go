package telemetry

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context headers, as net/http keys them.
const (
	headerTraceparent = "Traceparent"
	headerTracestate  = "Tracestate"
)

// Handler wraps next, the proxy, with one server span per request, named by its method (the
// semantic conventions' name when no route is known). The request's trace context is taken
// from its traceparent and tracestate only when trusted says its direct peer is a trusted
// proxy (trusted_proxies, the decision that forwarding headers get); from any other peer the
// request starts a new trace. Either way the headers are replaced by the span's own context,
// so the upstream's spans are children of the request's span and a client cannot pick the
// trace the upstream joins.
//
// The span names no path, query, client address or header value: any of them may be a key.
func (t *Telemetry) Handler(next http.Handler, trusted func(netip.Addr) bool) http.Handler {
	return &handler{t: t, next: next, trusted: trusted}
}

type handler struct {
	t       *Telemetry
	next    http.Handler
	trusted func(netip.Addr) bool
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	hdr := r.Header
	if len(hdr[headerTraceparent]) > 0 || len(hdr[headerTracestate]) > 0 {
		if peerTrusted(r.RemoteAddr, h.trusted) {
			ctx = h.t.prop.Extract(ctx, propagation.HeaderCarrier(hdr))
		}
		delete(hdr, headerTraceparent)
		delete(hdr, headerTracestate)
	}
	ctx, span := h.t.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer))
	h.t.prop.Inject(ctx, propagation.HeaderCarrier(hdr))
	r = r.WithContext(ctx)
	if !span.IsRecording() {
		// Not sampled: the upstream gets the context (not sampled either), nothing is recorded.
		h.next.ServeHTTP(w, r)
		span.End()
		return
	}
	span.SetAttributes(
		semconv.HTTPRequestMethodKey.String(r.Method),
		semconv.NetworkProtocolVersion(protocolVersion(r)),
		semconv.URLScheme(scheme(r)),
	)
	sw := &statusWriter{ResponseWriter: w}
	defer func() { // a deferred End: the reverse proxy aborts a failed copy with a panic
		status := sw.status
		if status == 0 {
			status = http.StatusOK // a handler that wrote nothing answered 200
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, "")
			span.SetAttributes(attribute.String("error.type", strconv.Itoa(status)))
		}
		span.End()
	}()
	h.next.ServeHTTP(sw, r)
}

// peerTrusted reports whether the direct peer at remoteAddr is a trusted proxy.
func peerTrusted(remoteAddr string, trusted func(netip.Addr) bool) bool {
	if trusted == nil {
		return false
	}
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && trusted(addr.Unmap())
}

func protocolVersion(r *http.Request) string {
	switch r.ProtoMajor {
	case 2:
		return "2"
	case 3:
		return "3"
	}
	return "1.1"
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// statusWriter remembers the status of the answer. Unwrap lets http.ResponseController (and
// through it the reverse proxy's flushes, hijacks and deadlines) reach the connection's writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	} else if code == http.StatusSwitchingProtocols {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps the writer a Flusher for the handlers that assert it rather than use a
// ResponseController.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
