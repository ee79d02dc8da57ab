package bucket_test

import (
	"testing"
	"time"
	_ "time/tzdata" // the named zones below, whatever the machine has installed

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return v
}

// TestQuotaPeriod pins period bounds at fixed instants: month ends, leap years, offsets, and
// DST days (23 and 25 hours) in named zones.
func TestQuotaPeriod(t *testing.T) {
	berlin, newYork, sydney := mustZone(t, "Europe/Berlin"), mustZone(t, "America/New_York"), mustZone(t, "Australia/Sydney")
	day := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Day}
	week := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Week}
	month := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: bucket.Month}
	in := func(l bucket.Limit, z *time.Location) bucket.Limit { l.Zone = z; return l }
	off := func(l bucket.Limit, o uint8) bucket.Limit { l.Offset = o; return l }
	for _, tc := range []struct {
		name       string
		l          bucket.Limit
		now        string
		start, end string
	}{
		{"day UTC", day, "2024-02-28T13:00:00Z", "2024-02-28T00:00:00Z", "2024-02-29T00:00:00Z"},
		{"day UTC last ns", day, "2024-02-29T23:59:59.999999999Z", "2024-02-29T00:00:00Z", "2024-03-01T00:00:00Z"},
		{"day UTC first ns", day, "2024-03-01T00:00:00Z", "2024-03-01T00:00:00Z", "2024-03-02T00:00:00Z"},
		{"day Berlin winter", in(day, berlin), "2024-01-10T23:30:00Z", "2024-01-10T23:00:00Z", "2024-01-11T23:00:00Z"},
		{"day Berlin spring forward: 23h", in(day, berlin), "2024-03-31T12:00:00Z", "2024-03-30T23:00:00Z", "2024-03-31T22:00:00Z"},
		{"day Berlin fall back: 25h", in(day, berlin), "2024-10-27T12:00:00Z", "2024-10-26T22:00:00Z", "2024-10-27T23:00:00Z"},
		{"day Sydney fall back: 25h", in(day, sydney), "2024-04-07T05:00:00Z", "2024-04-06T13:00:00Z", "2024-04-07T14:00:00Z"},
		{"week Sunday start (offset 0)", week, "2024-03-06T10:00:00Z", "2024-03-03T00:00:00Z", "2024-03-10T00:00:00Z"},
		{"week Monday start (offset 1)", off(week, 1), "2024-03-06T10:00:00Z", "2024-03-04T00:00:00Z", "2024-03-11T00:00:00Z"},
		{"week Monday start on a Sunday", off(week, 1), "2024-03-10T23:59:59Z", "2024-03-04T00:00:00Z", "2024-03-11T00:00:00Z"},
		{"week Saturday start (offset 6)", off(week, 6), "2024-03-09T00:00:00Z", "2024-03-09T00:00:00Z", "2024-03-16T00:00:00Z"},
		{"week across new year", off(week, 1), "2025-01-01T00:00:00Z", "2024-12-30T00:00:00Z", "2025-01-06T00:00:00Z"},
		{"week New York with spring forward: 7d-1h", in(week, newYork), "2024-03-12T12:00:00Z", "2024-03-10T05:00:00Z", "2024-03-17T04:00:00Z"},
		{"month leap February: 29d", month, "2024-02-15T00:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"},
		{"month common February: 28d", month, "2023-02-28T23:59:59Z", "2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z"},
		{"month 31 days, last ns", month, "2024-01-31T23:59:59.999999999Z", "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z"},
		{"month December into next year", month, "2024-12-31T23:00:00Z", "2024-12-01T00:00:00Z", "2025-01-01T00:00:00Z"},
		{"month leap year 2000", month, "2000-02-29T12:00:00Z", "2000-02-01T00:00:00Z", "2000-03-01T00:00:00Z"},
		{"month century non-leap 2100", month, "2100-02-28T12:00:00Z", "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z"},
		{"month Berlin", in(month, berlin), "2024-03-31T22:30:00Z", "2024-03-31T22:00:00Z", "2024-04-30T22:00:00Z"},
		{"month Berlin, October has 31d+1h", in(month, berlin), "2024-10-15T00:00:00Z", "2024-09-30T22:00:00Z", "2024-10-31T23:00:00Z"},
		{"month from the 15th (offset 14), before it", off(month, 14), "2024-03-14T23:59:59Z", "2024-02-15T00:00:00Z", "2024-03-15T00:00:00Z"},
		{"month from the 15th (offset 14), on it", off(month, 14), "2024-03-15T00:00:00Z", "2024-03-15T00:00:00Z", "2024-04-15T00:00:00Z"},
		{"month from the 28th (offset 27) in February", off(month, 27), "2023-02-28T00:00:00Z", "2023-02-28T00:00:00Z", "2023-03-28T00:00:00Z"},
		{"month from the 28th (offset 27) in January", off(month, 27), "2024-01-05T00:00:00Z", "2023-12-28T00:00:00Z", "2024-01-28T00:00:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, end := bucket.QuotaPeriod(mustTime(t, tc.now).UnixNano(), tc.l)
			wantStart, wantEnd := mustTime(t, tc.start), mustTime(t, tc.end)
			if start != wantStart.UnixNano() || end != wantEnd.UnixNano() {
				t.Errorf("got [%v, %v), want [%v, %v)", time.Unix(0, start).UTC(), time.Unix(0, end).UTC(), wantStart, wantEnd)
			}
		})
	}
}

// TestQuotaPeriodsTile walks across DST changes minute by minute, including one where midnight
// does not exist (America/Santiago, 2024-09-08: 24:00 jumps to 01:00), and checks that every
// instant lies in its period and that each period starts where the one before ended.
func TestQuotaPeriodsTile(t *testing.T) {
	for _, tc := range []struct {
		zone string
		from string
	}{
		{"America/Santiago", "2024-09-07T18:00:00Z"},
		{"America/Santiago", "2024-04-06T18:00:00Z"}, // 24:00 falls back to 23:00
		{"Europe/Berlin", "2024-03-30T18:00:00Z"},
		{"America/Havana", "2024-03-09T18:00:00Z"}, // 00:00 jumps to 01:00
	} {
		loc := mustZone(t, tc.zone)
		for _, p := range []bucket.Period{bucket.Day, bucket.Week, bucket.Month} {
			l := bucket.Limit{Algorithm: bucket.Quota, Count: 1, Period: p, Zone: loc, Offset: 0}
			from := mustTime(t, tc.from)
			prevStart, prevEnd := bucket.QuotaPeriod(from.UnixNano(), l)
			for m := range 24 * 60 {
				now := from.Add(time.Duration(m) * time.Minute).UnixNano()
				start, end := bucket.QuotaPeriod(now, l)
				if now < start || now >= end {
					t.Fatalf("%s period %d at %v: got [%v, %v), which does not hold now", tc.zone, p,
						time.Unix(0, now).In(loc), time.Unix(0, start).In(loc), time.Unix(0, end).In(loc))
				}
				if start != prevStart && start != prevEnd {
					t.Fatalf("%s period %d at %v: got start %v, want the previous period's end %v", tc.zone, p,
						time.Unix(0, now).In(loc), time.Unix(0, start).In(loc), time.Unix(0, prevEnd).In(loc))
				}
				if p == bucket.Day && (end-start < int64(22*time.Hour) || end-start > int64(26*time.Hour)) {
					t.Fatalf("%s day at %v: got %v long", tc.zone, time.Unix(0, now).In(loc), time.Duration(end-start))
				}
				prevStart, prevEnd = start, end
			}
		}
	}
}

func quotaTaker(l bucket.Limit, n int64) func(int64) bucket.Result {
	var s bucket.FixedState
	return func(now int64) bucket.Result {
		next, r := bucket.QuotaN(s, now, l, n)
		if r.Allowed {
			s = next
		}
		return r
	}
}

// TestQuotaSteps: a monthly quota of 3 across the end of January and into a leap February, in
// UTC; Reset always points at the next month's start.
func TestQuotaSteps(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.Quota, Count: 3, Period: bucket.Month}
	base := mustTime(t, "2024-01-31T23:59:57Z")
	take := quotaTaker(l, 1)
	day := 24 * time.Hour
	for i, st := range []struct {
		at   time.Duration
		want bucket.Result
	}{
		{0, allowed(3, 2, sec(3), 0)},
		{sec(1), allowed(3, 1, sec(2), 0)},
		{sec(2), allowed(3, 0, sec(1), 0)},
		{sec(2), rejected(3, sec(1), sec(1))},
		// February 2024 has 29 days: Reset is the whole month from its first instant.
		{sec(3), allowed(3, 2, 29*day, 0)},
		{sec(3) + 10*day, allowed(3, 1, 19*day, 0)},
		{sec(3) + 28*day, allowed(3, 0, day, 0)},
		{sec(3) + 29*day - 1, rejected(3, 1, 1)},
		// March: 31 days.
		{sec(3) + 29*day, allowed(3, 2, 31*day, 0)},
		// A clock that steps back into February keeps counting in March: stricter, never looser.
		{sec(3) + 28*day, allowed(3, 1, day+31*day, 0)},
	} {
		if got := take(base.Add(st.at).UnixNano()); got != st.want {
			t.Errorf("step %d at %v:\n got %+v\nwant %+v", i, base.Add(st.at), got, st.want)
		}
	}
}

// TestQuotaStepsDST: a daily quota in Berlin on the day clocks go back (25 hours).
func TestQuotaStepsDST(t *testing.T) {
	l := bucket.Limit{Algorithm: bucket.Quota, Count: 2, Period: bucket.Day, Zone: mustZone(t, "Europe/Berlin")}
	take := quotaTaker(l, 1)
	start := mustTime(t, "2024-10-26T22:00:00Z") // midnight in Berlin, CEST
	for i, st := range []struct {
		at   time.Duration
		want bucket.Result
	}{
		{0, allowed(2, 1, 25*time.Hour, 0)},
		{24 * time.Hour, allowed(2, 0, time.Hour, 0)}, // 23:00 local: an hour left, not zero
		{24 * time.Hour, rejected(2, time.Hour, time.Hour)},
		{25 * time.Hour, allowed(2, 1, 24*time.Hour, 0)},
	} {
		if got := take(start.Add(st.at).UnixNano()); got != st.want {
			t.Errorf("step %d at %v:\n got %+v\nwant %+v", i, start.Add(st.at), got, st.want)
		}
	}
}
