package proxy

// The decision: the limiter asked within the store timeout, and what a request gets when it
// could not decide, or decided about a request that is refused anyway (401, 400).

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// take asks the limiter about st.plan.Charges (at least one) under the store timeout, filling
// st.results and st.now, and observes the store duration. timedOut reports whether the store
// ran out of time.
func (h *Handler) take(r *http.Request, st *reqState) (admitted, timedOut bool, err error) {
	charges := st.plan.Charges
	if cap(st.results) < len(charges) {
		st.results = make([]bucket.Result, len(charges))
	}
	results := st.results[:len(charges)]
	clear(results)

	start := time.Now()
	if st.ctx == nil {
		st.ctx = new(storeCtx)
	}
	ctx := st.ctx
	ctx.init(r.Context(), start.Add(h.storeTimeout))
	st.now = start
	if !h.clockIsNow {
		st.now = h.now()
	}
	admitted, err = h.limiter.Take(ctx, st.now, charges, results)
	end := time.Now()
	h.store.Duration.Observe(end.Sub(start).Seconds())
	timedOut = ctx.timedOut(end)
	st.callExpired = timedOut && ctx.parentBound
	ctx.release()
	if ctx.reusable() {
		ctx.parent = nil // do not keep the request's context alive in the pool
	} else {
		st.ctx = nil
	}
	return admitted, timedOut, err
}

// unauthorized answers a request whose bearer token failed verification. Plan left only its ip
// charges; they are taken first, because otherwise a flood of garbage tokens would bypass the ip
// limits: a group that is not admitted gets the ordinary 429. Anything else gets 401: an admitted
// group (its charges stay consumed, but nothing reaches the upstream, so nothing is counted as
// allowed) and a store failure too, without OnError, since the request is refused either way and
// an outage must turn a 401 into neither a 503 nor a forward.
func (h *Handler) unauthorized(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	taken := false // the ip charges were admitted: they hold what giveBack must return
	if len(st.plan.Charges) > 0 {
		admitted, timedOut, err := h.take(r, st)
		taken = err == nil && admitted
		switch {
		case err != nil:
			if r.Context().Err() != nil && !timedOut {
				// The client left while we asked the store: nobody to answer.
				h.m.canceled[stageStore].Inc()
				return
			}
			reason := h.countStoreError(err, timedOut)
			h.logStoreError(zap.String("reason", reason), zap.String("answer", "unauthorized"), zap.Error(err))
		case !admitted:
			h.reject(w, r, st, pols)
			return
		}
	}
	h.decide(st, decUnauthorized)
	w.Header()["Www-Authenticate"] = wwwAuthenticate
	st.buf = writeAnswer(w, r, st.buf[:0], answer.Problem{Type: answer.ProblemUnauthorized, Status: http.StatusUnauthorized,
		Detail: "The bearer token is not valid."})
	if taken && h.releaser != nil && st.mustGiveBack() {
		// The 401 is the answer: it ends concurrency slots, and charges of ip policies whose
		// charge_on does not list 401.
		h.giveBack(r, st, http.StatusUnauthorized)
	}
}

// storeError renders the on_error rule that the limiter decided (bucket.RuleOf: the rule of
// its *bucket.UndecidedError; Allow for a limiter that no rule guards) for a request it could
// not decide: forward, or 503 with Retry-After: 1.
func (h *Handler) storeError(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies, err error, timedOut, callExpired bool) {
	if callExpired || errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		// The call's own deadline (grpc-timeout; only gRPC calls carry one) ran out first:
		// nobody waits for a forward, and on_error cannot help. callExpired says so without
		// asking the request's context, whose own timer may fire a moment after the store's.
		h.countStoreError(err, true)
		h.m.decided(protoGRPC, decStoreErrorDenied)
		st.decision = decStoreErrorDenied
		callDeadline(w, r, "The call's deadline passed while the rate limiter decided.")
		return
	}
	if r.Context().Err() != nil && !timedOut {
		// The client left while we asked the store: not the store's fault, nobody to answer.
		h.m.canceled[stageStore].Inc()
		return
	}
	proto := protocolOf(r, isGRPC(r))
	reason := h.countStoreError(err, timedOut)
	failClosed := bucket.RuleOf(err).FailsClosed()
	h.logStoreError(zap.String("reason", reason), zap.Bool("fail_open", !failClosed),
		zap.String("protocol", protocolNames[proto]), zap.Error(err))
	if !failClosed {
		h.m.decided(proto, decStoreErrorAllowed)
		st.decision = decStoreErrorAllowed
		h.forward(w, r, st, pols)
		return
	}
	h.m.decided(proto, decStoreErrorDenied)
	st.decision = decStoreErrorDenied
	writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemUnavailable, Status: http.StatusServiceUnavailable,
		Detail: "The rate limiter is unavailable; retry shortly.", RetryAfter: 1})
}

// callDeadline answers a gRPC call whose deadline (grpc-timeout) ended, or would end, while the
// gateway itself held it: DEADLINE_EXCEEDED. Only gRPC calls carry such a deadline.
func callDeadline(w http.ResponseWriter, r *http.Request, detail string) {
	writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemTimeout, Status: http.StatusGatewayTimeout, Detail: detail})
}

// countStoreError counts a failed Take by reason and returns the reason's label.
func (h *Handler) countStoreError(err error, timedOut bool) string {
	if timedOut || errors.Is(err, context.DeadlineExceeded) {
		h.store.Timeout.Inc()
		return "timeout"
	}
	h.store.Failure.Inc()
	return "error"
}
