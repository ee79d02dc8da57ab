package limitterms

import (
	"slices"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestStoreName: a pool wins over the namespace, a namespace wraps the name, and a bare name
// is left as it is; the three never meet (every key a gateway ever wrote depends on these bytes).
func TestStoreName(t *testing.T) {
	tests := []struct {
		namespace, name, pool, want string
	}{
		{"", "account", "", "account"},
		{"checkout", "account", "", "\x01ns\x00checkout\x00account"},
		{"", "account", "acme", "\x02pool\x00acme"},
		{"checkout", "account", "acme", "\x02pool\x00acme"},
		{"team", "\x03rls\x00edge", "", "\x01ns\x00team\x00\x03rls\x00edge"},
	}
	for _, tt := range tests {
		if got := StoreName(tt.namespace, tt.name, tt.pool); got != tt.want {
			t.Errorf("StoreName(%q, %q, %q) = %q, want %q", tt.namespace, tt.name, tt.pool, got, tt.want)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, s := range []string{"acme", "acme-account_2.v1", "A", ""} {
		if !ValidName(s) {
			t.Errorf("ValidName(%q) = false, want true", s)
		}
	}
	for _, s := range []string{"a b", "a/b", "a:b", "é", "a\x00"} {
		if ValidName(s) {
			t.Errorf("ValidName(%q) = true, want false", s)
		}
	}
}

func TestLoadZone(t *testing.T) {
	if z, err := LoadZone(""); err != nil || z != time.UTC {
		t.Errorf(`LoadZone("") = %v, %v, want UTC`, z, err)
	}
	if z, err := LoadZone("Europe/Berlin"); err != nil || z.String() != "Europe/Berlin" {
		t.Errorf("LoadZone(Europe/Berlin) = %v, %v", z, err)
	}
	for _, name := range []string{"Local", "Mars/Olympus"} {
		if z, err := LoadZone(name); err == nil {
			t.Errorf("LoadZone(%q) = %v, want an error", name, z)
		}
	}
}

func TestShortDuration(t *testing.T) {
	tests := map[time.Duration]string{
		time.Minute: "1m", time.Hour: "1h", 90 * time.Minute: "1h30m", -time.Minute: "-1m",
		1500 * time.Millisecond: "1.5s", 0: "0s", time.Hour + time.Second: "1h0m1s",
	}
	for d, want := range tests {
		if got := ShortDuration(d); got != want {
			t.Errorf("ShortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestAlgorithmNames(t *testing.T) {
	want := []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_window", "concurrency", "quota"}
	if got := AlgorithmNames(); !slices.Equal(got, want) {
		t.Errorf("AlgorithmNames() = %v, want %v", got, want)
	}
	if got := AlgorithmName(bucket.FixedWindow); got != "fixed_window" {
		t.Errorf("AlgorithmName(FixedWindow) = %q", got)
	}
	if got := AlgorithmName(bucket.Algorithm(200)); got != "" {
		t.Errorf("AlgorithmName(200) = %q, want empty", got)
	}
}

func TestCheckLeaseShape(t *testing.T) {
	for _, tc := range []struct {
		shards            int
		ttl               time.Duration
		field, value, msg string
	}{
		{0, 0, "", "", ""},
		{4, time.Second, "", "", ""},
		{-1, 0, "shards", "-1", "must be from 1 to 64"},
		{65, 0, "shards", "65", "must be from 1 to 64"},
		{2, -90 * time.Second, "ttl", "-1m30s", "must be positive"},
	} {
		field, value, msg := CheckLeaseShape(tc.shards, tc.ttl)
		if field != tc.field || value != tc.value || msg != tc.msg {
			t.Errorf("CheckLeaseShape(%d, %v) = %q, %q, %q; want %q, %q, %q", tc.shards, tc.ttl, field, value, msg, tc.field, tc.value, tc.msg)
		}
	}
}
