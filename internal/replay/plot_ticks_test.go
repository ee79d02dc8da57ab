package replay

import "testing"

// TestTickLabelsWithoutFloatNoise: axis labels are the numbers a person would write.
func TestTickLabelsWithoutFloatNoise(t *testing.T) {
	for in, want := range map[float64]string{1.2000000000000002: "1.2", 60.00000000000007: "60", 250: "250", 0.30000000000000004: "0.3", 1e6: "1000000", 0.125: "0.125"} {
		if got := tickLabel(in); got != want {
			t.Errorf("tickLabel(%v) = %q, want %q", in, got, want)
		}
	}
	// And the ticks of a range whose steps accumulate noise.
	for _, tk := range (plainTicks{}).Ticks(0, 1.4) {
		if tk.Label != "" && len(tk.Label) > 4 {
			t.Errorf("tick %v labelled %q", tk.Value, tk.Label)
		}
	}
}
