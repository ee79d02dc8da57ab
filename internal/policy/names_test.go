package policy

import (
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// TestAlgorithmNamesInverse: the names a policy's algorithm field accepts are limitterms's,
// which its bucket keys hash and its messages print, one for one.
func TestAlgorithmNamesInverse(t *testing.T) {
	for name, alg := range algorithms {
		if got := limitterms.AlgorithmName(alg); got != name {
			t.Errorf("algorithm %q reads as %d, whose name is %q", name, alg, got)
		}
	}
	if got, want := len(limitterms.AlgorithmNames()), len(algorithms); got != want {
		t.Errorf("limitterms names %d algorithms, a policy accepts %d", got, want)
	}
}
