package protect

import "time"

// Outcome is what became of a request that held a slot, as far as the upstream's latency is
// concerned.
type Outcome uint8

const (
	// NotSent: the request never reached the upstream.
	NotSent Outcome = iota
	// Answered: the upstream's answer (its headers) came.
	Answered
	// Failed: the upstream failed it (a timeout, a reset) while its client was still there.
	Failed
	// Abandoned: the client left, or its body failed, before the answer came.
	Abandoned
)

// Latency is the sample an adaptive limit learns from for a request whose body was all handed
// on at sent (zero: it never ended) and whose outcome o came at at: the upstream's own time,
// from the end of the request's body to the answer's headers (or its failure). ok is false when
// the request says nothing about the upstream: it never reached it, its client left (the time
// until then is the client's, not a latency), or its body had not ended when the answer came
// (the upstream answered early, or the body streams beside the answer). Leaving these out,
// rather than counting them, is what keeps a client from moving the limit: otherwise requests
// abandoned after 3 ms teach a 40 ms upstream a 3 ms baseline, and a slow upload passes for a
// slow upstream.
func Latency(o Outcome, sent, at time.Time) (d time.Duration, ok bool) {
	if o != Answered && o != Failed || sent.IsZero() || at.Before(sent) {
		return 0, false
	}
	return at.Sub(sent), true
}
