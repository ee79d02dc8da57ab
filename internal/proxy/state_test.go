package proxy

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// TestReqStateResetForgetsTheLastRequest: a pooled state readied for a request keeps only the
// capacity of its slices and its reusable store context; every other field, including any
// added later, starts from zero.
func TestReqStateResetForgetsTheLastRequest(t *testing.T) {
	st := &reqState{buf: make([]byte, 3, 512), results: make([]bucket.Result, 2), taken: make([]bucket.Taken, 1, 4), ctx: new(storeCtx)}
	st.now, st.callExpired, st.givenBack, st.rejector, st.decision = time.Unix(1, 0), true, true, "p", decLimited
	st.fw.fate, st.fw.status, st.fw.timed = fateAnswered, 429, true
	st.plan.Charges = append(st.plan.Charges, bucket.Charge{Cost: 2})
	ctx := st.ctx

	st.reset(true, protoGRPC, true)

	if !st.grpc || st.proto != protoGRPC || !st.plan.WantIdentity || st.decision != decNone {
		t.Errorf("reset did not set the new request's facts: %+v", st)
	}
	if len(st.buf) != 0 || cap(st.buf) != 512 || len(st.taken) != 0 || cap(st.taken) != 4 || len(st.results) != 2 ||
		st.ctx != ctx || len(st.plan.Charges) != 0 || cap(st.plan.Charges) == 0 {
		t.Errorf("reset lost a reusable buffer: buf %d/%d taken %d/%d results %d ctx kept %v charges %d/%d",
			len(st.buf), cap(st.buf), len(st.taken), cap(st.taken), len(st.results), st.ctx == ctx, len(st.plan.Charges), cap(st.plan.Charges))
	}
	kept := map[string]bool{"grpc": true, "proto": true, "decision": true}
	v := reflect.ValueOf(st.reqFacts)
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; !kept[name] && !v.Field(i).IsZero() {
			t.Errorf("field %s survived reset: %v", name, v.Field(i))
		}
	}
}

// TestPolicyStateBySlot: a policy's state is found by its index, and a reload's policies (new
// values, the same or other names at the same index) find the state of their own name.
func TestPolicyStateBySlot(t *testing.T) {
	h, err := New(Options{Upstream: mustURL(t, "http://upstream.invalid"), Policies: func() Policies { return &fakePolicies{} }, Limiter: newFakeLimiter(true)})
	if err != nil {
		t.Fatal(err)
	}
	a := &policy.Policy{Name: "a", Index: 0}
	b := &policy.Policy{Name: "b", Index: 1}
	sa, sb := h.policyOf(a), h.policyOf(b)
	if sa == sb || h.policyOf(a) != sa || h.policyOf(b) != sb || sa != h.policy("a") {
		t.Fatal("each policy must keep one state of its own name")
	}
	// A reload: b moved to index 0, a new policy c at 1, a again as a new value.
	b2, c, a2 := &policy.Policy{Name: "b", Index: 0}, &policy.Policy{Name: "c", Index: 1}, &policy.Policy{Name: "a", Index: 2}
	if h.policyOf(b2) != sb || h.policyOf(c) == sb || h.policyOf(c) == sa || h.policyOf(a2) != sa {
		t.Error("after a reload, a policy must find its own name's state, whatever its index")
	}
	if h.policyOf(a) != sa || h.policyOf(b) != sb {
		t.Error("a request still on the old set must find its policies' states too")
	}
	if n := testing.AllocsPerRun(100, func() { h.policyOf(c) }); n != 0 {
		t.Errorf("a slot lookup allocates %v times, want 0", n)
	}
}

// TestValueArenaNeverRewrites: header values handed out stay what they were while later
// requests take theirs from the same arena, across a block's end.
func TestValueArenaNeverRewrites(t *testing.T) {
	var a valueArena
	type got struct{ x, y, z []string }
	var kept []got
	for i := range int64(200) {
		x, y, z := a.three(i, -i, 1<<62+i)
		kept = append(kept, got{x, y, z})
		if cap(x) != 1 || cap(y) != 1 || cap(z) != 1 {
			t.Fatalf("value slices must have capacity 1, got %d %d %d", cap(x), cap(y), cap(z))
		}
	}
	for i, g := range kept {
		if want := fmt.Sprintf("%d %d %d", i, -i, 1<<62+int64(i)); fmt.Sprintf("%s %s %s", g.x[0], g.y[0], g.z[0]) != want {
			t.Fatalf("values of request %d became %q %q %q, want %s", i, g.x[0], g.y[0], g.z[0], want)
		}
	}
	if n := testing.AllocsPerRun(30, func() { a.three(1, 2, 3) }); n > 0.1 {
		t.Errorf("allocations per answer = %v, want about 2 per 32 answers", n)
	}
}
