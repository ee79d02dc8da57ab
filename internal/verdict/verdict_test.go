package verdict

import (
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestOf(t *testing.T) {
	ok := func(rem int64) bucket.Result { return bucket.Result{Allowed: true, Remaining: rem} }
	no := func(wait time.Duration) bucket.Result { return bucket.Result{RetryAfter: wait} }
	shadow := bucket.Charge{Shadow: true}
	tests := []struct {
		name    string
		charges []bucket.Charge
		results []bucket.Result
		want    int
	}{
		{"admitted: least remaining", make([]bucket.Charge, 3), []bucket.Result{ok(5), ok(2), ok(7)}, 1},
		{"admitted: first of equals", make([]bucket.Charge, 3), []bucket.Result{ok(5), ok(2), ok(2)}, 1},
		{"refused: longest wait, not the first", make([]bucket.Charge, 3), []bucket.Result{no(time.Second), ok(0), no(time.Hour)}, 2},
		{"refused: first of equal waits", make([]bucket.Charge, 3), []bucket.Result{ok(0), no(time.Minute), no(time.Minute)}, 1},
		{"shadow refusal is not described", []bucket.Charge{shadow, {}}, []bucket.Result{no(time.Hour), ok(3)}, 1},
		{"shadow least remaining is not described", []bucket.Charge{{}, shadow}, []bucket.Result{ok(3), ok(0)}, 0},
		{"every charge shadow", []bucket.Charge{shadow, shadow}, []bucket.Result{ok(3), no(time.Hour)}, -1},
		{"none", nil, nil, -1},
	}
	for _, tt := range tests {
		if got := Of(tt.charges, tt.results); got != tt.want {
			t.Errorf("%s: Of = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestRemaining(t *testing.T) {
	tests := []struct {
		name string
		cost int64
		r    bucket.Result
		kept bool
		want int64
	}{
		{"allowed, kept", 1, bucket.Result{Allowed: true, Remaining: 4, Limit: 10}, true, 4},
		{"allowed, not kept: its cost back", 3, bucket.Result{Allowed: true, Remaining: 4, Limit: 10}, false, 7},
		{"allowed, not kept: never above the limit", 3, bucket.Result{Allowed: true, Remaining: 9, Limit: 10}, false, 10},
		{"refused cost 1: nothing left", 1, bucket.Result{Remaining: 3}, true, 0},
		{"refused cost 5 with 3 left", 5, bucket.Result{Remaining: 3}, true, 3},
		{"refused cost 5 claiming 9 left", 5, bucket.Result{Remaining: 9}, false, 4},
		{"refused, negative", 2, bucket.Result{Remaining: -4}, true, 0},
	}
	for _, tt := range tests {
		c := bucket.Charge{Cost: tt.cost}
		if got := Remaining(&c, &tt.r, tt.kept); got != tt.want {
			t.Errorf("%s: Remaining = %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestAppendTaken(t *testing.T) {
	at := time.Unix(100, 0)
	charges := []bucket.Charge{{Cost: 1}, {Cost: 2}, {Cost: 3}}
	results := []bucket.Result{{Allowed: true, Token: 7}, {Token: 8}, {Allowed: true, Token: 9}}
	got := AppendTaken(nil, charges, results, at, nil)
	if len(got) != 2 || got[0].Charge.Cost != 1 || got[0].Token != 7 || got[1].Charge.Cost != 3 || got[1].Token != 9 || !got[1].At.Equal(at) {
		t.Errorf("every allowed: got %+v, want charges 0 and 2 with their tokens", got)
	}
	got = AppendTaken(got[:0], charges, results, at, func(i int) bool { return i != 0 })
	if len(got) != 1 || got[0].Token != 9 {
		t.Errorf("filtered: got %+v, want charge 2 only", got)
	}
}

// The verdict is on every decided request's path: it must not allocate.
func TestNoAllocations(t *testing.T) {
	charges := make([]bucket.Charge, 3)
	results := []bucket.Result{{Allowed: true, Remaining: 3}, {RetryAfter: time.Second}, {Allowed: true}}
	dst := make([]bucket.Taken, 0, 3)
	n := testing.AllocsPerRun(100, func() {
		i := Of(charges, results)
		_ = Remaining(&charges[i], &results[i], true)
		dst = AppendTaken(dst[:0], charges, results, time.Time{}, func(j int) bool { return j > 0 })
	})
	if n != 0 {
		t.Errorf("allocations per verdict = %v, want 0", n)
	}
}

func BenchmarkVerdict(b *testing.B) {
	charges := make([]bucket.Charge, 3)
	results := []bucket.Result{{Allowed: true, Remaining: 3}, {RetryAfter: time.Second}, {Allowed: true}}
	dst := make([]bucket.Taken, 0, 3)
	b.ReportAllocs()
	for b.Loop() {
		i := Of(charges, results)
		_ = Remaining(&charges[i], &results[i], true)
		dst = AppendTaken(dst[:0], charges, results, time.Time{}, nil)
	}
}
