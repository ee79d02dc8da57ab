package ddbrelay

import (
	"testing"
	"time"
)

func TestHistogramIsExactBelow128usAndWithin1Over64Above(t *testing.T) {
	for us := range 128 {
		d := time.Duration(us) * time.Microsecond
		if got := bucketMid(bucketOf(d)); got != d {
			t.Fatalf("%v lands in a bucket reported as %v, want exact", d, got)
		}
	}
	prev := bucketOf(127 * time.Microsecond)
	for d := 128 * time.Microsecond; d < 100*time.Second; d = d*101/100 + time.Microsecond {
		b := bucketOf(d)
		if b < prev {
			t.Fatalf("bucket of %v is %d, below the bucket %d of a smaller duration", d, b, prev)
		}
		prev = b
		got := bucketMid(b)
		if diff := (got - d).Abs(); float64(diff) > float64(d)/64 {
			t.Fatalf("%v reported as %v: off by %v, more than 1/64", d, got, diff)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	if got := h.summary(); got != (Latency{}) {
		t.Errorf("empty summary got %+v, want zero", got)
	}
	// 1..1000 ms: the median is 500 ms, the 99th percentile 990 ms, the maximum 1 s.
	for i := 1000; i >= 1; i-- {
		h.record(time.Duration(i) * time.Millisecond)
	}
	got := h.summary()
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if diff := (got - want).Abs(); float64(diff) > float64(want)/64 {
			t.Errorf("%s got %v, want %v within 1/64", what, got, want)
		}
	}
	if got.Count != 1000 || got.Max != time.Second {
		t.Errorf("count %d max %v, want 1000 and 1s", got.Count, got.Max)
	}
	near("p50", got.P50, 500*time.Millisecond)
	near("p99", got.P99, 990*time.Millisecond)

	// One sample: every quantile is it, never above the exact maximum.
	var one histogram
	one.record(777777 * time.Microsecond)
	if s := one.summary(); s.P50 > s.Max || s.P99 > s.Max || s.Max != 777777*time.Microsecond {
		t.Errorf("one sample got %+v, want quantiles at most the max 777.777ms", s)
	}
}
