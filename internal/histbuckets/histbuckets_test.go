package histbuckets

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestRangeReadsAsWritten: the bounds print without float noise, span lo to hi exactly, and
// still increase.
func TestRangeReadsAsWritten(t *testing.T) {
	b := Range(1e-3, 60, 12)
	if b[0] != 1e-3 || b[len(b)-1] != 60 || len(b) != 12 {
		t.Fatalf("got %v, want 12 bounds from 0.001 to 60", b)
	}
	if !slices.IsSorted(b) || len(slices.Compact(slices.Clone(b))) != len(b) {
		t.Errorf("bounds not strictly increasing: %v", b)
	}
	for _, lohi := range [][2]float64{{10e-6, 1}, {100e-6, 10}, {1e-6, 0.1}, {1e-3, 60}} {
		for _, v := range Range(lohi[0], lohi[1], 11) {
			e := strconv.FormatFloat(v, 'e', -1, 64) // 3.16e-05: its mantissa is what is written
			if mantissa, _, _ := strings.Cut(e, "e"); len(strings.ReplaceAll(mantissa, ".", "")) > 3 {
				t.Errorf("Range(%v, %v): bound %s", lohi[0], lohi[1], e)
			}
		}
	}
}
