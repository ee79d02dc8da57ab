package limitterms

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestCheckLimit(t *testing.T) {
	tb := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 10, Burst: 20}
	on := func(shards int, ttl time.Duration) *Lease { return &Lease{Enabled: true, Shards: shards, TTL: ttl} }
	for _, c := range []struct {
		name   string
		lim    bucket.Limit
		offset int
		lease  *Lease
		cost   int64
		want   string // field of the one problem, "" for none
	}{
		{"bucket", tb, 0, nil, 1, ""},
		{"refill of 366 days", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1.0 / 86400, Burst: 366}, 0, nil, 1, ""},
		{"refill of 367 days", bucket.Limit{Algorithm: bucket.LeakyBucket, Rate: 1.0 / 86400, Burst: 367}, 0, nil, 1, "burst"},
		{"daily offset", bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Day}, 1, nil, 1, "offset"},
		{"weekly offset 6", bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Week}, 6, nil, 1, ""},
		{"weekly offset -1", bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Week}, -1, nil, 1, "offset"},
		{"monthly offset 28", bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Month}, 28, nil, 1, "offset"},
		{"lease off with fields", tb, 0, &Lease{Shards: 2}, 1, "lease.enabled"},
		{"lease of a quota", bucket.Limit{Algorithm: bucket.Quota, Count: 5, Period: bucket.Day}, 0, on(0, 0), 1, "lease.enabled"},
		{"lease shape", tb, 0, on(-1, 0), 1, "lease.shards"},
		{"more shards than burst", tb, 0, on(21, 0), 1, "lease.shards"},
		{"lease", tb, 0, on(2, 0), 1, ""},
		{"ttl past the burst", tb, 0, on(1, time.Hour), 1, "lease.ttl"},
		{"cost past a lease", tb, 0, on(2, 0), 20, "lease.shards"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := CheckLimit(c.lim, c.offset, c.lease, c.cost)
			switch {
			case c.want == "" && len(ps) != 0:
				t.Errorf("got %v, want none", ps)
			case c.want != "" && (len(ps) != 1 || ps[0].Field != c.want):
				t.Errorf("got %v, want one problem of %s", ps, c.want)
			}
		})
	}
}
