package ddbrelay

import (
	"math/bits"
	"time"
)

// Latency summarises how long the relay took to answer calls: from the moment a request
// arrived to the moment its answer was written, the injected delay included. It is what a
// client of the relay sees as the store's latency, less its own network hop.
type Latency struct {
	// Count is how many calls were answered.
	Count int64
	// P50, P99 and Max are quantiles of the answer times. P50 and P99 come from a log-linear
	// histogram and are within 1/64 (1.6%) of the exact quantile; Max is exact.
	P50, P99, Max time.Duration
}

// histogram counts durations in log-linear buckets of microseconds: exact below 128 µs, then
// 64 buckets per power of two (a bucket's width is at most 1/64 of its lower bound). A fixed
// array keeps Stats cheap and memory bounded however long the relay runs.
type histogram struct {
	counts [histBuckets]int64
	n      int64
	max    time.Duration
}

const (
	histLinear  = 128
	histSub     = 64
	histBuckets = histLinear + 58*histSub // up to 2^64 µs
)

func bucketOf(d time.Duration) int {
	us := uint64(max(d, 0) / time.Microsecond)
	if us < histLinear {
		return int(us)
	}
	e := bits.Len64(us) - 7 // us>>e lies in [64, 128)
	return histLinear + (e-1)*histSub + int(us>>e) - histSub
}

// bucketMid is the middle of bucket i's range, in the unit of the histogram.
func bucketMid(i int) time.Duration {
	if i < histLinear {
		return time.Duration(i) * time.Microsecond
	}
	e := (i-histLinear)/histSub + 1
	lo := uint64(histSub+(i-histLinear)%histSub) << e
	return time.Duration(lo+(uint64(1)<<e)/2) * time.Microsecond
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.n++
	h.max = max(h.max, d)
}

// quantile returns the q-quantile (0 < q <= 1): the smallest recorded bucket at or below which
// lie at least q of the samples, capped at the exact maximum.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(q*float64(h.n) + 0.999999999)
	rank = min(max(rank, 1), h.n)
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(bucketMid(i), h.max)
		}
	}
	return h.max
}

func (h *histogram) summary() Latency {
	return Latency{Count: h.n, P50: h.quantile(0.50), P99: h.quantile(0.99), Max: h.max}
}
