package limitterms

import (
	"fmt"
	"strconv"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// MaxRefill bounds a bucket's refill time, burst/rate: a year and a leap day. It keeps every
// derived duration far inside time.Duration's range.
const MaxRefill = 366 * 24 * time.Hour

// Problem is one problem of a limit: Field is relative to the block that writes the limit
// (burst, offset, lease.shards), Value is as the file writes it, Msg says what is wrong.
type Problem struct {
	Field, Value, Msg string
}

// Lease is a lease block as both formats write it (0 means the default).
type Lease struct {
	Enabled bool
	Shards  int
	TTL     time.Duration
}

// CheckLimit is the check of a limit that both formats share, a proxy policy's (or its
// override's, or an exemption's replacement limit) and an Envoy rule's: what the limit means
// once its fields are read, whatever they are called in the file. The caller has checked the
// fields themselves (counts in range, a known algorithm, a quota's period) and built lim from
// them; offset is a quota's offset as written (lim.Offset cannot hold a negative one), lease the
// lease block (nil for none) and cost the most one request spends. It checks a bucket's refill
// time, a quota's offset in its period, and whether the lease can serve the limit.
func CheckLimit(lim bucket.Limit, offset int, lease *Lease, cost int64) []Problem {
	var ps []Problem
	switch lim.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		if lim.Rate > 0 && lim.Burst > 0 && float64(lim.Burst)/lim.Rate > MaxRefill.Seconds() {
			ps = append(ps, Problem{"burst", strconv.FormatInt(lim.Burst, 10), "burst/rate (the time to refill) must be at most 366 days"})
		}
	case bucket.Quota:
		if p := checkOffset(lim.Period, offset); p != nil {
			ps = append(ps, *p)
		}
	}
	if lease != nil && len(ps) == 0 {
		if p := checkLease(lim, *lease, cost); p != nil {
			ps = append(ps, *p)
		}
	}
	return ps
}

// checkOffset checks a quota's offset against its period.
func checkOffset(per bucket.Period, offset int) *Problem {
	o := strconv.Itoa(offset)
	switch {
	case per == bucket.Day && offset != 0:
		return &Problem{"offset", o, "must be 0 for a daily quota: a day starts at midnight in time_zone"}
	case per == bucket.Week && (offset < 0 || offset > 6):
		return &Problem{"offset", o, "must be from 0 (weeks start on Sunday) to 6 (Saturday) for a weekly quota"}
	case per == bucket.Month && (offset < 0 || offset > 27):
		return &Problem{"offset", o, "must be from 0 (months start on the 1st) to 27 (on the 28th, which every month has) for a monthly quota"}
	}
	return nil
}

// checkLease checks a lease block against the limit it serves.
func checkLease(lim bucket.Limit, l Lease, cost int64) *Problem {
	if !l.Enabled {
		if l.Shards != 0 || l.TTL != 0 {
			return &Problem{"lease.enabled", "false", "lease fields are set, but enabled is false: set enabled: true, or remove the block"}
		}
		return nil
	}
	if !bucket.LeaseSupported(lim.Algorithm) {
		return &Problem{"lease.enabled", "true", "leases serve token_bucket and fixed_window only, not " + AlgorithmName(lim.Algorithm) + " (see docs/shared-pools.md)"}
	}
	if field, value, msg := CheckLeaseShape(l.Shards, l.TTL); field != "" {
		return &Problem{"lease." + field, value, msg}
	}
	shards := max(l.Shards, 1)
	capacity, what := lim.Burst, "burst"
	if lim.Algorithm == bucket.FixedWindow {
		capacity, what = lim.Count, "limit"
	}
	if capacity <= 0 || (lim.Algorithm == bucket.TokenBucket && lim.Rate <= 0) {
		return nil // reported with the limit's own fields
	}
	n := strconv.Itoa(shards)
	if int64(shards) > capacity {
		return &Problem{"lease.shards", n, fmt.Sprintf("must be at most the %s (%d): every shard holds at least one request of it", what, capacity)}
	}
	if ttl := bucket.LeaseTTL(lim, bucket.Lease{Shards: shards, TTL: l.TTL}); ttl > 0 {
		if most := bucket.LeaseCapacity(lim, shards, ttl); max(cost, 1) > most {
			return &Problem{"lease.shards", n, fmt.Sprintf("leaves room for %d per lease, less than the cost %d of one request", most, cost)}
		}
		return nil
	}
	if l.TTL == 0 || capacity/int64(shards) < 2 {
		return &Problem{"lease.shards", n, fmt.Sprintf("leaves %d of the burst (%d) to a shard: a leased token bucket needs at least 2 per shard", capacity/int64(shards), capacity)}
	}
	t, tau := bucket.ShardGCRA(lim, shards, shards-1)
	return &Problem{"lease.ttl", ShortDuration(l.TTL), "must be at most " + ShortDuration(time.Duration(tau-t)) +
		" (the smallest shard's burst time less one interval): leased units come out of the burst less rate×ttl"}
}
