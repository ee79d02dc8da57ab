package telemetry

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/otlpsink"
)

// okStore admits everything.
type okStore struct{}

func (okStore) Take(_ context.Context, _ time.Time, _ []bucket.Charge, results []bucket.Result) (bool, error) {
	for i := range results {
		results[i].Allowed = true
	}
	return true, nil
}

func (okStore) Release(context.Context, time.Time, []bucket.Taken) error { return nil }

func start(t *testing.T, otlp policy.OTLPConfig, ratio float64) *Telemetry {
	t.Helper()
	tel, err := New(context.Background(), policy.TelemetryConfig{OTLP: otlp, Traces: policy.TracesConfig{SampleRatio: &ratio}},
		Options{Pseudonyms: policy.NewPseudonyms([]byte("0123456789abcdef0123456789abcdef"))})
	if err != nil {
		t.Fatal(err)
	}
	return tel
}

const (
	parentTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentSpan  = "00f067aa0ba902b7"
	traceparent = "00-" + parentTrace + "-" + parentSpan + "-01"
)

var trustLoopback2 = func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.2") }

// serve sends one request from peer through tel's handler, whose inner handler takes one
// charge from the traced store; it returns the traceparent the inner handler saw (and after a
// space its tracestate, when it saw one).
func serve(t *testing.T, tel *Telemetry, peer string, hdr map[string]string) string {
	t.Helper()
	st := tel.Store(okStore{}, "memory")
	var seen string
	h := tel.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = strings.TrimSpace(r.Header.Get("Traceparent") + " " + strings.Join(r.Header.Values("Tracestate"), ","))
		if _, err := st.Take(r.Context(), time.Now(), make([]bucket.Charge, 1), make([]bucket.Result, 1)); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusTeapot)
	}), trustLoopback2)
	r := httptest.NewRequest(http.MethodGet, "/secret-path?token=abc", nil)
	r.RemoteAddr = peer + ":5555"
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	h.ServeHTTP(httptest.NewRecorder(), r)
	return seen
}

func TestExportsOverGRPCAndHTTP(t *testing.T) {
	sink := otlpsink.Start(t)
	for _, otlp := range []policy.OTLPConfig{
		{Endpoint: sink.GRPCAddr, Insecure: true},
		{Endpoint: "http://" + sink.GRPCAddr, Protocol: "grpc"},
		{Endpoint: sink.HTTPURL, Protocol: "http/protobuf"},
	} {
		t.Run(otlp.Protocol+" "+otlp.Endpoint, func(t *testing.T) {
			before := len(sink.Spans())
			tel := start(t, otlp, 1)
			serve(t, tel, "127.0.0.1", nil)
			if err := tel.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := sink.Spans()[before:]
			if len(spans) != 2 {
				t.Fatalf("got %d spans, want the request's and the store call's", len(spans))
			}
			store, req := spans[0], spans[1]
			if req.GetName() != "GET" || store.GetName() != SpanTake {
				t.Errorf("got spans %q and %q", req.GetName(), store.GetName())
			}
			if string(store.GetParentSpanId()) != string(req.GetSpanId()) || string(store.GetTraceId()) != string(req.GetTraceId()) {
				t.Errorf("the store call's span is not the request's child")
			}
			if got := otlpsink.Attr(req.Span, "http.response.status_code"); got != "418" {
				t.Errorf("status attribute %q, want 418", got)
			}
			if req.Resource["service.name"] != ServiceName {
				t.Errorf("resource %v", req.Resource)
			}
		})
	}
	if sink.Contains([]byte("secret-path")) || sink.Contains([]byte("token=abc")) {
		t.Error("a request's path or query was exported")
	}
}

// TestTraceContextTrust: a trusted peer's traceparent is the request span's parent; an
// untrusted peer's is dropped (a new trace); either way the handler behind sees the request
// span's own context, never the client's header.
func TestTraceContextTrust(t *testing.T) {
	sink := otlpsink.Start(t)
	tel := start(t, policy.OTLPConfig{Endpoint: sink.GRPCAddr, Insecure: true}, 1)
	trusted := serve(t, tel, "127.0.0.2", map[string]string{"traceparent": traceparent, "tracestate": "k=v"})
	untrusted := serve(t, tel, "127.0.0.1", map[string]string{"traceparent": traceparent, "tracestate": "evil=1"})
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var reqs []otlpsink.Span
	for _, s := range sink.Spans() {
		if s.GetName() == "GET" {
			reqs = append(reqs, s)
		}
	}
	if len(reqs) != 2 {
		t.Fatalf("got %d request spans, want 2", len(reqs))
	}
	tr, un := reqs[0], reqs[1]
	if hex.EncodeToString(tr.GetTraceId()) != parentTrace || hex.EncodeToString(tr.GetParentSpanId()) != parentSpan {
		t.Errorf("trusted peer: span in trace %x under %x, want %s under %s", tr.GetTraceId(), tr.GetParentSpanId(), parentTrace, parentSpan)
	}
	if tr.GetTraceState() != "k=v" {
		t.Errorf("trusted peer: trace state %q, want k=v", tr.GetTraceState())
	}
	if hex.EncodeToString(un.GetTraceId()) == parentTrace || len(un.GetParentSpanId()) != 0 || un.GetTraceState() != "" {
		t.Errorf("untrusted peer: span in trace %x under %x (state %q), want a new root", un.GetTraceId(), un.GetParentSpanId(), un.GetTraceState())
	}
	for _, c := range []struct {
		seen  string
		span  otlpsink.Span
		state string
	}{{trusted, tr, " k=v"}, {untrusted, un, ""}} {
		want := "00-" + hex.EncodeToString(c.span.GetTraceId()) + "-" + hex.EncodeToString(c.span.GetSpanId()) + "-01" + c.state
		if c.seen != want {
			t.Errorf("handler saw trace context %q, want the request span's %q", c.seen, want)
		}
	}
}

// TestUnsampledRecordsNothing: at ratio 0 a request without a parent records no span, and the
// store sees the request's own context (no span started for it); the upstream still gets a
// traceparent (not sampled) of a span of its own.
func TestUnsampledRecordsNothing(t *testing.T) {
	sink := otlpsink.Start(t)
	tel := start(t, policy.OTLPConfig{Endpoint: sink.GRPCAddr, Insecure: true}, 0)
	seen := serve(t, tel, "127.0.0.1", nil)
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.Spans()); n != 0 {
		t.Errorf("got %d spans at ratio 0", n)
	}
	if !strings.HasPrefix(seen, "00-") || !strings.HasSuffix(seen, "-00") {
		t.Errorf("handler saw traceparent %q, want an unsampled one", seen)
	}
	// A sampled parent from a trusted peer is followed even at ratio 0.
	tel = start(t, policy.OTLPConfig{Endpoint: sink.GRPCAddr, Insecure: true}, 0)
	serve(t, tel, "127.0.0.2", map[string]string{"traceparent": traceparent})
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(sink.Spans()); n != 2 {
		t.Errorf("got %d spans under a sampled trusted parent, want 2", n)
	}
}
