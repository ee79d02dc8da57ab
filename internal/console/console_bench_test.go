package console

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// BenchmarkObserve is the console's hook for one request of three charges (the sketch update and
// the series count of each, and the exemption check), on one key per policy.
func BenchmarkObserve(b *testing.B) {
	c, err := New(Options{Policies: func() *policy.Set { return nil }, Pseudonyms: policy.NewPseudonyms(nil)})
	if err != nil {
		b.Fatal(err)
	}
	l := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1, Burst: 10}
	p := &policy.Plan{}
	for i, name := range []string{"per-ip", "per-key", "global"} {
		p.Charges = append(p.Charges, bucket.Charge{Key: bucket.Key{byte(i)}, Limit: l})
		p.Policies = append(p.Policies, &policy.Policy{Name: name, Index: i, KeyKind: "global"})
	}
	res := make([]bucket.Result, 3)
	now := time.Unix(1_700_000_000, 0)
	b.ReportAllocs()
	for b.Loop() {
		c.Adjust(p)
		c.Observe(now, p, res)
	}
}
