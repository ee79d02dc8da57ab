package simredis_test

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
	gen "github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/redislocal"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simredis"
)

// The differential test's size: SIMREDIS_DIFF_OPS operations (default 2,000) in runs of 250
// from seeds 1, 2, ...; SIMREDIS_DIFF_OUT names a JSON file that receives the counts (make sim
// puts them in its report). The real server is REDIS_URL's or, without it, one the test starts
// (package redislocal); with neither the test is skipped, and fails under CI=true.
const (
	opsVar     = "SIMREDIS_DIFF_OPS"
	outVar     = "SIMREDIS_DIFF_OUT"
	defaultOps = 2000
	runOps     = 250
)

var redis = redislocal.Lazy{Mode: redislocal.Single}

func TestMain(m *testing.M) {
	code := m.Run()
	redis.Stop()
	os.Exit(code)
}

// TestDifferentialAgainstRedis runs the Redis store on a real redis-server and on the simulated
// one with the same random sequences of operations (groups of charges of every algorithm, costs,
// shadow charges; give-backs, some sent twice; resets; peeks; exemptions put, deleted and
// listed), both stores with the same seeded markers and clock, and compares every answer, and
// every key (its type, fields or members, and time to live) after every third operation.
func TestDifferentialAgainstRedis(t *testing.T) {
	inst, err := redis.Get()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no real redis-server to compare the simulated one with: %v", err)
		}
		t.Skipf("no real redis-server to compare the simulated one with (REDIS_URL unset and none could start): %v", err)
	}
	url := inst.URLs[0]
	opt, err := redisstore.ClientOption(redisstore.DialOptions{URL: url, Mode: redisstore.ModeSingle})
	if err != nil {
		t.Fatal(err)
	}
	total := defaultOps
	if v := os.Getenv(opsVar); v != "" {
		if total, err = strconv.Atoi(v); err != nil || total < 1 {
			t.Fatalf("%s=%q: want a positive number", opsVar, v)
		}
	}
	var ops, mismatches int
	for seed := uint64(1); ops < total; seed++ {
		n := min(runOps, total-ops)
		real, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatalf("redis %s: %v", url, err)
		}
		m := runDiff(t, seed, n, real)
		real.Close()
		ops += n
		mismatches += m
	}
	t.Logf("%d operations, %d mismatches", ops, mismatches)
	if path := os.Getenv(outVar); path != "" {
		data, _ := json.Marshal(map[string]int{"operations": ops, "mismatches": mismatches})
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// side is one of the two servers with its store.
type side struct {
	name  string
	store *redisstore.Store
	keys  func(prefix string) []string
	do    func(cmd ...string) rueidis.RedisResult
}

func runDiff(t *testing.T, seed uint64, n int, real rueidis.Client) int {
	t.Helper()
	start := time.Unix(1_800_000_000, 0).Add(time.Duration(seed) * time.Hour)
	now := start
	clock := func() time.Time { return now }
	sim, err := simredis.Start(start)
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	// A prefix of this run's own on the shared real server; its keys are deleted at the end.
	prefix := fmt.Sprintf("simredis-diff-%d-%d:", time.Now().UnixNano(), seed)
	opts := func() redisstore.Options {
		r := mrand.New(mrand.NewPCG(seed, 7))
		// A slack of an hour: no key expires on the real server (on the wall clock) while the
		// run lasts, nor on the simulated one (on the run's clock).
		return redisstore.Options{KeyPrefix: prefix, Slack: time.Hour, SlotLease: time.Hour, Now: clock, Rand: r.Uint64}
	}
	ctx := context.Background()
	mk := func(name string, c rueidis.Client, keys func(string) []string) *side {
		return &side{name: name, store: redisstore.New(c, opts()), keys: keys,
			do: func(cmd ...string) rueidis.RedisResult { return c.Do(ctx, c.B().Arbitrary(cmd...).Build()) }}
	}
	simClient := sim.Client()
	a := mk("redis", real, func(p string) []string {
		ks, _ := real.Do(ctx, real.B().Keys().Pattern(p+"*").Build()).AsStrSlice()
		slices.Sort(ks)
		return ks
	})
	defer cleanUp(real, a.keys(prefix))
	b := mk("simredis", simClient, func(p string) []string {
		var out []string
		for _, k := range sim.Keys() {
			if strings.HasPrefix(k, p) {
				out = append(out, k)
			}
		}
		return out
	})
	// Each store owns its client (Close closes it): the real one is closed by the caller, the
	// simulated one with the server.
	rng := mrand.New(mrand.NewPCG(seed, 3))
	limits := []bucket.Limit{
		{Algorithm: bucket.TokenBucket, Rate: 3, Burst: 4},
		{Algorithm: bucket.TokenBucket, Rate: 0.7, Burst: 2},
		{Algorithm: bucket.LeakyBucket, Rate: 5, Burst: 3},
		{Algorithm: bucket.FixedWindow, Count: 5, Window: 2 * time.Second},
		{Algorithm: bucket.SlidingWindow, Count: 6, Window: 3 * time.Second},
		{Algorithm: bucket.Quota, Count: 7, Period: bucket.Day},
		{Algorithm: bucket.Concurrency, Count: 3},
	}
	charges := make([]bucket.Charge, 8)
	for i := range charges {
		charges[i] = bucket.Charge{Key: bucket.Key{byte(seed), byte(i), 0x5e}, Limit: limits[rng.IntN(len(limits))]}
	}
	var taken [][]bucket.Taken
	mismatches := 0
	mismatch := func(op int, what string, x, y any) {
		mismatches++
		if mismatches <= 10 {
			t.Errorf("seed %d op %d: %s: redis %v, simredis %v", seed, op, what, x, y)
		}
	}
	start0 := time.Now()
	for op := range n {
		now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		switch r := rng.IntN(100); {
		case r < 60:
			group := gen.Group(rng, charges, 10)
			ra, rb := make([]bucket.Result, len(group)), make([]bucket.Result, len(group))
			oka, erra := a.store.Take(ctx, now, group, ra)
			okb, errb := b.store.Take(ctx, now, group, rb)
			if oka != okb || (erra != nil) != (errb != nil) || !slices.Equal(ra, rb) {
				mismatch(op, fmt.Sprintf("take %v", costs(group)), fmt.Sprint(oka, ra, erra), fmt.Sprint(okb, rb, errb))
			}
			if oka && erra == nil {
				var tk []bucket.Taken
				for i, c := range group {
					if ra[i].Allowed && !c.Shadow {
						tk = append(tk, bucket.Taken{Charge: c, At: now, Token: ra[i].Token})
					}
				}
				taken = append(taken, tk)
			}
		case r < 75 && len(taken) > 0:
			i := rng.IntN(len(taken))
			tk := taken[i]
			if rng.IntN(3) > 0 { // a third are given back again (a re-sent give-back)
				taken = slices.Delete(taken, i, i+1)
			}
			erra, errb := a.store.Release(ctx, now, tk), b.store.Release(ctx, now, tk)
			if (erra != nil) != (errb != nil) {
				mismatch(op, "release", erra, errb)
			}
		case r < 80:
			c := charges[rng.IntN(len(charges))]
			erra, errb := a.store.Reset(ctx, now, c), b.store.Reset(ctx, now, c)
			if (erra != nil) != (errb != nil) {
				mismatch(op, "reset", erra, errb)
			}
		case r < 90:
			c := charges[rng.IntN(len(charges))]
			pa, erra := a.store.Peek(ctx, now, c)
			pb, errb := b.store.Peek(ctx, now, c)
			if pa != pb || (erra != nil) != (errb != nil) {
				mismatch(op, "peek", fmt.Sprint(pa, erra), fmt.Sprint(pb, errb))
			}
		default:
			id := "x" + strconv.Itoa(rng.IntN(6))
			switch rng.IntN(3) {
			case 0:
				exp := now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
				data := []byte(`{"id":"` + id + `"}`)
				most := 1 + rng.IntN(5)
				fa, erra := a.store.PutExemption(ctx, id, data, exp, most)
				fb, errb := b.store.PutExemption(ctx, id, data, exp, most)
				if fa != fb || (erra != nil) != (errb != nil) {
					mismatch(op, "put exemption", fmt.Sprint(fa, erra), fmt.Sprint(fb, errb))
				}
			case 1:
				fa, erra := a.store.DeleteExemption(ctx, id)
				fb, errb := b.store.DeleteExemption(ctx, id)
				if fa != fb || (erra != nil) != (errb != nil) {
					mismatch(op, "delete exemption", fmt.Sprint(fa, erra), fmt.Sprint(fb, errb))
				}
			default:
				la, erra := a.store.Exemptions(ctx)
				lb, errb := b.store.Exemptions(ctx)
				if fmt.Sprintf("%s", la) != fmt.Sprintf("%s", lb) || (erra != nil) != (errb != nil) {
					mismatch(op, "exemptions", fmt.Sprintf("%s %v", la, erra), fmt.Sprintf("%s %v", lb, errb))
				}
			}
		}
		if op%3 == 2 {
			if d := sameKeys(dump(a, prefix), dump(b, prefix), time.Since(start0)); d != "" {
				mismatches++
				if mismatches <= 10 {
					t.Errorf("seed %d op %d: keys differ: %s", seed, op, d)
				}
			}
		}
	}
	return mismatches
}

func costs(cs []bucket.Charge) []int64 {
	out := make([]int64, len(cs))
	for i := range cs {
		out[i] = cs[i].N()
	}
	return out
}

// entry is one key as dump sees it.
type entry struct {
	content string
	ttl     int64 // ms; -1: none
}

// dump is every key of prefix on s: its type and contents, and its time to live.
func dump(s *side, prefix string) map[string]entry {
	out := map[string]entry{}
	for _, k := range s.keys(prefix) {
		var b strings.Builder
		typ, _ := s.do("TYPE", k).ToString()
		b.WriteString(typ + " ")
		switch typ {
		case "hash":
			m, _ := s.do("HGETALL", k).AsStrMap()
			fields := make([]string, 0, len(m))
			for f, v := range m {
				fields = append(fields, f+"="+v)
			}
			slices.Sort(fields)
			b.WriteString(strings.Join(fields, ","))
		case "zset":
			// Members, then each one's score (RESP3 and RESP2 answer WITHSCORES differently).
			zs, _ := s.do("ZRANGE", k, "0", "-1").AsStrSlice()
			for _, m := range zs {
				sc, _ := s.do("ZSCORE", k, m).AsFloat64()
				fmt.Fprintf(&b, "%s:%.0f,", m, sc)
			}
		}
		ttl, _ := s.do("PTTL", k).AsInt64()
		out[strings.TrimPrefix(k, prefix)] = entry{b.String(), ttl}
	}
	return out
}

// sameKeys compares the keys of the real server (a) and the simulated one (b): the same
// contents, and times to live that differ by no more than the real server's clock moved since
// the run began (its count down runs on the wall clock, the simulated one's on the run's).
func sameKeys(a, b map[string]entry, slack time.Duration) string {
	var diffs []string
	for k, ea := range a {
		eb, ok := b[k]
		switch {
		case !ok:
			diffs = append(diffs, k+": only on redis")
		case ea.content != eb.content:
			diffs = append(diffs, fmt.Sprintf("%s: redis %s, simredis %s", k, ea.content, eb.content))
		case (ea.ttl < 0) != (eb.ttl < 0) || ea.ttl > eb.ttl || eb.ttl-ea.ttl > slack.Milliseconds()+1000:
			diffs = append(diffs, fmt.Sprintf("%s: ttl redis %dms, simredis %dms", k, ea.ttl, eb.ttl))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, k+": only on simredis")
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "; ")
}

func cleanUp(c rueidis.Client, keys []string) {
	if len(keys) > 0 {
		c.Do(context.Background(), c.B().Del().Key(keys...).Build())
	}
}
