// Package otlpsink is an OTLP receiver for tests: a collector's trace and metrics services.
//
// It serves the OpenTelemetry collector's protocol on real sockets, gRPC
// (opentelemetry.proto.collector.{trace,metrics}.v1) and HTTP/protobuf (POST /v1/traces,
// /v1/metrics), and keeps what it received, decoded and as the bytes it came in, so that a
// test can assert the spans an exporter sent and search everything sent for a secret.
package otlpsink

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Sink is a running receiver. Its methods are safe for concurrent use.
type Sink struct {
	// GRPCAddr is the gRPC receiver's host:port; HTTPURL the HTTP receiver's base URL.
	GRPCAddr, HTTPURL string

	mu      sync.Mutex
	spans   []Span
	metrics []*metricpb.ResourceMetrics
	raw     [][]byte
	changed chan struct{} // closed and replaced on every export
}

// Span is a received span with its resource's attributes.
type Span struct {
	*tracepb.Span
	Resource map[string]string
}

// Start serves on two loopback ports until the test ends.
func Start(t testing.TB) *Sink {
	t.Helper()
	s := &Sink{changed: make(chan struct{})}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.GRPCAddr, s.HTTPURL = gl.Addr().String(), "http://"+hl.Addr().String()
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, traceService{s: s})
	colmetricpb.RegisterMetricsServiceServer(gs, metricsService{s: s})
	go func() { _ = gs.Serve(gl) }()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var req coltracepb.ExportTraceServiceRequest
		if !s.decode(w, r, &req) {
			return
		}
		s.addTraces(&req)
		s.answer(w, &coltracepb.ExportTraceServiceResponse{})
	})
	mux.HandleFunc("POST /v1/metrics", func(w http.ResponseWriter, r *http.Request) {
		var req colmetricpb.ExportMetricsServiceRequest
		if !s.decode(w, r, &req) {
			return
		}
		s.addMetrics(&req)
		s.answer(w, &colmetricpb.ExportMetricsServiceResponse{})
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() {
		gs.Stop()
		_ = hs.Close()
	})
	return s
}

// decode reads an HTTP export's protobuf body into m, keeping its bytes.
func (s *Sink) decode(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "want application/x-protobuf, got "+ct, http.StatusUnsupportedMediaType)
		return false
	}
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = proto.Unmarshal(body, m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func (s *Sink) answer(w http.ResponseWriter, m proto.Message) {
	b, _ := proto.Marshal(m)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(b)
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	s *Sink
}

func (ts traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	ts.s.addTraces(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	s *Sink
}

func (ms metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	ms.s.addMetrics(req)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

func (s *Sink) addTraces(req *coltracepb.ExportTraceServiceRequest) {
	b, _ := proto.Marshal(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raw = append(s.raw, b)
	for _, rs := range req.GetResourceSpans() {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s.spans = append(s.spans, Span{Span: sp, Resource: res})
			}
		}
	}
	s.notify()
}

func (s *Sink) addMetrics(req *colmetricpb.ExportMetricsServiceRequest) {
	b, _ := proto.Marshal(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.raw = append(s.raw, b)
	s.metrics = append(s.metrics, req.GetResourceMetrics()...)
	s.notify()
}

func (s *Sink) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Spans returns the spans received so far.
func (s *Sink) Spans() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

// MetricNames returns the names of the metrics received so far.
func (s *Sink) MetricNames() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := map[string]bool{}
	for _, rm := range s.metrics {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				names[m.GetName()] = true
			}
		}
	}
	return names
}

// Contains reports whether any export received so far holds b, in any field.
func (s *Sink) Contains(b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.raw {
		if bytes.Contains(r, b) {
			return true
		}
	}
	return false
}

// Exports is how many exports were received.
func (s *Sink) Exports() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.raw)
}

// Wait waits until cond holds for the spans received, or timeout passes; it reports which.
func (s *Sink) Wait(timeout time.Duration, cond func([]Span) bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, ch := cond(s.spans), s.changed
		s.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// WaitMetrics waits until a metric named name was received, or timeout passes.
func (s *Sink) WaitMetrics(timeout time.Duration, name string) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if s.MetricNames()[name] {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// Attr returns span attribute key's value in text form ("" when absent); a list's items are
// joined with commas.
func Attr(sp *tracepb.Span, key string) string {
	for _, kv := range sp.GetAttributes() {
		if kv.GetKey() == key {
			return text(kv.GetValue())
		}
	}
	return ""
}

func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case *commonpb.AnyValue_ArrayValue:
		parts := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, text(e))
		}
		return strings.Join(parts, ",")
	}
	return ""
}
