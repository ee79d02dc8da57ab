package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// slidingTenPerTen is a sliding window of 10 requests per 10s: slots of 1s.
var slidingTenPerTen = bucket.Limit{Algorithm: bucket.SlidingWindow, Count: 10, Window: 10 * time.Second}

// TestSlidingLateWriteRejectedAfterSeal: a sliding-window write decided in slot s but still on
// the network when another replica crosses into s+1 and takes s's count lands after that;
// unless s was sealed, that replica never sees it. Here replica B's request at 0.9s is held
// on its way while replica A, which admitted 9 at 0.5s, admits its 10th at 1.0s (sealing slot
// s); B's write then finds the slot sealed and is rejected: no more than 10 within 10s, no
// error, and a RetryAfter that reaches at least the end of B's slot.
func TestSlidingLateWriteRejectedAfterSeal(t *testing.T) {
	api, table := localTable(t)
	// Refund mode writes through the coalescer, Transaction mode (a group of one) directly.
	for _, mode := range []dynamo.Mode{dynamo.Refund, dynamo.Transaction} {
		t.Run(mode.String(), func(t *testing.T) {
			c := bucket.Charge{Key: newKey(t), Limit: slidingTenPerTen}
			base := t0.Add(100 * time.Second) // a slot boundary: t0 is a whole second

			a := dynamo.New(api, dynamo.Options{Table: table, Mode: mode})
			gate := newHoldAPI(api)
			gate.holdUpdate = updateOf(c.Key, "ADD #count") // B's first write: to slot base
			b := dynamo.New(gate, dynamo.Options{Table: table, Mode: mode})

			admitted := 0
			for range 9 {
				if ok, _ := mustTake(t, a, base.Add(500*time.Millisecond), c); ok {
					admitted++
				}
			}
			lateAt := base.Add(900 * time.Millisecond)
			late := asyncTake(context.Background(), b, lateAt, c) // decided in slot base, held
			gate.waitHeld(t)

			// A crosses into the next slot: it seals slot base (count 9) and caches it.
			if ok, _ := mustTake(t, a, base.Add(time.Second), c); ok {
				admitted++
			}
			close(gate.release)
			o := outcome(t, late)
			if o.err != nil {
				t.Fatalf("B's request: %v", o.err)
			}
			if o.ok {
				admitted++
			}
			if admitted > int(slidingTenPerTen.Count) {
				t.Errorf("admitted between +0.5s and +1.0s: got %d, want at most %d (the limit per 10s)", admitted, slidingTenPerTen.Count)
			}
			if want := base.Add(time.Second).Sub(lateAt); !o.ok && o.r.RetryAfter < want {
				t.Errorf("B's rejection: got RetryAfter %v, want at least %v (the rest of its slot)", o.r.RetryAfter, want)
			}
		})
	}
}

// TestSlidingSealedBatchRejectsAll: the coalesced write of several queued requests to a slot
// that another replica sealed meanwhile is rejected for all of them, and counts nothing.
func TestSlidingSealedBatchRejectsAll(t *testing.T) {
	api, table := localTable(t)
	c := bucket.Charge{Key: newKey(t), Limit: slidingTenPerTen}
	base := t0.Add(200 * time.Second)
	a := dynamo.New(api, dynamo.Options{Table: table})
	gate := newHoldAPI(api)
	b := dynamo.New(gate, dynamo.Options{Table: table})

	// B caches the closed slots before base (so its next requests queue without a call) and
	// writes one request in slot base.
	if ok, _ := mustTake(t, b, base.Add(100*time.Millisecond), c); !ok {
		t.Fatalf("B's first request: got rejected, want admitted")
	}
	gate.holdUpdate = updateOf(c.Key, "ADD #count")
	firstAt, queuedAt := base.Add(800*time.Millisecond), base.Add(900*time.Millisecond)
	outs := []<-chan takeOutcome{asyncTake(context.Background(), b, firstAt, c)}
	gate.waitHeld(t)
	for range 3 {
		ctx := newQueuedCtx(context.Background())
		outs = append(outs, asyncTake(ctx, b, queuedAt, c))
		<-ctx.queued
	}

	// A moves to the next slot and seals slot base with its count of 1.
	ok, r := mustTake(t, a, base.Add(time.Second), c)
	if !ok || r[0].Remaining != 8 {
		t.Fatalf("A's request in the next slot: got admitted=%v Remaining=%d, want admitted with Remaining 8", ok, r[0].Remaining)
	}
	close(gate.release)
	for i, out := range outs {
		o := outcome(t, out)
		if o.err != nil || o.ok {
			t.Errorf("B's request %d to the sealed slot: got admitted=%v err=%v, want rejected", i, o.ok, o.err)
		}
		at := queuedAt
		if i == 0 {
			at = firstAt
		}
		if want := base.Add(time.Second).Sub(at); o.r.RetryAfter < want {
			t.Errorf("B's request %d: got RetryAfter %v, want at least %v (the rest of its slot)", i, o.r.RetryAfter, want)
		}
	}
	// Nothing of B's rejected requests was counted: A's next request sees 2 in the window.
	if ok, r := mustTake(t, a, base.Add(1100*time.Millisecond), c); !ok || r[0].Remaining != 7 {
		t.Errorf("A's request after the rejected batch: got admitted=%v Remaining=%d, want admitted with Remaining 7", ok, r[0].Remaining)
	}
}

// TestSlidingSealsOnlyRecentSlots: a closed slot that ended less than LateWrites ago is sealed
// (one UpdateItem each, counted as op="seal"); older ones are read in one BatchGetItem; each
// is learnt once. With slots of 1s an active key costs one seal per slot (per replica) while
// LateWrites is shorter than a slot, and a decision that comes later in the slot reads instead.
func TestSlidingSealsOnlyRecentSlots(t *testing.T) {
	api, table := localTable(t)
	base := t0.Add(300 * time.Second)
	for _, tc := range []struct {
		name             string
		late             time.Duration
		seals, batchGets float64
		steps            []time.Duration // decision instants after base
	}{
		// 5s: at +0.5s the 5 slots that ended within 5s are sealed and the other 5 read; at
		// +1.2s and +2.0s the slot that just closed is sealed.
		{"5s", 5 * time.Second, 7, 1, []time.Duration{500 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond, 2 * time.Second}},
		// 100ms: at +0.5s all 10 are read; at +1.05s the slot that closed 50ms ago is sealed;
		// at +2.5s the slot that closed 500ms ago is read.
		{"100ms", 100 * time.Millisecond, 1, 2, []time.Duration{500 * time.Millisecond, 1050 * time.Millisecond, 2500 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s := dynamo.New(api, dynamo.Options{Table: table, LateWrites: tc.late, Registerer: reg})
			c := bucket.Charge{Key: newKey(t), Limit: slidingTenPerTen}
			for i, d := range tc.steps {
				if ok, r := mustTake(t, s, base.Add(d), c); !ok || r[0].Remaining != slidingTenPerTen.Count-int64(i)-1 {
					t.Fatalf("request %d at +%v: got admitted=%v Remaining=%d, want admitted with Remaining %d", i, d, ok, r[0].Remaining, slidingTenPerTen.Count-int64(i)-1)
				}
			}
			if got := metricValue(t, reg, "ratelimit_store_requests_total", "seal"); got != tc.seals {
				t.Errorf("seal calls: got %v, want %v", got, tc.seals)
			}
			if got := metricValue(t, reg, "ratelimit_store_requests_total", "batch_get"); got != tc.batchGets {
				t.Errorf("batch_get calls: got %v, want %v", got, tc.batchGets)
			}
		})
	}
}
