package proxy

import (
	"reflect"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// TestReqStateResetForgetsTheLastRequest: a pooled state readied for a request keeps only the
// capacity of its slices and its reusable store context; every other field, including any
// added later, starts from zero.
func TestReqStateResetForgetsTheLastRequest(t *testing.T) {
	st := &reqState{buf: make([]byte, 3, 512), results: make([]bucket.Result, 2), taken: make([]bucket.Taken, 1, 4), ctx: new(storeCtx)}
	st.now, st.callExpired, st.givenBack, st.rejector, st.decision = time.Unix(1, 0), true, true, "p", decLimited
	st.fw.fate, st.fw.wrote, st.sw.status = fateAnswered, true, 429
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
	kept := map[string]bool{"plan": true, "results": true, "buf": true, "ctx": true, "taken": true, "grpc": true, "proto": true, "decision": true}
	v := reflect.ValueOf(st).Elem()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; !kept[name] && !v.Field(i).IsZero() {
			t.Errorf("field %s survived reset: %v", name, v.Field(i))
		}
	}
}
