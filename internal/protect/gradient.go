package protect

// The adaptive limit: a gradient controller in the family of Netflix's concurrency-limits
// (Gradient2) and Envoy's adaptive concurrency filter, shaped against their known failure modes.
//
//   - Latency is averaged over a window (at least windowMin long and windowSamples samples),
//     never taken from single requests: one slow request is noise, a slow window is a signal.
//     Each sample is capped where the gradient bottoms out, so one outlier cannot weigh more
//     than the whole window being that slow.
//   - The baseline is the lowest window average seen, which drifts up slowly toward what the
//     windows show (quickly while the limit is not in use, slowly while it is), so that a
//     permanently slower upstream is learnt. Near the floor (at most twice min_limit) it drifts
//     quickly too: there the latency is hardly our own queueing (we send about the least we
//     ever do), so a window slower than the baseline says the baseline is wrong (learnt from a
//     moment that did not last, or from samples that lied), and the limit grows back once the
//     baseline has caught up instead of staying at the floor for good. The limit never collapses to a floor to
//     re-measure the baseline (Envoy's minRTT probe, which drops success rates every interval).
//   - gradient = tolerance*baseline/window average, clamped to [0.5, 1]: while latency stays
//     within tolerance of the baseline the limit grows by sqrt(limit)/2 per window (only when
//     the limit is being used: an idle limit must not grow without bound), and past it shrinks
//     in proportion. The new value is smoothed into the old one, so it settles rather than
//     oscillates, and grows back as soon as the upstream recovers.
//
// Why gradient rather than Vegas: both compare latency to a baseline; Vegas steps the limit by
// fixed amounts around queue-size thresholds (alpha, beta), which with an upstream whose
// latency is proportional to its queue converges slowly from far off. The gradient's
// multiplicative step settles a halved capacity within a few windows (under a second at the
// default window), which is what the 5 s target asks.
//
// Where it settles: growth (sqrt(limit)/2) and shrinking (limit*(1-gradient)) balance at
// gradient = 1 - sqrt(limit)/(2*limit), so latency settles at tolerance/gradient times the
// baseline: about 1.4x at a limit of 15, 1.3x at 50. A larger growth step recovers faster but
// settles at a higher latency (sqrt(limit) gave 1.6x at 15).

import (
	"math"
	"time"
)

const (
	windowMin     = 100 * time.Millisecond
	windowSamples = 10
	tolerance     = 1.25 // a window this much slower than the baseline is not yet overload
	minGradient   = 0.5
	smoothing     = 0.3 // the new limit's weight against the old one, per window
	// The baseline's drift toward the window average when the window is slower, per window:
	// fast while the limit was not reached (the upstream itself got slower), slow while it
	// was (the latency may be our own queueing: learning it would let the limit creep up).
	driftIdle      = 0.05
	driftSaturated = 0.0005
)

// gradient is the controller's state; the Limiter fills its windows and calls update under
// its ctrlMu.
type gradient struct {
	min, max float64
	baseline float64 // seconds; 0 until the first window
}

func newGradient(lo, hi float64) gradient { return gradient{min: lo, max: hi} }

// update closes a window whose average latency was avg (seconds), in which the limit was in
// use (saturated: at least half of it in flight) or not, and returns the new limit.
func (g *gradient) update(avg float64, saturated bool, limit float64) float64 {
	switch {
	case g.baseline == 0 || avg < g.baseline:
		g.baseline = avg
	case saturated && limit > 2*g.min: // near the floor: as if idle (see above)
		g.baseline += (avg - g.baseline) * driftSaturated
	default:
		g.baseline += (avg - g.baseline) * driftIdle
	}
	grad := 1.0
	if avg > 0 {
		grad = math.Max(minGradient, math.Min(1, tolerance*g.baseline/avg))
	}
	next := limit * grad
	if grad == 1 && saturated {
		next += math.Sqrt(limit) / 2
	}
	next = limit*(1-smoothing) + next*smoothing
	return math.Max(g.min, math.Min(g.max, next))
}
