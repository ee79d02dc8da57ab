package policy

import (
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitspec"
)

// TestAlgorithmNamesInverse: the names a policy's algorithm field accepts are limitspec's,
// which its bucket keys hash and its messages print, one for one.
func TestAlgorithmNamesInverse(t *testing.T) {
	for name, alg := range algorithms {
		if got := limitspec.AlgorithmName(alg); got != name {
			t.Errorf("algorithm %q reads as %d, whose name is %q", name, alg, got)
		}
	}
	if got, want := len(limitspec.AlgorithmNames()), len(algorithms); got != want {
		t.Errorf("limitspec names %d algorithms, a policy accepts %d", got, want)
	}
}
