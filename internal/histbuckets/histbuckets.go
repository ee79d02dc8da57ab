// Package histbuckets makes Prometheus histogram bounds that read as written.
package histbuckets

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Range is prometheus.ExponentialBucketsRange with each bound rounded to three significant
// digits: the library's repeated multiplication yields bounds such as 0.00010000000000000003
// and 60.00000000000007, which every scrape then carries as an le label.
func Range(lo, hi float64, n int) []float64 {
	b := prometheus.ExponentialBucketsRange(lo, hi, n)
	for i, v := range b {
		b[i] = round3(v)
	}
	return b
}

func round3(v float64) float64 {
	r, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	if err != nil {
		return v
	}
	return r
}
