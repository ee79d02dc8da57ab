package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// sameAnswers is the check that our RLS and envoyproxy/ratelimit answer one deterministic
// sequence of calls alike on their fixed windows (rules: sameRules).
type sameAnswers struct {
	Seed  uint64 `json:"seed"`
	Calls int    `json:"calls"`
	// OverLimit is how many calls of the sequence ours refused: the sequence runs into its limits.
	OverLimit int `json:"over_limit"`
	// Mismatches against theirs with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, the behaviour
	// ours always has (a refused call counts nowhere); FirstMismatch names the first.
	Mismatches    int    `json:"mismatches"`
	FirstMismatch string `json:"first_mismatch,omitempty"`
	// MismatchesDefault: against theirs in its default, which counts a refused call against the
	// call's other descriptors (docs/envoy.md lists the difference); calls of two descriptors
	// show it.
	MismatchesDefault int `json:"mismatches_their_default"`
	Attempts          int `json:"attempts"`
}

// sameSequence is the deterministic sequence: calls of one or two descriptors over a few users, a
// value-specific rule, and a nested route/method rule; run names this attempt's values, so that a
// retry starts on fresh counters (the vip rule is value-specific: its counter is the minute's).
func sameSequence(seed uint64, n int, run string) []*pb.RateLimitRequest {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	d := func(kv ...string) *rlext.RateLimitDescriptor {
		var e []*rlext.RateLimitDescriptor_Entry
		for i := 0; i < len(kv); i += 2 {
			e = append(e, &rlext.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return &rlext.RateLimitDescriptor{Entries: e}
	}
	user := func() *rlext.RateLimitDescriptor {
		if rng.IntN(4) == 0 {
			return d("user", "vip")
		}
		return d("user", "u"+strconv.Itoa(rng.IntN(12))+"-"+run)
	}
	route := func() *rlext.RateLimitDescriptor {
		r := "/r" + strconv.Itoa(rng.IntN(8)) + "-" + run
		if rng.IntN(2) == 0 {
			return d("route", r, "method", "POST")
		}
		return d("route", r)
	}
	out := make([]*pb.RateLimitRequest, n)
	for i := range out {
		var ds []*rlext.RateLimitDescriptor
		switch rng.IntN(3) {
		case 0:
			ds = []*rlext.RateLimitDescriptor{user()}
		case 1:
			ds = []*rlext.RateLimitDescriptor{route()}
		default:
			ds = []*rlext.RateLimitDescriptor{user(), route()}
		}
		out[i] = &pb.RateLimitRequest{Domain: "same", Descriptors: ds}
	}
	return out
}

// answer is a call's overall code and each descriptor's, as one comparable string.
func answer(r *pb.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, s := range r.GetStatuses() {
		b.WriteString(" " + s.GetCode().String())
	}
	return b.String()
}

func describe(r *pb.RateLimitRequest) string {
	var parts []string
	for _, d := range r.GetDescriptors() {
		var e []string
		for _, x := range d.GetEntries() {
			e = append(e, x.GetKey()+"="+x.GetValue())
		}
		parts = append(parts, "("+strings.Join(e, ",")+")")
	}
	return strings.Join(parts, " ")
}

// integrationSequence is a deterministic sequence over the rule files of envoyproxy/ratelimit's
// own integration tests (test/integration/runtime/current/ratelimit/config in their checkout),
// served unchanged: the domains basic, another and share-threshold-test, keyed by the run so
// that a retry starts on fresh counters. It leaves out their per-second rules (key1,
// key1_local): a second's edge between the two systems' calls would tell them apart. Wildcard
// values (files/*) share one counter with share_threshold and count per value without it.
func integrationSequence(seed uint64, n int, run string) []*pb.RateLimitRequest {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	entry := func(k, v string) *rlext.RateLimitDescriptor {
		return &rlext.RateLimitDescriptor{Entries: []*rlext.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	out := make([]*pb.RateLimitRequest, n)
	for i := range out {
		user := "u" + strconv.Itoa(rng.IntN(2)) + "-" + run
		var r *pb.RateLimitRequest
		switch rng.IntN(6) {
		case 0:
			r = &pb.RateLimitRequest{Domain: "basic", Descriptors: []*rlext.RateLimitDescriptor{entry("one_per_minute", user)}}
		case 1:
			r = &pb.RateLimitRequest{Domain: "another", Descriptors: []*rlext.RateLimitDescriptor{entry("key2", user)}}
		case 2:
			r = &pb.RateLimitRequest{Domain: "another", Descriptors: []*rlext.RateLimitDescriptor{entry("key3", user), entry("key4", user)}}
		case 3:
			r = &pb.RateLimitRequest{Domain: "another", Descriptors: []*rlext.RateLimitDescriptor{entry("key3_local", user)}}
		case 4:
			r = &pb.RateLimitRequest{Domain: "share-threshold-test", Descriptors: []*rlext.RateLimitDescriptor{
				entry("files", "files/"+strconv.Itoa(rng.IntN(4))+"-"+run)}}
		default:
			r = &pb.RateLimitRequest{Domain: "share-threshold-test", Descriptors: []*rlext.RateLimitDescriptor{
				entry("files_no_share", "files_no_share/"+strconv.Itoa(rng.IntN(2))+"-"+run)}}
		}
		out[i] = r
	}
	return out
}

// checkSameAnswers starts two replicas of ours and two of theirs in each mode on the rig's Redis,
// serving the rule files of spec.rulesDir, and sends each the same sequence (seq, seeded with
// seed), call by call. A sequence that straddles a minute (the windows' edges) is run again on
// fresh values.
func checkSameAnswers(ctx context.Context, spec fleetSpec, erlBin string, seed uint64, calls int,
	seq func(seed uint64, n int, run string) []*pb.RateLimitRequest) (*sameAnswers, error) {
	start := func(fr front, bin string, env ...string) ([]pb.RateLimitServiceClient, func(), error) {
		s := spec
		s.front, s.bin, s.replicas, s.env = fr, bin, 2, env
		f, err := startFleet(ctx, s)
		if err != nil {
			return nil, nil, err
		}
		cl, closeAll, err := grpcClients(f.addrs)
		if err != nil {
			f.stop()
			return nil, nil, err
		}
		return cl, func() { closeAll(); f.stop() }, nil
	}
	ours, stopOurs, err := start(frontRLS, spec.bin)
	if err != nil {
		return nil, err
	}
	defer stopOurs()
	theirs, stopTheirs, err := start(frontERL, erlBin, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true")
	if err != nil {
		return nil, err
	}
	defer stopTheirs()
	theirsDefault, stopDefault, err := start(frontERL, erlBin, "CACHE_KEY_PREFIX=default:") // not the keys of the others
	if err != nil {
		return nil, err
	}
	defer stopDefault()
	out := &sameAnswers{Seed: seed, Calls: calls}
	for attempt := 1; attempt <= 3; attempt++ {
		out.Attempts = attempt
		out.OverLimit, out.Mismatches, out.MismatchesDefault, out.FirstMismatch = 0, 0, 0, ""
		run := strconv.FormatInt(time.Now().UnixNano(), 36)
		minute := time.Now().Truncate(time.Minute)
		for i, req := range seq(seed, calls, run) {
			var got [3]string
			for k, c := range [][]pb.RateLimitServiceClient{ours, theirs, theirsDefault} {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := c[i%len(c)].ShouldRateLimit(cctx, req)
				cancel()
				if err != nil {
					return nil, fmt.Errorf("same answers, call %d: %w", i, err)
				}
				got[k] = answer(res)
			}
			if strings.HasPrefix(got[0], "OVER_LIMIT") {
				out.OverLimit++
			}
			if got[0] != got[1] {
				out.Mismatches++
				if out.FirstMismatch == "" {
					out.FirstMismatch = fmt.Sprintf("call %d %s: ours %s, theirs %s", i, describe(req), got[0], got[1])
				}
			}
			if got[0] != got[2] {
				out.MismatchesDefault++
			}
		}
		if time.Now().Truncate(time.Minute).Equal(minute) {
			return out, nil
		}
	}
	return out, fmt.Errorf("same answers: every attempt straddled a minute")
}
