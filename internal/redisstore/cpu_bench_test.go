package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
)

// BenchmarkRedisCost is the server's side of one decision, which the gateway's CPU hides in
// end-to-end runs: Redis's own CPU (INFO cpu, user + sys) and commands (INFO stats) per
// decision, over 1,000 keys charged in turn, for the algorithms envoyproxy/ratelimit's users
// bring (fixed window) and the default one (token bucket). Read redis-µs/op as a ratio between
// two builds on the same server: the server's CPU counts everything it did meanwhile.
func BenchmarkRedisCost(b *testing.B) {
	for _, bc := range []struct {
		name  string
		limit bucket.Limit
	}{
		{"FixedWindow", bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1 << 40, Window: time.Hour}},
		{"TokenBucket", bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1 << 30, Burst: 1 << 40}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, _ := newClient(b, &single)
			defer c.Close()
			s := newStore(b, &single)
			keys := make([]bucket.Key, 1000)
			for i := range keys {
				keys[i] = buckettest.NewKey(b)
			}
			ctx := context.Background()
			charges := make([]bucket.Charge, 1)
			results := make([]bucket.Result, 1)
			cpu0, cmds0 := redisCounters(b, ctx, c)
			i := 0
			for b.Loop() {
				charges[0] = bucket.Charge{Key: keys[i%len(keys)], Limit: bc.limit}
				if ok, err := s.Take(ctx, time.Now(), charges, results); err != nil || !ok {
					b.Fatalf("take: %v %v", ok, err)
				}
				i++
			}
			cpu1, cmds1 := redisCounters(b, ctx, c)
			b.ReportMetric((cpu1-cpu0)*1e6/float64(b.N), "redis-µs/op")
			b.ReportMetric((cmds1-cmds0-1)/float64(b.N), "redis-cmds/op") // one INFO between
		})
	}
}

// redisCounters reads the server's CPU seconds (user + sys) and commands processed.
func redisCounters(b *testing.B, ctx context.Context, c rueidis.Client) (cpu, cmds float64) {
	b.Helper()
	info, err := c.Do(ctx, c.B().Info().Section("cpu").Section("stats").Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(v, 64)
		switch k {
		case "used_cpu_user", "used_cpu_sys":
			cpu += f
		case "total_commands_processed":
			cmds = f
		}
	}
	return cpu, cmds
}
