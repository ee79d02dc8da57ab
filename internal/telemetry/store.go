package telemetry

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Store wraps a store with one client span per call, a child of the span in the call's
// context (a request's, an RLS call's). A call outside a recorded span is passed on as is:
// unsampled requests pay a look at their context.
func (t *Telemetry) Store(next bucket.Releaser, backend string) bucket.Releaser {
	return &store{next: next, tracer: t.tracer, backend: attribute.String("ratelimit.store", backend)}
}

type store struct {
	next    bucket.Releaser
	tracer  trace.Tracer
	backend attribute.KeyValue
}

// Span names of store calls.
const (
	SpanTake    = "ratelimit.store.take"
	SpanRelease = "ratelimit.store.release"
)

func (s *store) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return s.next.Take(ctx, now, charges, results)
	}
	ctx, span := s.tracer.Start(ctx, SpanTake, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(s.backend, AttrCharges.Int(len(charges))))
	admitted, err := s.next.Take(ctx, now, charges, results)
	if err != nil {
		fail(span, err)
	} else {
		span.SetAttributes(attribute.Bool("ratelimit.admitted", admitted))
	}
	span.End()
	return admitted, err
}

func (s *store) Release(ctx context.Context, now time.Time, taken []bucket.Taken) error {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return s.next.Release(ctx, now, taken)
	}
	ctx, span := s.tracer.Start(ctx, SpanRelease, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(s.backend, AttrCharges.Int(len(taken))))
	err := s.next.Release(ctx, now, taken)
	if err != nil {
		fail(span, err)
	}
	span.End()
	return err
}

// fail marks span failed by err's kind only: a store's error text may quote a key.
func fail(span trace.Span, err error) {
	kind := "error"
	if errors.Is(err, context.DeadlineExceeded) {
		kind = "timeout"
	} else if errors.Is(err, context.Canceled) {
		kind = "canceled"
	}
	span.SetStatus(codes.Error, kind)
	span.SetAttributes(attribute.String("error.type", kind))
}
