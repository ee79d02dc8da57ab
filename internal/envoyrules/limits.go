package envoyrules

// This file checks a rate_limit block of envoyproxy/ratelimit's files (read by load.go): its
// unit, requests and algorithm, turns them into a bucket.Limit, and checks what that limit
// means (refill time, quota offset, lease) with the check proxy policies share
// (limitterms.CheckLimit).

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// algorithms are the algorithms a rule may name. leaky_bucket shapes by holding a request,
// and concurrency gives its slot back when the request ends: an RLS answer can do neither.
var algorithms = map[string]bucket.Algorithm{
	"fixed_window":   bucket.FixedWindow,
	"sliding_window": bucket.SlidingWindow,
	"token_bucket":   bucket.TokenBucket,
	"quota":          bucket.Quota,
}

// checkRateLimit checks one rate_limit block and returns the limit it means (zero for an
// unlimited one). ok is false when a problem was reported.
func (p *parser) checkRateLimit(rl *rateLimitConfig) (lim bucket.Limit, unit Unit, ok bool) {
	before := len(*p.es)
	at := rl.at
	if rl.Unlimited {
		// As envoyproxy/ratelimit: an unlimited rule names no unit, and then nothing else
		// of a limit either.
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"unit", rl.Unit != ""}, {"requests_per_unit", rl.RequestsPerUnit != nil}, {"unit_multiplier", rl.UnitMultiplier != 0},
			{"algorithm", rl.Algorithm != ""}, {"burst", rl.Burst != 0}, {"time_zone", rl.TimeZone != ""},
			{"offset", rl.Offset != 0}, {"pool", rl.Pool != ""}, {"lease", rl.Lease != nil},
		} {
			if f.set {
				p.add(at+"."+f.name, "", "must not be set when unlimited is true")
			}
		}
		return bucket.Limit{}, 0, len(*p.es) == before
	}
	unit, known := units[strings.ToLower(rl.Unit)]
	if rl.Unit == "" {
		p.add(at+".unit", "", "required: second, minute, hour, day, week, month or year")
	} else if !known {
		p.add(at+".unit", rl.Unit, "must be second, minute, hour, day, week, month or year")
	}
	if rl.RequestsPerUnit == nil {
		p.add(at+".requests_per_unit", "", "required")
	} else if rl.requestsPerUnit() < 0 || rl.requestsPerUnit() > limitterms.MaxCount {
		p.add(at+".requests_per_unit", strconv.FormatInt(rl.requestsPerUnit(), 10), fmt.Sprintf("must be from 0 to %d", limitterms.MaxCount))
	}
	mult := rl.UnitMultiplier
	if mult == 0 {
		mult = 1
	} else if mult < 1 || mult > math.MaxUint32 {
		p.add(at+".unit_multiplier", strconv.FormatInt(rl.UnitMultiplier, 10), "must be at least 1")
		mult = 1
	}
	algName := rl.Algorithm
	if algName == "" {
		algName = "fixed_window"
	}
	alg, algOK := algorithms[algName]
	if !algOK {
		why := "must be fixed_window, sliding_window, token_bucket or quota"
		if algName == "leaky_bucket" || algName == "concurrency" {
			why += ": an RLS answer can neither hold a request (leaky_bucket) nor learn when it ends (concurrency)"
		}
		p.add(at+".algorithm", rl.Algorithm, why)
	}
	if rl.Burst != 0 && alg != bucket.TokenBucket {
		p.add(at+".burst", strconv.FormatInt(rl.Burst, 10), "used by algorithm token_bucket only")
	}
	if alg != bucket.Quota {
		if rl.TimeZone != "" {
			p.add(at+".time_zone", rl.TimeZone, "used by algorithm quota only")
		}
		if rl.Offset != 0 {
			p.add(at+".offset", strconv.Itoa(rl.Offset), "used by algorithm quota only")
		}
	}
	if rl.Pool != "" && (len(rl.Pool) > limitterms.MaxNameLen || !limitterms.ValidName(rl.Pool)) {
		p.add(at+".pool", rl.Pool, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", limitterms.MaxNameLen))
	}
	if len(*p.es) != before || !algOK || !known {
		return bucket.Limit{}, unit, false
	}
	period := time.Duration(mult) * unit.Duration()
	if mult > int64(maxPeriod/unit.Duration()) {
		p.add(at+".unit_multiplier", strconv.FormatInt(mult, 10), "unit times unit_multiplier must be at most 366 days")
		return bucket.Limit{}, unit, false
	}
	rpu := rl.requestsPerUnit()
	switch alg {
	case bucket.FixedWindow, bucket.SlidingWindow:
		lim = bucket.Limit{Algorithm: alg, Count: rpu, Window: period}
	case bucket.TokenBucket:
		burst := rl.Burst
		if burst == 0 {
			burst = rpu
		}
		if rpu < 1 {
			p.add(at+".requests_per_unit", strconv.FormatInt(rpu, 10), "must be at least 1 for token_bucket: it is the refill rate")
		}
		if burst < 1 || burst > limitterms.MaxCount {
			p.add(at+".burst", strconv.FormatInt(burst, 10), fmt.Sprintf("must be from 1 to %d", limitterms.MaxCount))
		}
		if len(*p.es) != before {
			return bucket.Limit{}, unit, false
		}
		lim = bucket.Limit{Algorithm: alg, Rate: float64(rpu) / period.Seconds(), Burst: burst}
	case bucket.Quota:
		var per bucket.Period
		switch unit {
		case UnitDay:
			per = bucket.Day
		case UnitWeek:
			per = bucket.Week
		case UnitMonth:
			per = bucket.Month
		default:
			p.add(at+".unit", rl.Unit, "must be day, week or month for algorithm quota: its calendar period")
		}
		if mult != 1 {
			p.add(at+".unit_multiplier", strconv.FormatInt(mult, 10), "must be 1 for algorithm quota: a calendar period is one day, week or month")
		}
		zone, err := limitterms.LoadZone(rl.TimeZone)
		if err != nil {
			p.add(at+".time_zone", rl.TimeZone, err.Error())
		}
		if len(*p.es) != before {
			return bucket.Limit{}, unit, false
		}
		lim = bucket.Limit{Algorithm: alg, Count: rpu, Period: per, Offset: uint8(rl.Offset), Zone: zone}
	}
	// What the limit means, checked as a proxy policy's is: refill time, offset, lease.
	var lease *limitterms.Lease
	if l := rl.Lease; l != nil {
		lease = &limitterms.Lease{Enabled: l.Enabled, Shards: l.Shards, TTL: l.TTL}
	}
	for _, pr := range limitterms.CheckLimit(lim, rl.Offset, lease, 1) {
		p.add(at+"."+pr.Field, pr.Value, pr.Msg)
	}
	return lim, unit, len(*p.es) == before
}
