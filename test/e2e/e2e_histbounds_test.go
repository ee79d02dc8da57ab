package e2e

// Histogram bounds as a scrape prints them: every le label of every histogram the gateway
// exports reads as a person would write it (0.001, 0.0316, 60), not as repeated float
// multiplication leaves it (0.0024420530945486497, 60.00000000000007).

import (
	"math"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// maxBoundDigits is the most significant digits an le label may carry.
const maxBoundDigits = 6

// TestHistogramBoundsReadAsWritten scrapes /metrics of running gateways after traffic (the
// memory store with the upstream protection and a leaky bucket, DynamoDB, Redis, the RLS) and
// fails on any le label with more than maxBoundDigits significant digits. The OTLP metrics
// carry the same bounds: they bridge this registry.
func TestHistogramBoundsReadAsWritten(t *testing.T) {
	bodies := map[string]func() string{
		"memory":   func() string { return scrape(t, "memory") },
		"dynamodb": func() string { return scrape(t, "dynamodb") },
		"rls":      func() string { return rlsScrape(t) },
		"redis": func() string {
			return metricsAfterTraffic(t, redisStore(redisURL(t), "e2ehist"+randomSuffix()+":", "deny"))
		},
	}
	seen := map[string]bool{}
	for _, backend := range []string{"memory", "dynamodb", "redis", "rls"} {
		t.Run(backend, func(t *testing.T) {
			for name, f := range parseFamilies(t, bodies[backend]()) {
				if f.GetType() != dto.MetricType_HISTOGRAM {
					continue
				}
				seen[name] = true
				for _, m := range f.GetMetric() {
					for _, b := range m.GetHistogram().GetBucket() {
						le := b.GetUpperBound()
						if math.IsInf(le, 1) {
							continue
						}
						// As the text format prints it (client_golang's writeFloat: 'g', -1).
						printed := strconv.FormatFloat(le, 'g', -1, 64)
						if n := significantDigits(printed); n > maxBoundDigits {
							t.Errorf("%s: le=%q has %d significant digits", name, printed, n)
						}
					}
				}
			}
		})
	}
	// The check must have seen the histograms it is about, or it proves nothing.
	for _, want := range []string{
		"ratelimit_upstream_duration_seconds", "ratelimit_leaky_wait_seconds",
		"ratelimit_store_duration_seconds", "ratelimit_upstream_queue_seconds",
		"ratelimit_rls_call_duration_seconds", "ratelimit_dynamodb_batch_charges",
	} {
		if !seen[want] {
			t.Errorf("no histogram %s in any scrape (seen: %v)", want, seen)
		}
	}
}

// significantDigits counts the mantissa digits of a number printed with 'g' (1.5e-05: 2,
// 60.00000000000007: 16), leading zeros of a fraction left out (0.00316: 3).
func significantDigits(s string) int {
	mantissa, _, _ := strings.Cut(strings.ToLower(s), "e")
	digits := strings.TrimLeft(strings.NewReplacer(".", "", "-", "").Replace(mantissa), "0")
	if strings.Contains(mantissa, ".") {
		return len(digits)
	}
	return len(strings.TrimRight(digits, "0")) // 1000000 has one
}

func TestSignificantDigits(t *testing.T) {
	for in, want := range map[string]int{"0.001": 1, "0.00316": 3, "60": 1, "60.00000000000007": 16,
		"1.5e-05": 2, "0.0024420530945486497": 17, "128": 3, "1e+06": 1, "1000000": 1} {
		if got := significantDigits(in); got != want {
			t.Errorf("significantDigits(%q) = %d, want %d", in, got, want)
		}
	}
}
