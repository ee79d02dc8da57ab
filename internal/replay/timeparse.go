package replay

import "time"

// The timestamp parsers below read the two shapes of the supported logs by hand: time.Parse
// costs a few hundred nanoseconds, a third of the whole budget of a line at a million lines a
// second. Both return unix nanoseconds and validate every field, so a wrong timestamp is an
// unparseable line, never a silently wrong clock.

var months = [12]string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}

// parseCLFTime reads nginx's and Apache's $time_local, `02/Jan/2006:15:04:05 -0700`.
func parseCLFTime(b []byte) (int64, bool) {
	if len(b) != 26 || b[2] != '/' || b[6] != '/' || b[11] != ':' || b[14] != ':' || b[17] != ':' || b[20] != ' ' {
		return 0, false
	}
	day, ok1 := num(b[0:2])
	year, ok2 := num(b[7:11])
	hh, ok3 := num(b[12:14])
	mm, ok4 := num(b[15:17])
	ss, ok5 := num(b[18:20])
	if !(ok1 && ok2 && ok3 && ok4 && ok5) {
		return 0, false
	}
	month := 0
	for i, m := range months {
		if b[3] == m[0] && b[4] == m[1] && b[5] == m[2] {
			month = i + 1
			break
		}
	}
	if month == 0 {
		return 0, false
	}
	off, ok := zoneOffset(b[21:26])
	if !ok {
		return 0, false
	}
	secs, ok := civil(year, month, day, hh, mm, ss)
	if !ok {
		return 0, false
	}
	return (secs - off) * int64(time.Second), true
}

// parseISOTime reads RFC 3339 times as ALB and the gateway write them:
// `2006-01-02T15:04:05Z`, with an optional fraction of up to 9 digits and `Z` or `±hh:mm`.
func parseISOTime(b []byte) (int64, bool) {
	if len(b) < 20 || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' {
		return 0, false
	}
	year, ok1 := num(b[0:4])
	month, ok2 := num(b[5:7])
	day, ok3 := num(b[8:10])
	hh, ok4 := num(b[11:13])
	mm, ok5 := num(b[14:16])
	ss, ok6 := num(b[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return 0, false
	}
	rest := b[19:]
	var frac int64
	if rest[0] == '.' {
		i := 1
		scale := int64(time.Second)
		for i < len(rest) && isDigit(rest[i]) {
			if i > 9 {
				return 0, false
			}
			scale /= 10
			frac += int64(rest[i]-'0') * scale
			i++
		}
		if i == 1 {
			return 0, false
		}
		rest = rest[i:]
	}
	var off int64
	switch {
	case len(rest) == 1 && rest[0] == 'Z':
	case len(rest) == 6 && rest[3] == ':':
		var ok bool
		if off, ok = zoneOffset([]byte{rest[0], rest[1], rest[2], rest[4], rest[5]}); !ok {
			return 0, false
		}
	default:
		return 0, false
	}
	secs, ok := civil(year, month, day, hh, mm, ss)
	if !ok {
		return 0, false
	}
	return (secs-off)*int64(time.Second) + frac, true
}

// zoneOffset reads `+hhmm` / `-hhmm` as seconds east of UTC.
func zoneOffset(b []byte) (int64, bool) {
	if len(b) != 5 || (b[0] != '+' && b[0] != '-') {
		return 0, false
	}
	h, ok1 := num(b[1:3])
	m, ok2 := num(b[3:5])
	if !ok1 || !ok2 || h > 23 || m > 59 {
		return 0, false
	}
	off := int64(h*3600 + m*60)
	if b[0] == '-' {
		off = -off
	}
	return off, true
}

// civil returns the unix seconds of a UTC civil time, validating the ranges (leap seconds
// excluded, as Go's time package does).
func civil(year, month, day, hh, mm, ss int) (int64, bool) {
	if year < 1970 || month < 1 || month > 12 || day < 1 || day > daysIn(year, month) ||
		hh > 23 || mm > 59 || ss > 59 {
		return 0, false
	}
	// Days from civil (Howard Hinnant's algorithm), for years from 1970.
	y := year
	if month <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	mp := (month + 9) % 12
	doy := (153*mp+2)/5 + day - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	days := int64(era)*146097 + int64(doe) - 719468
	return days*86400 + int64(hh*3600+mm*60+ss), true
}

func daysIn(year, month int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

func num(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
