package bucket

import "time"

// QuotaN takes a request that costs n (>= 1) requests at instant now (Unix ns) from a calendar
// quota: l.Count requests per l.Period (a day, week or month of l.Zone's calendar, moved by
// l.Offset days), the quota half of an API Gateway usage plan. The state is a FixedState whose
// End is the next period start, so a store keeps it (and forgets it once the period is over)
// exactly like a fixed window's.
//
// The request is admitted while the period's count plus n is at most Count. Limit is Count,
// Remaining is Count minus the period's count, Reset is the time until the next period starts,
// and a rejection's RetryAfter is the same time.
//
// A request within the stored period (now < End) is decided without reading the calendar, so a
// quota costs what a fixed window costs; the period is computed once per period per key. A clock
// that steps back into an earlier period keeps counting in the newer stored one, which can only
// reject more, never admit more.
func QuotaN(s FixedState, now int64, l Limit, n int64) (FixedState, Result) {
	if now >= s.End {
		_, end := QuotaPeriod(now, l)
		s = FixedState{End: end}
	}
	return s.take(now, l.Count, n)
}

// QuotaPeriod returns the period of a quota Limit that holds the instant now (Unix ns):
// start <= now < end, both Unix ns.
//
// Periods are aligned to midnight in l.Zone (UTC when nil): a day runs from one midnight to
// the next, so it has 23 or 25 hours on a daylight-saving day; a week runs from midnight of
// weekday l.Offset (0 Sunday, 1 Monday, ... as time.Weekday) for seven calendar days; a month
// runs from midnight of day 1+l.Offset of one calendar month to the same day of the next, so it
// has 28 to 31 days. In a zone where a DST change skips midnight, a period starts at the instant
// time.Date gives for that midnight; the day before ends at the same instant, so periods never
// overlap and never leave a gap.
func QuotaPeriod(now int64, l Limit) (start, end int64) {
	loc := l.Zone
	if loc == nil {
		loc = time.UTC
	}
	t := time.Unix(0, now).In(loc)
	y, m, d := t.Date()
	// bound(k) is the start of the k-th period after the one of now's calendar date.
	var bound func(k int) int64
	switch l.Period {
	case Week:
		d -= (int(t.Weekday()) - int(l.Offset%7) + 7) % 7
		bound = func(k int) int64 { return time.Date(y, m, d+7*k, 0, 0, 0, 0, loc).UnixNano() }
	case Month:
		first := 1 + int(min(l.Offset, 27))
		if d < first {
			m--
		}
		bound = func(k int) int64 { return time.Date(y, m+time.Month(k), first, 0, 0, 0, 0, loc).UnixNano() }
	default: // Day; the policy package never lets another value through
		bound = func(k int) int64 { return time.Date(y, m, d+k, 0, 0, 0, 0, loc).UnixNano() }
	}
	start, end = bound(0), bound(1)
	// Where midnight does not exist (a DST jump at 00:00), time.Date places it before or after
	// the jump; both neighbours of a bound compute it from the same date, so periods meet. now
	// can then fall just outside its own date's period: it belongs to the neighbour.
	switch {
	case now >= end:
		return end, bound(2)
	case now < start:
		return bound(-1), start
	}
	return start, end
}
