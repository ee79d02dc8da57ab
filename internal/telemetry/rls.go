package telemetry

import (
	"context"
	"net/netip"
	"strings"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/envoyrules"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// RLSInterceptor is a gRPC interceptor for Envoy's rate limit service: one server span per
// call, named by its method, a child of the caller's trace context only when trusted says the
// caller (Envoy) is a trusted proxy, with ShouldRateLimit's decision as attributes: the
// domain, the outcome, and the deciding descriptor's rule (its label, as the metrics name it),
// algorithm, key pseudonym (the console's, of kind rls:DOMAIN) and retry-after. rules is the
// set in force, read again only for a recorded call's deciding descriptor.
func (t *Telemetry) RLSInterceptor(trusted func(netip.Addr) bool, rules func() *envoyrules.Rules) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !strings.HasPrefix(info.FullMethod, rlsService) {
			return handler(ctx, req) // the health service, which Envoy asks every few seconds
		}
		if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("traceparent")) > 0 {
			if p, ok := peer.FromContext(ctx); ok && p.Addr != nil && peerTrusted(p.Addr.String(), trusted) {
				ctx = t.prop.Extract(ctx, mdCarrier(md))
			}
		}
		ctx, span := t.tracer.Start(ctx, strings.TrimPrefix(info.FullMethod, "/"), trace.WithSpanKind(trace.SpanKindServer))
		resp, err := handler(ctx, req)
		if span.IsRecording() {
			span.SetAttributes(semconv.RPCSystemNameGRPC, semconv.RPCMethod(info.FullMethod),
				attribute.String("rpc.response.status_code", status.Code(err).String()))
			if err != nil {
				span.SetStatus(codes.Error, status.Code(err).String())
				span.SetAttributes(AttrDecision.String("error"))
			}
			rq, _ := req.(*pb.RateLimitRequest)
			rs, _ := resp.(*pb.RateLimitResponse)
			if rq != nil {
				span.SetAttributes(AttrDomain.String(rq.GetDomain()))
				if rs != nil {
					span.SetAttributes(t.rlsDecision(rq, rs, rules)...)
				}
			}
		}
		span.End()
		return resp, err
	}
}

// rlsDecision is a decided call's attributes.
func (t *Telemetry) rlsDecision(rq *pb.RateLimitRequest, rs *pb.RateLimitResponse, rules func() *envoyrules.Rules) []attribute.KeyValue {
	decision := "allowed"
	if rs.GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT {
		decision = "limited"
	}
	// The deciding descriptor: the refused one with the longest wait, else the limited one
	// with the least left.
	pick := -1
	for i, st := range rs.GetStatuses() {
		if st.GetCurrentLimit() == nil || i >= len(rq.GetDescriptors()) {
			continue
		}
		if pick < 0 {
			pick = i
			continue
		}
		cur := rs.GetStatuses()[pick]
		over, curOver := st.GetCode() == pb.RateLimitResponse_OVER_LIMIT, cur.GetCode() == pb.RateLimitResponse_OVER_LIMIT
		switch {
		case over && !curOver,
			over && curOver && st.GetDurationUntilReset().AsDuration() > cur.GetDurationUntilReset().AsDuration(),
			!over && !curOver && st.GetLimitRemaining() < cur.GetLimitRemaining():
			pick = i
		}
	}
	attrs := []attribute.KeyValue{AttrDecision.String(decision), AttrCharges.Int(len(rq.GetDescriptors()))}
	if pick < 0 {
		if decision == "allowed" {
			attrs[0] = AttrDecision.String("unmatched")
		}
		return attrs
	}
	st, d := rs.GetStatuses()[pick], rq.GetDescriptors()[pick]
	attrs = append(attrs, AttrLimit.Int64(int64(st.GetCurrentLimit().GetRequestsPerUnit())),
		AttrRemaining.Int64(int64(st.GetLimitRemaining())))
	if st.GetCode() == pb.RateLimitResponse_OVER_LIMIT {
		attrs = append(attrs, AttrRetryAfter.Int64(retrySeconds(st.GetDurationUntilReset().AsDuration())))
	}
	entries := make([]envoyrules.Entry, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		entries = append(entries, envoyrules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	var m envoyrules.Match
	if rset := rules(); d.GetLimit() == nil && rset != nil {
		if dom := rset.Domain(rq.GetDomain()); dom != nil {
			if r := dom.Match(entries, &m); r != nil {
				attrs = append(attrs, AttrPolicy.String(r.Label),
					AttrAlgorithm.String(limitterms.AlgorithmName(r.Limit.Algorithm)))
				entries = m.KeyEntries(entries)
			}
		}
	}
	return append(attrs, AttrKey.String(t.rlsKey(rq.GetDomain(), entries)))
}

// rlsKey is a descriptor's key as the console shows it: the pseudonym, of kind rls:DOMAIN, of
// its entries ("k=v" each, NUL-terminated). Never a value in clear: one may be a token.
func (t *Telemetry) rlsKey(domain string, entries []envoyrules.Entry) string {
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
		b.WriteByte(0)
	}
	return t.ps.Of("rls:"+domain, b.String())
}

// rlsService prefixes the rate limit service's method names.
const rlsService = "/envoy.service.ratelimit.v3.RateLimitService/"

// mdCarrier reads the trace context from gRPC metadata.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}
