package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Result is .cache/bench/scale.json: exactly these fields, all numbers (issue 10's contract).
type Result struct {
	Replicas          int     `json:"replicas"`
	PoolRate          float64 `json:"pool_rate"`
	PoolBurst         float64 `json:"pool_burst"`
	ItemWriteCapPerS  int     `json:"item_write_cap_per_s"`
	DurationS         float64 `json:"duration_s"`
	Offered           int64   `json:"offered"`
	Admitted          int64   `json:"admitted"`
	ExactBound        float64 `json:"exact_bound"`
	OverAdmits        float64 `json:"over_admits"`
	UnderAdmitRatio   float64 `json:"under_admit_ratio"`
	Writes            int64   `json:"writes"`
	WritesPerAdmitted float64 `json:"writes_per_admitted"`
	// HottestItemWritesPerS is the most writes one item was sent in one 1-s window (forwarded +
	// throttled: the demand on it, which the relay's cap cut).
	HottestItemWritesPerS int64   `json:"hottest_item_writes_per_s"`
	ThrottledWrites       int64   `json:"throttled_writes"`
	P99DecisionMs         float64 `json:"p99_decision_ms"`
	// StoreP50Ms and StoreP99Ms are the store's answer times as the relay saw them (every call,
	// the injected BENCH_SCALE_STORE_DELAY and _JITTER included), over the measurement.
	StoreP50Ms float64 `json:"store_p50_ms"`
	StoreP99Ms float64 `json:"store_p99_ms"`
	// Non200429 counts the answers that were neither 200 nor 429 (503s of on_error: deny,
	// timeouts, transport errors): a good run has none.
	Non200429 int64 `json:"non_200_429"`
}

// Phase is one phase's numbers in .cache/bench/scale-phases.json.
type Phase struct {
	Name      string  `json:"name"`
	DurationS float64 `json:"duration_s"`
	Offered   int64   `json:"offered"`
	Admitted  int64   `json:"admitted"`
	// ExactBound is what one exact bucket admits in the phase, which under_admit_ratio is
	// measured against: burst + rate x duration for the first phase (the bucket starts full),
	// rate x duration for later ones (offered twice the rate, an exact bucket is empty when a
	// phase ends).
	ExactBound float64 `json:"exact_bound"`
	// MaxBound is the most one exact bucket can admit in any interval as long as the phase,
	// burst + rate x duration, which over_admits is measured against. For a later phase it is
	// above ExactBound: leased units may be spent up to the lease TTL after their place, so a
	// phase may take a few that an exact bucket would have admitted in the phase before, and
	// never more than this.
	MaxBound        float64 `json:"max_bound"`
	OverAdmits      float64 `json:"over_admits"`
	UnderAdmitRatio float64 `json:"under_admit_ratio"`
	// Limited counts 429s; Other every answer that is neither 200 nor 429, and transport errors.
	Limited int64 `json:"limited"`
	Other   int64 `json:"other"`
	// Unsent counts requests the generator was due to send but had no free connection for; they
	// are not in Offered. A good run has none.
	Unsent int64 `json:"unsent"`
}

// phaseCounts is what the load generator counted in one phase.
type phaseCounts struct {
	name                                string
	durationS                           float64
	offered, ok, limited, other, unsent int64
}

// bounds returns the exact bound, the over-admits and the under-admit ratio of admitted
// requests against an exact bucket's bound.
func bounds(bound float64, admitted int64) (over, under float64) {
	a := float64(admitted)
	over = math.Max(0, a-bound)
	if bound > 0 && a < bound {
		under = (bound - a) / bound
	}
	return over, under
}

// phases turns the generator's counts into Phase records.
func phases(rate, burst float64, counts []phaseCounts) []Phase {
	out := make([]Phase, len(counts))
	for i, c := range counts {
		bound, most := rate*c.durationS, burst+rate*c.durationS
		if i == 0 {
			bound = most
		}
		_, under := bounds(bound, c.ok)
		over, _ := bounds(most, c.ok)
		out[i] = Phase{
			Name: c.name, DurationS: round(c.durationS, 3), Offered: c.offered, Admitted: c.ok,
			ExactBound: round(bound, 1), MaxBound: round(most, 1), OverAdmits: round(over, 1), UnderAdmitRatio: round(under, 5),
			Limited: c.limited, Other: c.other, Unsent: c.unsent,
		}
	}
	return out
}

// relayCounts is what the result needs from the relay's statistics.
type relayCounts struct {
	forwarded, throttled, hottest int64
	// storeP50 and storeP99 are the relay's answer times.
	storeP50, storeP99 time.Duration
}

// result builds the whole run's record.
func result(replicas int, rate, burst float64, itemCap int, counts []phaseCounts, relay relayCounts, p99Seconds float64) Result {
	var dur float64
	var offered, admitted, other int64
	for _, c := range counts {
		dur += c.durationS
		offered += c.offered
		admitted += c.ok
		other += c.other
	}
	bound := burst + rate*dur
	over, under := bounds(bound, admitted)
	r := Result{
		Replicas: replicas, PoolRate: rate, PoolBurst: burst, ItemWriteCapPerS: itemCap,
		DurationS: round(dur, 3), Offered: offered, Admitted: admitted,
		ExactBound: round(bound, 1), OverAdmits: round(over, 1), UnderAdmitRatio: round(under, 5),
		Writes: relay.forwarded, HottestItemWritesPerS: relay.hottest, ThrottledWrites: relay.throttled,
		P99DecisionMs: round(p99Seconds*1000, 4),
		StoreP50Ms:    round(relay.storeP50.Seconds()*1000, 2), StoreP99Ms: round(relay.storeP99.Seconds()*1000, 2),
		Non200429: other,
	}
	if admitted > 0 {
		r.WritesPerAdmitted = round(float64(relay.forwarded)/float64(admitted), 5)
	}
	return r
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// bucket is one cumulative histogram bucket: Count observations were <= UpperBound.
type bucket struct {
	UpperBound float64
	Count      float64
}

// histogram is a cumulative histogram, buckets ascending by upper bound (the last may be +Inf).
type histogram []bucket

// parseHistogram reads the named histogram from a Prometheus text exposition and returns its
// buckets summed over every label set.
func parseHistogram(r io.Reader, name string) (histogram, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	f, ok := fams[name]
	if !ok {
		return nil, nil
	}
	if f.GetType() != dto.MetricType_HISTOGRAM {
		return nil, fmt.Errorf("%s is a %v, not a histogram", name, f.GetType())
	}
	var hs []histogram
	for _, m := range f.GetMetric() {
		var h histogram
		for _, b := range m.GetHistogram().GetBucket() {
			h = append(h, bucket{b.GetUpperBound(), float64(b.GetCumulativeCount())})
		}
		// The text format's +Inf bucket is the sample count.
		h = append(h, bucket{math.Inf(1), float64(m.GetHistogram().GetSampleCount())})
		hs = append(hs, h)
	}
	return merge(hs...), nil
}

// sub is cumulative histogram a less b, an earlier scrape of the same histogram (same bounds;
// a nil b takes nothing off).
func sub(a, b histogram) histogram {
	if len(b) != len(a) {
		return a
	}
	out := make(histogram, len(a))
	for i := range a {
		out[i] = bucket{a[i].UpperBound, a[i].Count - b[i].Count}
	}
	return out
}

// merge sums cumulative histograms bucket by bucket. Histograms with different bounds are
// merged on the union of the bounds: a histogram's cumulative count at a bound it does not have
// is its count at its next lower bound (no observation is moved to a smaller bound).
func merge(hs ...histogram) histogram {
	set := map[float64]bool{}
	for _, h := range hs {
		for _, b := range h {
			set[b.UpperBound] = true
		}
	}
	les := make([]float64, 0, len(set))
	for le := range set {
		les = append(les, le)
	}
	sort.Float64s(les)
	out := make(histogram, len(les))
	for i, le := range les {
		out[i].UpperBound = le
		for _, h := range hs {
			out[i].Count += cumulativeAt(h, le)
		}
	}
	return out
}

func cumulativeAt(h histogram, le float64) float64 {
	var c float64
	for _, b := range h {
		if b.UpperBound > le {
			break
		}
		c = b.Count
	}
	return c
}

// quantile estimates the q-quantile of a cumulative histogram as Prometheus's
// histogram_quantile does: find the bucket that holds the rank q*total and interpolate linearly
// between its lower and upper bound (the lower bound of the first bucket is 0). A rank in the
// +Inf bucket returns the highest finite bound. An empty histogram gives NaN.
func quantile(q float64, h histogram) float64 {
	if len(h) == 0 {
		return math.NaN()
	}
	total := h[len(h)-1].Count
	if total == 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h {
		if b.Count >= rank && b.Count > below {
			if math.IsInf(b.UpperBound, 1) {
				return lower
			}
			return lower + (b.UpperBound-lower)*(rank-below)/(b.Count-below)
		}
		lower, below = b.UpperBound, b.Count
	}
	return lower
}

// diagnosed are the replicas' counters the report sums, to tell where capacity went: leases
// granted or found empty, units leased, refunded or expired, errors and the circuit breaker.
var diagnosed = []string{
	"ratelimit_dynamodb_leases_total",
	"ratelimit_dynamodb_lease_units_total",
	"ratelimit_dynamodb_errors_total",
	"ratelimit_dynamodb_throttled_total",
	"ratelimit_store_errors_total",
	"ratelimit_store_circuit_open_total",
	"ratelimit_store_fallback_decisions_total",
}

// addCounters adds the diagnosed counters in r (the text format) to sums, keyed by the name
// and the label pairs.
func addCounters(r io.Reader, sums map[string]float64) error {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return fmt.Errorf("parse metrics: %w", err)
	}
	for _, name := range diagnosed {
		f, ok := fams[name]
		if !ok || f.GetType() != dto.MetricType_COUNTER {
			continue
		}
		for _, m := range f.GetMetric() {
			k := name
			for _, l := range m.GetLabel() {
				k += " " + l.GetName() + "=" + l.GetValue()
			}
			sums[k] += m.GetCounter().GetValue()
		}
	}
	return nil
}
