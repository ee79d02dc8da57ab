package main

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct{ q, want float64 }{{0.5, 5}, {0.99, 10}, {0.1, 1}} {
		if got := quantile(xs, c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if !math.IsNaN(quantile(nil, 0.5)) {
		t.Error("quantile of nothing is not NaN")
	}
}

// settle is the time from the change until the limit stays, for good, within 25% of where it
// ended: an excursion after it entered the band restarts the count.
func TestSettle(t *testing.T) {
	var pts []limitPoint
	add := func(t0, t1, limit float64) {
		for x := t0; x < t1; x += 0.2 {
			pts = append(pts, limitPoint{T: x, Limit: limit})
		}
	}
	add(0, 10, 40)  // before the change at 10 s
	add(10, 11, 30) // falling: outside 20 +- 25%
	add(11, 12, 20) // in the band
	add(12, 12.4, 40)
	add(12.4, 20, 21) // in the band for good from 12.4 s
	if got := settle(pts, 10); math.Abs(got-2.4) > 0.01 {
		t.Errorf("settle = %v, want 2.4 (the excursion at 12 s restarts it)", got)
	}
	if got := settle([]limitPoint{{T: 0, Limit: 10}, {T: 1, Limit: 30}, {T: 5, Limit: 10}}, 0.5); got != 4.5 {
		t.Errorf("settle = %v, want 4.5 (out of the band at 1 s, back in at 5 s)", got)
	}
}
