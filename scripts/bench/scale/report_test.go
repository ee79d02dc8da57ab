package main

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The field set of scale.json is a contract other tools check: exactly these, all numbers.
func TestResultJSONFieldsExactly(t *testing.T) {
	counts := []phaseCounts{
		{name: "steady", durationS: 20, offered: 80000, ok: 40500, limited: 39500},
		{name: "shift", durationS: 10, offered: 40000, ok: 19000, limited: 20993, other: 7},
	}
	res := result(8, 2000, 1000, 200, counts, relayCounts{forwarded: 1200, throttled: 3, hottest: 40,
		storeP50: 4500 * time.Microsecond, storeP99: 318250 * time.Microsecond}, 0.000812)
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	want := []string{"replicas", "pool_rate", "pool_burst", "item_write_cap_per_s", "duration_s", "offered",
		"admitted", "exact_bound", "over_admits", "under_admit_ratio", "writes", "writes_per_admitted",
		"hottest_item_writes_per_s", "throttled_writes", "p99_decision_ms", "store_p50_ms", "store_p99_ms", "non_200_429"}
	var got []string
	for k, v := range m {
		got = append(got, k)
		if _, ok := v.(float64); !ok {
			t.Errorf("%s = %v (%T), want a number", k, v, v)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("fields got %v, want %v", got, want)
	}
	// 1000 + 2000 x 30 = 61000; admitted 59500.
	for k, v := range map[string]float64{
		"duration_s": 30, "offered": 120000, "admitted": 59500, "exact_bound": 61000, "over_admits": 0,
		"under_admit_ratio": 0.02459, "writes": 1200, "writes_per_admitted": 0.02017,
		"hottest_item_writes_per_s": 40, "throttled_writes": 3, "p99_decision_ms": 0.812,
		"store_p50_ms": 4.5, "store_p99_ms": 318.25, "non_200_429": 7,
	} {
		if m[k] != v {
			t.Errorf("%s got %v, want %v", k, m[k], v)
		}
	}
}

func TestOverAdmitsAndPhaseBounds(t *testing.T) {
	counts := []phaseCounts{
		{name: "steady", durationS: 20, ok: 41100},
		{name: "shift", durationS: 10, ok: 19900, other: 2, unsent: 1},
	}
	res := result(8, 2000, 1000, 200, counts, relayCounts{}, 0)
	if res.OverAdmits != 0 || res.UnderAdmitRatio != 0 {
		t.Errorf("61000 admitted of 61000: over %v under %v, want 0 and 0", res.OverAdmits, res.UnderAdmitRatio)
	}
	counts[0].ok = 41150
	res = result(8, 2000, 1000, 200, counts, relayCounts{}, 0)
	if res.OverAdmits != 50 || res.UnderAdmitRatio != 0 || res.WritesPerAdmitted != 0 {
		t.Errorf("61050 admitted of 61000: over %v under %v wpa %v, want 50, 0, 0", res.OverAdmits, res.UnderAdmitRatio, res.WritesPerAdmitted)
	}
	ph := phases(2000, 1000, counts)
	// The first phase's bound includes the burst; the next starts from an empty bucket.
	if ph[0].ExactBound != 41000 || ph[0].OverAdmits != 150 || ph[0].UnderAdmitRatio != 0 {
		t.Errorf("steady got %+v, want bound 41000, 150 over", ph[0])
	}
	if ph[1].ExactBound != 20000 || ph[1].MaxBound != 21000 || ph[1].UnderAdmitRatio != 0.005 || ph[1].Other != 2 || ph[1].Unsent != 1 {
		t.Errorf("shift got %+v, want bound 20000, max 21000, under 0.005, 2 other, 1 unsent", ph[1])
	}
	// A later phase may take a few units an exact bucket would have admitted in the phase
	// before (leases are spent up to their TTL late): above its exact bound, not an
	// over-admission until it passes burst + rate x duration.
	counts[1].ok = 20028
	if ph := phases(2000, 1000, counts); ph[1].OverAdmits != 0 || ph[1].UnderAdmitRatio != 0 {
		t.Errorf("shift with 20028 admitted got %+v, want neither over nor under", ph[1])
	}
	counts[1].ok = 21010
	if ph := phases(2000, 1000, counts); ph[1].OverAdmits != 10 {
		t.Errorf("shift with 21010 admitted got %+v, want 10 over", ph[1])
	}
}

// Two replicas' exposition text, as the gateway serves it (buckets 10µs x sqrt(10)).
const (
	replicaA = `# HELP ratelimit_store_duration_seconds Time the rate-limit store took to decide one request.
# TYPE ratelimit_store_duration_seconds histogram
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="1e-05"} 0
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="3.1622776601683795e-05"} 50
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="0.0001"} 90
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="0.00031622776601683794"} 98
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="0.001"} 100
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="+Inf"} 100
ratelimit_store_duration_seconds_sum{backend="dynamodb"} 0.01
ratelimit_store_duration_seconds_count{backend="dynamodb"} 100
# HELP other_total x
# TYPE other_total counter
other_total 3
`
	replicaB = `# TYPE ratelimit_store_duration_seconds histogram
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="1e-05"} 0
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="3.1622776601683795e-05"} 0
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="0.0001"} 0
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="0.00031622776601683794"} 0
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="0.001"} 0
ratelimit_store_duration_seconds_bucket{backend="dynamodb",le="+Inf"} 100
ratelimit_store_duration_seconds_sum{backend="dynamodb"} 30
ratelimit_store_duration_seconds_count{backend="dynamodb"} 100
`
)

func TestHistogramP99Merge(t *testing.T) {
	a, err := parseHistogram(strings.NewReader(replicaA), "ratelimit_store_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseHistogram(strings.NewReader(replicaB), "ratelimit_store_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	// A alone: rank 99 lies in (316µs, 1ms] holding observations 99..100 (cumulative 98 -> 100):
	// 316.2µs + (1000 - 316.2)µs x (99 - 98) / 2 = 658.1µs.
	if got := quantile(0.99, a); math.Abs(got-658.1139e-6) > 1e-9 {
		t.Errorf("p99 of A got %v, want 658.1139µs", got)
	}
	// A's p50: rank 50 in (10µs, 31.6µs], all 50 of its observations: the upper bound.
	if got := quantile(0.5, a); math.Abs(got-31.6228e-6) > 1e-9 {
		t.Errorf("p50 of A got %v, want 31.6228µs", got)
	}
	// Merged: 200 observations, 100 of them above 1ms. Rank 198 is in +Inf: the highest finite
	// bound, 1ms. Rank 100 is A's last, at 1ms too; rank 90 = A's 90th at 100µs.
	m := merge(a, b)
	if len(m) != 6 || m[5].Count != 200 || m[4].Count != 100 {
		t.Fatalf("merged got %v, want 6 buckets, 100 <= 1ms, 200 in all", m)
	}
	if got := quantile(0.99, m); got != 0.001 {
		t.Errorf("merged p99 got %v, want 0.001 (the +Inf bucket reports the highest finite bound)", got)
	}
	if got := quantile(0.45, m); math.Abs(got-100e-6) > 1e-12 {
		t.Errorf("merged p45 got %v, want 100µs", got)
	}
	// A metric the text does not hold is no histogram, not an error.
	if h, err := parseHistogram(strings.NewReader(replicaA), "absent_seconds"); err != nil || h != nil {
		t.Errorf("absent metric: got %v, %v; want nil, nil", h, err)
	}
	if q := quantile(0.99, nil); !math.IsNaN(q) {
		t.Errorf("p99 of nothing got %v, want NaN", q)
	}
	// Histograms with different bounds merge on the union without moving counts down.
	x := histogram{{1, 10}, {math.Inf(1), 10}}
	y := histogram{{0.5, 4}, {2, 6}, {math.Inf(1), 6}}
	if got := merge(x, y); !slices.Equal(got, histogram{{0.5, 4}, {1, 14}, {2, 16}, {math.Inf(1), 16}}) {
		t.Errorf("merge of different bounds got %v", got)
	}
}

// TestSubTakesAnEarlierScrapeOff: a histogram less its earlier scrape is what was observed in
// between; a missing earlier scrape takes nothing off.
func TestSubTakesAnEarlierScrapeOff(t *testing.T) {
	before := histogram{{0.001, 2}, {0.01, 5}, {math.Inf(1), 6}}
	after := histogram{{0.001, 3}, {0.01, 9}, {math.Inf(1), 12}}
	got := sub(after, before)
	want := histogram{{0.001, 1}, {0.01, 4}, {math.Inf(1), 6}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sub got %v, want %v", got, want)
		}
	}
	if got := sub(after, nil); len(got) != len(after) || got[2] != after[2] {
		t.Errorf("sub with no earlier scrape got %v, want %v", got, after)
	}
}
