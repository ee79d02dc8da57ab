package rls

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlext "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
)

// TestFloodLeavesFreshValuesTheirLimits is issue 32 item 6 through the RLS, into one domain: the
// RLS keeps no key table of its own, its charges go to the memory store in the domain's pool
// (Pool). 1,500 calls, each a new descriptor value with hits_addend equal to its limit (3 a
// minute), into max_keys 1,000 left every fresh value of the domain sharing the pool's overflow
// bucket, which the flood had spent (failed first on main: 0 of 10 fresh values OK). Now at
// least 9 of 10 fresh values are OK while the flood lasts, each then limited at its own limit,
// and every flood value is still over its limit.
func TestFloodLeavesFreshValuesTheirLimits(t *testing.T) {
	m := memstore.New(memstore.Options{MaxKeys: 1000})
	m.SetPools(Pool("d"))
	s, clk, _ := newTestService(t, m, nil)
	call := func(v string, hits uint32) pb.RateLimitResponse_Code {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "d", HitsAddend: hits,
			Descriptors: []*rlext.RateLimitDescriptor{d("fw", v)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	for i := range 1500 {
		clk.now = clk.now.Add(time.Millisecond) // 1.5 s of the minute's 50 left
		call(fmt.Sprintf("f%d", i), 3)
	}
	if m.Overflowed() == 0 {
		t.Fatalf("the flood judged nothing in the sketch (%d keys held)", m.Len())
	}
	ok := 0
	for i := range 10 {
		v := fmt.Sprintf("fresh%d", i)
		if call(v, 1) != pb.RateLimitResponse_OK {
			continue
		}
		ok++
		if call(v, 2) != pb.RateLimitResponse_OK || call(v, 1) != pb.RateLimitResponse_OVER_LIMIT {
			t.Errorf("fresh value %s: want OK for its limit of 3 in all, then OVER_LIMIT", v)
		}
	}
	t.Logf("%d keys held, %d charges judged in the sketch; %d of 10 fresh values OK", m.Len(), m.Overflowed(), ok)
	if ok < 9 {
		t.Errorf("fresh values of the flooded domain: %d of 10 OK, want at least 9", ok)
	}
	for i := range 1500 {
		if code := call(fmt.Sprintf("f%d", i), 1); code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("flood value f%d: got %v, want OVER_LIMIT (a key at its limit escaped it)", i, code)
		}
	}
}
