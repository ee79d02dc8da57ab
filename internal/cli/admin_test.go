package cli

import "testing"

// TestDialable: the CLI reaches a listener on every address by loopback, one on an address by
// that address.
func TestDialable(t *testing.T) {
	for in, want := range map[string]string{":9090": "127.0.0.1:9090", "0.0.0.0:9090": "127.0.0.1:9090",
		"[::]:9090": "[::1]:9090", "10.0.0.7:9090": "10.0.0.7:9090", "[fd00::7]:9090": "[fd00::7]:9090",
		"console.internal:9090": "console.internal:9090"} {
		if got := dialable(in); got != want {
			t.Errorf("dialable(%q) = %q, want %q", in, got, want)
		}
	}
}
