package proxy

import (
	"errors"
	"net/http"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// The upstream receives what was judged (see policy.Set.Plan): a request the policy set cannot
// judge unambiguously is refused here with 400, and a forwarded request loses, before the
// reverse proxy copies its headers, what was not judged (policy.Plan.StripUnjudged).

// badRequest answers a request that Plan refused (policy.ErrBadRequest): an identity header
// with conflicting values, or a path with a dot segment. As for a bad bearer token (see
// unauthorized), Plan left only its ip charges and they are taken first, so that a flood of
// such requests is still held by the ip limits: a group that is not admitted gets the
// ordinary 429, anything else (a store failure too) the 400 problem, whose detail names the
// header. Nothing is forwarded.
func (h *Handler) badRequest(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies, err error) {
	taken := false
	if len(st.plan.Charges) > 0 {
		admitted, timedOut, terr := h.take(r, st)
		taken = terr == nil && admitted
		switch {
		case terr != nil:
			if r.Context().Err() != nil && !timedOut {
				h.m.canceled[stageStore].Inc()
				return
			}
			reason := h.countStoreError(terr, timedOut)
			h.logStoreError(zap.String("reason", reason), zap.String("answer", "bad_request"), zap.Error(terr))
		case !admitted:
			h.reject(w, r, st, pols)
			return
		}
	}
	h.decide(st, decBadRequest)
	detail := "The request cannot be judged unambiguously."
	var re *policy.RequestError
	if errors.As(err, &re) {
		detail = re.Detail()
	}
	st.buf = writeAnswer(w, r, st.buf[:0], answer.Problem{Type: answer.ProblemAmbiguous, Status: http.StatusBadRequest, Detail: detail})
	if taken && h.releaser != nil && st.mustGiveBack() {
		h.giveBack(r, st, http.StatusBadRequest)
	}
}
