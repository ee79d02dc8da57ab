package proxy

// The verdict rendered: a 429 of the limit it names (pre-rendered per policy while the numbers
// stay the same), or the admitted request's headers, hold and forward.

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/answer"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/verdict"
)

// policyState is what the handler keeps per policy name: its counters, resolved once instead of
// per request, and the last 429 it rendered, reused while a client keeps being rejected with the
// same numbers (a hammering client sees the same Retry-After for a whole second).
type policyState struct {
	counters *policyCounters
	last     atomic.Pointer[rejection]
	lastGRPC atomic.Pointer[grpcRejection]
	// exemplarAt is when the limited counter last got an exemplar (Unix ns; see countLimited).
	exemplarAt atomic.Int64
}

// rejection is a pre-rendered 429 of one policy: the problem body and the header values, shared
// read-only by every response that carries the same numbers. The header slices have capacity 1,
// so Header.Add copies instead of writing into them.
type rejection struct {
	typ                 string // problem type: rate-limited or concurrency-limited
	retry, limit, reset int64
	cost, remaining     int64 // remaining is 0 unless cost > 1
	retryAfter          []string
	vals                [3]string // X-RateLimit-Limit, -Remaining, -Reset
	body                []byte
}

func newRejection(typ, name string, retry, limit, reset, cost, remaining int64) *rejection {
	r := &rejection{typ: typ, retry: retry, limit: limit, reset: reset, cost: cost, remaining: remaining, retryAfter: answer.RetryAfter(retry)}
	r.vals = [3]string{strconv.FormatInt(limit, 10), strconv.FormatInt(remaining, 10), strconv.FormatInt(reset, 10)}
	r.body = answer.AppendProblem(nil, answer.Problem{Type: typ, Status: http.StatusTooManyRequests,
		Policy: name, RetryAfter: retry, Cost: cost, Remaining: remaining})
	return r
}

// policyOf returns p's state: from the slot of p's index in the set (one load and a pointer
// comparison per charge, no lookup by name), else, the first time a set's policy is seen, by
// name (policy), installing it in the slot. A reload's new policies take over their slots; a
// slot whose index holds another set's policy is simply replaced.
func (h *Handler) policyOf(p *policy.Policy) *policyState {
	if s := h.slots.Load(); s != nil && p.Index >= 0 && p.Index < len(*s) {
		if sl := (*s)[p.Index]; sl.pol == p {
			return sl.st
		}
	}
	st := h.policy(p.Name)
	if p.Index < 0 || p.Index >= maxSlots {
		return st
	}
	h.slotMu.Lock()
	defer h.slotMu.Unlock()
	var next []policySlot
	if old := h.slots.Load(); old != nil {
		next = slices.Clone(*old)
	}
	if p.Index >= len(next) {
		next = append(next, make([]policySlot, p.Index+1-len(next))...)
	}
	next[p.Index] = policySlot{pol: p, st: st}
	h.slots.Store(&next)
	return st
}

// policySlot is the state of the policy at one index of the set in force.
type policySlot struct {
	pol *policy.Policy
	st  *policyState
}

// maxSlots bounds the slots: policies beyond it (more than any configuration has) are found by
// name.
const maxSlots = 1024

// policy returns name's state, creating it on first use. Like the counters, the states of
// policies that a reload removed stay (one small value per name ever configured).
func (h *Handler) policy(name string) *policyState {
	if v, ok := h.byPolicy.Load(name); ok {
		return v.(*policyState)
	}
	v, _ := h.byPolicy.LoadOrStore(name, &policyState{counters: h.m.policyCounters(name)})
	return v.(*policyState)
}

// reject answers 429 for a group the limiter did not admit, describing the limit the verdict
// names (verdict.Of: the enforced policy that asks for the longest wait). Only the rejecting
// non-shadow charges are counted (result="limited"): nothing was committed for the others, so
// counting them as allowed would overstate what reached the upstream.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	charges, results, ps := st.plan.Charges, st.results[:len(st.plan.Charges)], st.plan.Policies
	for i := range charges {
		if !charges[i].Shadow && !results[i].Allowed {
			h.countLimited(h.policyOf(ps[i]), &st.plan, i, st.now)
		}
	}
	pick := verdict.Of(charges, results)
	if pick < 0 {
		pick = 0 // the store broke its contract (rejected a group of shadow charges only)
	}
	h.decide(st, decLimited)
	res := results[pick]
	retry := max(answer.CeilSeconds(res.RetryAfter), 1)
	name := ps[pick].Name
	st.rejector = name
	if ce := h.log.Check(zap.InfoLevel, "rate limited"); ce != nil {
		ce.Write(zap.String("policy", name), h.logKey(&st.plan, pick),
			zap.Int64("retry_after_seconds", retry), zap.String("protocol", protocolNames[st.proto]))
	}
	cost := charges[pick].N()
	res.Remaining = verdict.Remaining(&charges[pick], &res, false) // a rejected group commits nothing
	typ := answer.ProblemRateLimited
	if charges[pick].Limit.Algorithm == bucket.Concurrency {
		typ = answer.ProblemConcurrency
	}
	pickState := h.policyOf(ps[pick])
	hc := pols.Headers()
	if st.grpc {
		h.rejectGRPC(w, r, st, hc, pick, pickState, typ, res, retry)
		return
	}
	if hc.IETF {
		st.buf = setRateLimitHeaders(w.Header(), st.buf[:0], hc, st, pick, res)
		st.buf = answer.WriteProblem(w, st.buf[:0], answer.Problem{Type: typ, Status: http.StatusTooManyRequests,
			Policy: name, RetryAfter: retry, Cost: cost, Remaining: res.Remaining})
		return
	}
	// The common case: reuse the policy's last rendering when the numbers are the same.
	reset := answer.ResetValue(hc.Reset == policy.ResetDelta, st.now, res.Reset)
	rj := pickState.last.Load()
	if rj == nil || rj.typ != typ || rj.retry != retry || rj.limit != res.Limit || rj.reset != reset || rj.cost != cost || rj.remaining != res.Remaining {
		rj = newRejection(typ, name, retry, res.Limit, reset, cost, res.Remaining)
		pickState.last.Store(rj)
	}
	hdr := w.Header()
	hdr[answer.HeaderLimit] = rj.vals[0:1:1]
	hdr[answer.HeaderRemaining] = rj.vals[1:2:2]
	hdr[answer.HeaderReset] = rj.vals[2:3:3]
	answer.SetProblemHeaders(hdr, rj.retryAfter)
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(rj.body) // the client may be gone; there is nobody left to tell
}

// admit counts, sets the headers of the limit the verdict names (verdict.Of: the enforced
// charge with the least Remaining), holds a leaky-bucket request if needed and forwards.
func (h *Handler) admit(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	charges, results, ps := st.plan.Charges, st.results[:len(st.plan.Charges)], st.plan.Policies
	var wait time.Duration
	for i := range charges {
		c := h.policyOf(ps[i]).counters
		if !results[i].Allowed {
			// Only a shadow charge can fail in an admitted group.
			c.ShadowLimited.Inc()
			if ce := h.log.Check(zap.InfoLevel, "shadow limit exceeded"); ce != nil {
				ce.Write(zap.String("policy", ps[i].Name), h.logKey(&st.plan, i))
			}
			continue
		}
		c.Allowed.Inc()
		if charges[i].Shadow {
			// A shadow policy never shapes traffic either: its wait is ignored.
			continue
		}
		wait = max(wait, results[i].Wait)
	}
	h.decide(st, decAllowed)
	if pick := verdict.Of(charges, results); pick >= 0 {
		st.buf = setRateLimitHeaders(w.Header(), st.buf[:0], pols.Headers(), st, pick, results[pick])
	}
	if wait > 0 {
		if dl, ok := r.Context().Deadline(); ok && st.grpc && st.now.Add(wait).After(dl) {
			// Holding a call that its caller will abandon before its turn would only keep a
			// stream open for nothing.
			callDeadline(w, r, "The call's deadline ends before its turn in the rate limiter's queue.")
			return
		}
		h.m.leakyWait.Observe(wait.Seconds())
		if err := h.wait(r.Context(), wait); err != nil {
			if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
				callDeadline(w, r, "The call's deadline passed in the rate limiter's queue.")
				return
			}
			if r.Context().Err() != nil {
				h.m.canceled[stageWait].Inc()
				return
			}
			h.log.Error("leaky-bucket wait failed", zap.Error(err))
			writeAnswer(w, r, nil, answer.Problem{Type: answer.ProblemUnavailable, Status: http.StatusServiceUnavailable,
				Detail: "The request could not be scheduled; retry shortly.", RetryAfter: 1})
			return
		}
	}
	h.forward(w, r, st, pols)
}

// forward hands the request to the reverse proxy. The request's policy set travels in its
// context only when the rewrite needs it, to judge an inbound X-Forwarded-For, -Proto or -Host:
// copying the request for a new context costs two allocations, and most requests carry none of
// them.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, st *reqState, pols Policies) {
	rp := h.rp
	if st.grpc {
		rp = h.rpGRPC
	}
	st.plan.StripUnjudged(r.Header) // see judged.go
	h.upgrades.reviewHopByHop(r.Header)
	if len(r.Header["X-Forwarded-For"]) > 0 || len(r.Header["X-Forwarded-Proto"]) > 0 ||
		len(r.Header["X-Forwarded-Host"]) > 0 {
		r = r.WithContext(context.WithValue(r.Context(), policiesKey{}, pols))
	}
	if h.prot != nil {
		h.sendGuarded(w, r, st, rp, pols)
		return
	}
	h.send(w, r, st, rp)
}

// logKey is the "key" field of a log line about charge i of p: the pseudonym of its key value
// (see policy.Pseudonyms), never the value, nor the bucket key, which is an unkeyed digest of the
// policy and the value that small key spaces (every IPv4 address, numeric user ids) could be
// searched for. Lines are sampled, so the HMAC is not paid per request.
func (h *Handler) logKey(p *policy.Plan, i int) zap.Field {
	kind := p.Policies[i].KeyKind
	if kind == "global" {
		return zap.String("key", "global")
	}
	return zap.String("key", h.pseudonyms.Of(kind, p.KeyValue(i)))
}
