package exactmutant_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestProductionBuildHasNoMutants: the gateway built without the tag does not even import this
// package; built with it, it does (the control: the check can fail).
func TestProductionBuildHasNoMutants(t *testing.T) {
	const pkg = "github.com/ratelimit-proxy/ratelimit-proxy/internal/exactmutant"
	for _, tags := range []string{"", "exactmutant"} {
		out, err := exec.Command("go", "list", "-deps", "-tags", tags, "../../cmd/ratelimit-proxy").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags %q: %v\n%s", tags, err, out)
		}
		got := slices.Contains(strings.Fields(string(out)), pkg)
		if want := tags != ""; got != want {
			t.Errorf("built with tags %q: imports %s = %t, want %t", tags, pkg, got, want)
		}
	}
}
