package policy

// This file checks a policy: its key, algorithm, limit, lease, costs and calendar quota.

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/configyaml"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/limitterms"
)

// didYouMean is ` (did you mean "x"?)` for the known value that s most resembles, or "".
func didYouMean(s string, known []string) string {
	slices.Sort(known) // map order is random: ties go to the first name
	if m := configyaml.Suggest(s, known); m != "" && m != s {
		return fmt.Sprintf(" (did you mean %q?)", m)
	}
	return ""
}

// keyKind is the source of a policy's key value.
type keyKind uint8

const (
	keyIP keyKind = iota + 1
	keyAPIKey
	keyUser
	keyGlobal
	keyHeader
)

// parseKey splits a policy's key into its kind and, for header:NAME, the header name.
func parseKey(s string) (keyKind, string, bool) {
	switch s {
	case "ip":
		return keyIP, "", true
	case "api_key":
		return keyAPIKey, "", true
	case "user":
		return keyUser, "", true
	case "global":
		return keyGlobal, "", true
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok {
		return keyHeader, name, true
	}
	return 0, "", false
}

func checkPolicy(es *Errors, at string, p *PolicyConfig, hasUser bool) {
	switch {
	case p.Name == "":
		es.add(at+".name", "", "required")
	case len(p.Name) > limitterms.MaxNameLen || !limitterms.ValidName(p.Name):
		es.add(at+".name", p.Name, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", limitterms.MaxNameLen))
	}

	kind, header, ok := parseKey(p.Key)
	switch {
	case p.Key == "":
		es.add(at+".key", "", "required: ip, api_key, user, global or header:NAME")
	case !ok:
		es.add(at+".key", p.Key, "must be ip, api_key, user, global or header:NAME")
	case kind == keyHeader && !httpguts.ValidHeaderFieldName(header):
		es.add(at+".key", p.Key, "header:NAME needs a valid header name")
	case kind == keyHeader && unseenHeader(header) != "":
		es.add(at+".key", p.Key, unseenHeader(header))
	case kind == keyUser && !hasUser:
		es.add(at+".key", p.Key, "needs identity.user_header or identity.jwt")
	}

	alg, algOK := algorithms[p.Algorithm]
	meaning := false // the limit's fields passed: check what they mean
	switch {
	case p.Algorithm == "":
		es.add(at+".algorithm", "", "required: "+algorithmList)
	case !algOK:
		es.add(at+".algorithm", p.Algorithm, "must be "+algorithmList+didYouMean(p.Algorithm, slices.Collect(maps.Keys(algorithms))))
	default:
		before := len(*es)
		checkFullLimit(es, at, alg, p.fields())
		fieldsOK := len(*es) == before
		switch {
		case alg == bucket.Concurrency && (p.Cost != 0 || p.costSet):
			es.add(at+".cost", strconv.FormatInt(p.Cost, 10), "not used by concurrency: every request holds one slot")
		case alg == bucket.Concurrency && len(p.Costs) > 0:
			es.add(at+".costs", "", "not used by concurrency: every request holds one slot")
		case len(*es) == before:
			checkCost(es, at+".cost", p.Cost, p.Cost, p.fields(), alg)
			for j, c := range p.Costs {
				checkCost(es, fmt.Sprintf("%s.costs[%d].cost", at, j), c.Cost, c.Cost, p.fields(), alg)
			}
		}
		checkCosts(es, at, p.Costs)
		checkCalendar(es, at, p, alg)
		_, perOK := periods[p.Period]
		meaning = fieldsOK && (alg != bucket.Quota || perOK)
	}
	if c := p.Cost; c < 0 || c == 0 && p.costSet {
		es.add(at+".cost", strconv.FormatInt(c, 10), "must be at least 1")
	} else if c > limitterms.MaxCount {
		es.add(at+".cost", strconv.FormatInt(c, 10), fmt.Sprintf("must be at most %d", limitterms.MaxCount))
	}

	switch p.Mode {
	case "", modeEnforce, modeShadow:
	default:
		es.add(at+".mode", p.Mode, "must be enforce or shadow")
	}
	for j, m := range p.Match.Methods {
		if !methods[m] {
			es.add(fmt.Sprintf("%s.match.methods[%d]", at, j), m, "must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE")
		}
	}
	checkPathPrefix(es, at+".match.path_prefix", p.Match.PathPrefix)
	checkChargeOn(es, at, p.ChargeOn, alg, algOK)
	checkOverrides(es, at, p, kind, ok, alg, algOK)
	if p.Pool != "" && (len(p.Pool) > limitterms.MaxNameLen || !limitterms.ValidName(p.Pool)) {
		es.add(at+".pool", p.Pool, fmt.Sprintf("must be 1 to %d of A-Z a-z 0-9 _ . -", limitterms.MaxNameLen))
	}
	if meaning {
		checkMeaning(es, at, p, alg)
	}
}

// checkMeaning runs the check that Envoy's rules share (limitterms.CheckLimit: a bucket's
// refill time, a quota's offset, the lease) on the policy's limit, and the lease on every
// override's limit too, once their fields passed their own checks.
func checkMeaning(es *Errors, at string, p *PolicyConfig, alg bucket.Algorithm) {
	var lease *limitterms.Lease
	if l := p.Lease; l != nil {
		lease = &limitterms.Lease{Enabled: l.Enabled, Shards: l.Shards, TTL: l.TTL}
		if l.Enabled && len(p.ChargeOn) > 0 {
			// A leased unit is spent when the request is admitted; giving it back after the
			// answer would need the lease still live, which a slow upstream outlasts.
			es.add(at+".lease.enabled", "true", "cannot be combined with charge_on: a leased unit is spent when the request is admitted")
			lease = nil
		}
	}
	ps := limitterms.CheckLimit(limitOf(alg, p, p.fields()), p.Offset, lease, p.Cost)
	for _, pr := range ps {
		es.add(at+"."+pr.Field, pr.Value, pr.Msg)
	}
	if lease == nil || len(ps) > 0 {
		return
	}
	for i := range p.Overrides {
		if p.Overrides[i].Unlimited {
			continue
		}
		for _, pr := range limitterms.CheckLimit(limitOf(alg, p, effective(p, &p.Overrides[i])), p.Offset, lease, p.Cost) {
			if strings.HasPrefix(pr.Field, "lease.") { // the override's own are checked with it
				es.add(at+"."+pr.Field, pr.Value, pr.Msg)
				return
			}
		}
	}
}

// limitFields are the limit fields common to a policy and an override.
type limitFields struct {
	rate      string
	burst     int64
	limit     int64
	window    time.Duration
	windowSet bool // the file wrote window, possibly as 0s
}

// fields returns the policy's limit fields.
func (p *PolicyConfig) fields() limitFields {
	return limitFields{rate: p.Rate, burst: p.Burst, limit: p.Limit, window: p.Window, windowSet: p.windowSet}
}

// fields returns the override's own limit fields (those it leaves unset are zero).
func (o *OverrideConfig) fields() limitFields {
	return limitFields{rate: o.Rate, burst: o.Burst, limit: o.Limit, window: o.Window, windowSet: o.windowSet}
}

// checkFullLimit checks the fields of a whole limit at `at`: a policy's, or an exemption's
// replacement limit (Policy.ReplacementLimit), so that neither can hold what the other may not.
// What the limit means (limitterms.CheckLimit) is checked once they pass.
func checkFullLimit(es *Errors, at string, alg bucket.Algorithm, f limitFields) {
	checkLimit(es, at, alg, f, true)
}

// checkLimit checks one algorithm's fields at `at`. For a policy (full) the algorithm's fields
// are required; an override may set any subset, the rest being inherited. Fields of the other
// algorithm family are errors either way.
func checkLimit(es *Errors, at string, alg bucket.Algorithm, f limitFields, full bool) {
	name := limitterms.AlgorithmName(alg)
	if isBucket(alg) {
		if f.limit != 0 {
			es.add(at+".limit", strconv.FormatInt(f.limit, 10), "not used by "+name+": set rate and burst")
		}
		if f.window != 0 || f.windowSet {
			es.add(at+".window", limitterms.ShortDuration(f.window), "not used by "+name+": set rate and burst")
		}
		if f.rate == "" && full {
			es.add(at+".rate", "", "required for "+name+": N/s, N/m or N/h")
		} else if f.rate != "" {
			if _, err := ParseRate(f.rate); err != nil {
				es.add(at+".rate", f.rate, err.Error())
			}
		}
		checkCount(es, at+".burst", f.burst, name, full)
		return
	}
	if alg == bucket.Concurrency {
		if f.rate != "" {
			es.add(at+".rate", f.rate, "not used by concurrency: set limit (requests in flight at once)")
		}
		if f.burst != 0 {
			es.add(at+".burst", strconv.FormatInt(f.burst, 10), "not used by concurrency: set limit (requests in flight at once)")
		}
		if f.window != 0 || f.windowSet {
			es.add(at+".window", limitterms.ShortDuration(f.window), "not used by concurrency: a slot is held while its request is in flight")
		}
		checkCount(es, at+".limit", f.limit, name, full)
		return
	}
	set := "set limit and window"
	if alg == bucket.Quota {
		set = "set limit and period"
	}
	if f.rate != "" {
		es.add(at+".rate", f.rate, "not used by "+name+": "+set)
	}
	if f.burst != 0 {
		es.add(at+".burst", strconv.FormatInt(f.burst, 10), "not used by "+name+": "+set)
	}
	checkCount(es, at+".limit", f.limit, name, full)
	if alg == bucket.Quota {
		if f.window != 0 || f.windowSet {
			es.add(at+".window", limitterms.ShortDuration(f.window), "not used by quota: "+set+" (day, week or month)")
		}
		return
	}
	switch w := f.window; {
	case w < 0 || w == 0 && f.windowSet:
		// Quoted like every other bad value: "required" would hide what the user wrote.
		es.add(at+".window", limitterms.ShortDuration(w), "must be positive")
	case w == 0 && full:
		es.add(at+".window", "", "required for "+name+": a duration such as 1m")
	case w == 0:
	case w < minWindow:
		es.add(at+".window", limitterms.ShortDuration(w), "must be at least "+limitterms.ShortDuration(minWindow))
	case w > maxWindow:
		es.add(at+".window", limitterms.ShortDuration(w), "must be at most "+limitterms.ShortDuration(maxWindow))
	}
}

// checkPathPrefix checks a path_prefix: requests are matched by their canonical path, so a
// prefix that is not canonical (but for case) would match nothing it seems to.
func checkPathPrefix(es *Errors, at, pp string) {
	switch {
	case pp == "":
	case pp[0] != '/':
		es.add(at, pp, `must start with "/"`)
	default:
		if canon, _ := CanonicalPath(pp, false); canon != pp {
			es.add(at, pp, fmt.Sprintf(`must be a canonical path (%q): requests are matched without ';' parameters, repeated slashes, "." and ".." segments, with '\\' as '/'`, canon))
		}
	}
}

// checkCosts checks the entries of a policy's costs (their costs against the limit are checked
// with the policy's own cost).
func checkCosts(es *Errors, at string, costs []CostConfig) {
	for j := range costs {
		c := &costs[j]
		cat := fmt.Sprintf("%s.costs[%d]", at, j)
		if len(c.Methods) == 0 && c.PathPrefix == "" {
			es.add(cat, "", "needs methods or path_prefix: an entry for every request is the policy's cost")
		}
		for k, m := range c.Methods {
			if !methods[m] {
				es.add(fmt.Sprintf("%s.methods[%d]", cat, k), m, "must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE")
			}
		}
		checkPathPrefix(es, cat+".path_prefix", c.PathPrefix)
		switch {
		case c.Cost == 0:
			es.add(cat+".cost", "", "required: at least 1")
		case c.Cost < 0:
			es.add(cat+".cost", strconv.FormatInt(c.Cost, 10), "must be at least 1")
		case c.Cost > limitterms.MaxCount:
			es.add(cat+".cost", strconv.FormatInt(c.Cost, 10), fmt.Sprintf("must be at most %d", limitterms.MaxCount))
		}
	}
}

// maxCost is the highest cost a request of the policy can have.
func maxCost(p *PolicyConfig) int64 {
	c := max(p.Cost, 1)
	for _, e := range p.Costs {
		c = max(c, e.Cost)
	}
	return c
}

// capacity is the most one request can cost under a valid limit: what a full bucket, a window or
// a period holds.
func capacity(alg bucket.Algorithm, f limitFields) int64 {
	switch alg {
	case bucket.TokenBucket:
		return f.burst
	case bucket.LeakyBucket:
		return f.burst + 1 // the request in service and burst waiting
	}
	return f.limit
}

// checkCost rejects a cost that the (effective, valid) limit f can never admit: every such
// request would be refused forever. path names the field to blame; shown is its value.
func checkCost(es *Errors, path string, shown, cost int64, f limitFields, alg bucket.Algorithm) {
	cost = max(cost, 1)
	if c := capacity(alg, f); cost > c {
		es.add(path, strconv.FormatInt(shown, 10), fmt.Sprintf(
			"a request costing %d never fits in what the limit holds (%d): raise the limit or lower cost", cost, c))
	}
}

// checkCalendar checks a quota's period, time_zone and offset, and refuses them on the other
// algorithms.
func checkCalendar(es *Errors, at string, p *PolicyConfig, alg bucket.Algorithm) {
	if alg != bucket.Quota {
		why := "not used by " + limitterms.AlgorithmName(alg) + ": calendar periods are algorithm: quota"
		if p.Period != "" {
			es.add(at+".period", p.Period, why)
		}
		if p.TimeZone != "" {
			es.add(at+".time_zone", p.TimeZone, why)
		}
		if p.Offset != 0 {
			es.add(at+".offset", strconv.Itoa(p.Offset), why)
		}
		return
	}
	_, ok := periods[p.Period]
	switch {
	case p.Period == "":
		es.add(at+".period", "", "required for quota: day, week or month")
	case !ok:
		es.add(at+".period", p.Period, "must be day, week or month")
	}
	if _, err := limitterms.LoadZone(p.TimeZone); err != nil {
		es.add(at+".time_zone", p.TimeZone, err.Error())
	}
}

func checkCount(es *Errors, path string, n int64, alg string, full bool) {
	switch {
	case n == 0 && full:
		es.add(path, "", "required for "+alg+": at least 1")
	case n == 0:
	case n < 1:
		es.add(path, strconv.FormatInt(n, 10), "must be at least 1")
	case n > limitterms.MaxCount:
		es.add(path, strconv.FormatInt(n, 10), fmt.Sprintf("must be at most %d", limitterms.MaxCount))
	}
}

// checkChargeOn checks a policy's charge_on list: each entry a status code (100 to 599) or a
// class (1xx to 5xx), for an algorithm whose charges can be refunded exactly.
func checkChargeOn(es *Errors, at string, list []string, alg bucket.Algorithm, algOK bool) {
	if list == nil {
		return
	}
	if len(list) == 0 {
		es.add(at+".charge_on", "", "must list at least one status (such as 401) or class (such as 5xx); remove it to charge every request")
		return
	}
	if algOK && (alg == bucket.LeakyBucket || alg == bucket.Concurrency) {
		why := "a leaky bucket has already held the request for its turn"
		if alg == bucket.Concurrency {
			why = "a concurrency slot is given back when the request ends, whatever its answer"
		}
		es.add(at+".charge_on", "", "not supported by "+limitterms.AlgorithmName(alg)+": "+why+"; use token_bucket, fixed_window, sliding_window or quota")
	}
	for i, v := range list {
		if _, err := ParseStatusSet([]string{v}); err != nil {
			es.add(fmt.Sprintf("%s.charge_on[%d]", at, i), v, err.Error())
		}
	}
}

// maxDynamoSlots bounds a concurrency limit on DynamoDB: the key's item holds one lease
// attribute (about 30 bytes) per slot in flight, and an item holds at most 400 KB.
const maxDynamoSlots = 10_000

// checkSlotsFit refuses concurrency limits (the policy's and its overrides') whose slots would
// not fit one DynamoDB item.
func checkSlotsFit(es *Errors, at string, p *PolicyConfig) {
	if p.Algorithm != "concurrency" {
		return
	}
	const why = "with store.backend dynamodb a concurrency limit must be at most 10000 (one lease attribute per slot in one item)"
	if p.Limit > maxDynamoSlots {
		es.add(at+".limit", strconv.FormatInt(p.Limit, 10), why)
	}
	for j, o := range p.Overrides {
		if o.Limit > maxDynamoSlots {
			es.add(fmt.Sprintf("%s.overrides[%d].limit", at, j), strconv.FormatInt(o.Limit, 10), why)
		}
	}
}
