package proxy

// The per-request state, pooled, and what an admitted request gives back when its answer is over.

import (
	"context"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/verdict"
)

// reqState is the per-request scratch space, pooled so the admitted path allocates little: the
// buffers that later requests reuse, and the facts of one request (reqFacts), which reset
// forgets at once.
type reqState struct {
	plan    policy.Plan
	results []bucket.Result
	buf     []byte
	ctx     *storeCtx // reused while no store materialised it
	taken   []bucket.Taken
	values  valueArena // the X-RateLimit values of admitted answers (headers.go)
	reqFacts
}

// reqFacts is what reqState knows of one request; every request starts from its zero value.
type reqFacts struct {
	now   time.Time // the instant handed to the limiter; headers are relative to it
	grpc  bool      // the request is a gRPC call: the gateway's own answers are gRPC statuses
	proto uint8     // protoHTTP1, protoHTTP2 or protoGRPC: the metrics' and logs' protocol label
	// callExpired: the last Take ran out of time at the request's own deadline (a gRPC call's
	// grpc-timeout), not at StoreTimeout.
	callExpired bool

	// fw is the answer's writer, once one is needed (st.writer): its status goes to the access
	// log and decides charge_on refunds, its fate whether a refund may be made.
	fw forwardWriter
	// givenBack: every charge was given back already (a request the protection shed).
	givenBack bool

	// For the access log.
	decision int    // index into decisionLabels, or decNone while undecided
	rejector string // the policy named in a 429
}

// reset readies a pooled state for a request: the last request's facts forgotten in one
// assignment (a fact added later starts zero without being listed here), the buffers emptied
// with their capacity kept.
func (st *reqState) reset(grpc bool, proto uint8, wantIdentity bool) {
	st.plan.Reset()
	st.plan.WantIdentity = wantIdentity
	st.buf, st.taken = st.buf[:0], st.taken[:0]
	st.reqFacts = reqFacts{grpc: grpc, proto: proto, decision: decNone}
}

// mustGiveBack reports whether an admitted group holds a charge to give back after the answer:
// a concurrency slot, or a reservation of a charge_on policy.
func (st *reqState) mustGiveBack() bool {
	for i, c := range st.plan.Charges {
		if st.results[i].Allowed && (c.Limit.Algorithm == bucket.Concurrency || st.plan.Policies[i].ChargeOn != nil) {
			return true
		}
	}
	return false
}

// giveBack releases what an admitted group must give back now that its answer, of this status
// (0: none was sent), is over: every concurrency slot, and the reservation of every charge_on
// policy whose list does not hold the status, unless the request may have reached the upstream
// without an answer from it (see forwardFate.refundable): then every reservation stays spent.
// It runs within store.timeout of its own, not the request's context, which has ended when the
// client went away; a failure is counted (the store keeps the charge: a DynamoDB slot until its
// lease expires, a refund never).
func (h *Handler) giveBack(r *http.Request, st *reqState, status int) {
	if st.givenBack {
		return // shed by the upstream protection: everything went back then
	}
	refundable := st.fw.fate.refundable()
	st.taken = verdict.AppendTaken(st.taken[:0], st.plan.Charges, st.results, st.now, func(i int) bool {
		pol := st.plan.Policies[i]
		switch {
		case st.plan.Charges[i].Limit.Algorithm == bucket.Concurrency:
			return true
		case pol.ChargeOn != nil && refundable && !pol.ChargeOn.Has(status):
			h.policyOf(pol).counters.refunded.Inc()
			return true
		}
		return false
	})
	h.release(r, st)
}

// release gives st.taken back through the releaser, within store.timeout of its own: the
// request's context has ended when the client went away. A failure is counted (the store
// keeps the charge: a DynamoDB slot until its lease expires, a refund never).
func (h *Handler) release(r *http.Request, st *reqState) {
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
	clear(st.taken) // the pool must not keep charges alive
}
