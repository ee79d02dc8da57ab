package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// TestRefundAfterIdleResetKeepsLaterCharge: a GCRA refund is "SET tat = tat - T". When the
// bucket went idle between the write and its refund (the refund came more than T later) and
// another request then wrote form (a) (tat = now + T, which discards the old tat and our charge
// with it), an unconditional refund would take T off that other request's charge, and the
// bucket would admit one request more than its burst. The refund applies only while the bucket
// has not been reset since the write (its since attribute). With T = 1 ms a refund one round
// trip late is enough; one store is enough (refunds are not coalesced).
func TestRefundAfterIdleResetKeepsLaterCharge(t *testing.T) {
	api, table := localTable(t)
	bucketLimit := bucket.Limit{Algorithm: bucket.TokenBucket, Rate: 1000, Burst: 1} // T = 1ms
	windowLimit := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
	gcra := bucket.Charge{Key: newKey(t), Limit: bucketLimit}
	window := bucket.Charge{Key: newKey(t), Limit: windowLimit}

	gate := newHoldAPI(api)
	gate.holdUpdate = updateOf(gcra.Key, "#tat - :t") // the refund of gcra
	s := dynamo.New(gate, dynamo.Options{Table: table})

	// Use up the window, so that the next group is rejected by it and gcra is refunded.
	if ok, _ := mustTake(t, s, t0, window); !ok {
		t.Fatalf("first window request: got rejected, want admitted")
	}
	rejected := asyncTake(context.Background(), s, t0, gcra, window) // writes tat = t0+1ms, then refunds it (held)
	gate.waitHeld(t)

	// 5 ms later the bucket is idle; a request resets it: tat = t0+6ms.
	later := t0.Add(5 * time.Millisecond)
	if ok, _ := mustTake(t, s, later, gcra); !ok {
		t.Fatalf("request at +5ms on an idle bucket: got rejected, want admitted")
	}
	close(gate.release) // the late refund arrives and must not apply
	if o := outcome(t, rejected); o.err != nil || o.ok {
		t.Fatalf("group at t0: got admitted=%v err=%v, want rejected by the window", o.ok, o.err)
	}

	// Burst 1: at +5ms the one request allowed at that instant has been admitted.
	if ok, r := mustTake(t, s, later, gcra); ok {
		t.Errorf("second request at +5ms with burst 1: got admitted (remaining %d), want rejected: the late refund undid another request's charge", r[0].Remaining)
	}
}
