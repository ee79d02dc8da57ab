package replay

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// parsed is what a test expects of a line.
type parsed struct {
	t            time.Time
	coarse       bool
	status       int
	duration     time.Duration
	f            policy.Fields
	pseudonymous bool
}

func parseOne(t *testing.T, p *parser, line string) (parsed, error) {
	t.Helper()
	var rec record
	err := p.parse([]byte(line), &rec)
	if err != nil {
		return parsed{}, err
	}
	f := rec.f
	// Copy the aliased strings: the test compares after the buffer is gone.
	f.Method, f.Path = strings.Clone(f.Method), strings.Clone(f.Path)
	f.IP, f.APIKey, f.User = strings.Clone(f.IP), strings.Clone(f.APIKey), strings.Clone(f.User)
	f.Headers = append([]policy.KindValue(nil), f.Headers...)
	if len(f.Headers) == 0 {
		f.Headers = nil
	}
	return parsed{t: time.Unix(0, rec.t).UTC(), coarse: rec.coarse, status: rec.status, duration: time.Duration(rec.duration),
		f: f, pseudonymous: rec.pseudonymous}, nil
}

func TestParseLines(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 9, 0, 7, 0, time.UTC)
	ip := netip.MustParseAddr
	tests := []struct {
		name      string
		format    Format
		keyFields []string
		line      string
		want      parsed
	}{
		{"combined", Auto, nil,
			`192.0.2.1 - - [24/Nov/2026:10:00:07 +0100] "GET /api/x?key=secret HTTP/1.1" 200 5 "-" "curl/8"`,
			parsed{t: t0, coarse: true, status: 200, f: policy.Fields{Method: "GET", Path: "/api/x", Client: ip("192.0.2.1")}}},
		{"common (no referer, agent)", Combined, nil,
			`2001:db8::1 - frank [24/Nov/2026:09:00:07 +0000] "POST /a%2Fb%20c HTTP/1.0" 201 0`,
			parsed{t: t0, coarse: true, status: 201, f: policy.Fields{Method: "POST", Path: "/a/b c", Client: ip("2001:db8::1")}}},
		{"combined with key fields", Auto, []string{"api_key", "", "header:x-tenant", "duration"},
			`192.0.2.1 - - [24/Nov/2026:09:00:07 +0000] "GET / HTTP/1.1" 429 5 "https://r/" "Mozilla \"x\" 5" "sk_1" "skipped" acme 0.125`,
			parsed{t: t0, coarse: true, status: 429, duration: 125 * time.Millisecond, f: policy.Fields{Method: "GET", Path: "/", Client: ip("192.0.2.1"), APIKey: "sk_1",
				Headers: []policy.KindValue{{Kind: "header:x-tenant", Value: "acme"}}}}},
		{"combined with a dash for an empty key", Auto, []string{"user"},
			`192.0.2.1 - - [24/Nov/2026:09:00:07 +0000] "GET / HTTP/1.1" 200 5 "-" "-" "-"`,
			parsed{t: t0, coarse: true, status: 200, f: policy.Fields{Method: "GET", Path: "/", Client: ip("192.0.2.1")}}},
		{"alb with request_creation_time", Auto, nil,
			`https 2026-11-24T09:00:09.500000Z app/my-lb/50dc6c495c0c9188 [2001:db8::2]:2817 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "GET https://api.example.com:443/api/orders?x=1 HTTP/1.1" "curl/7.46.0" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337281-1d84f3d73c47ec4e58577259" "api.example.com" "arn:aws:acm:us-east-2:123456789012:certificate/12345678" 1 2026-11-24T09:00:07.250000Z "forward" "-" "-" "10.0.0.1:80" "200" "-" "-"`,
			parsed{t: t0.Add(250 * time.Millisecond), status: 200, duration: time.Millisecond, f: policy.Fields{Method: "GET", Path: "/api/orders", Client: ip("2001:db8::2")}}},
		{"alb, short line: time", ALB, nil,
			`http 2026-11-24T09:00:07.000001Z app/lb/1 192.0.2.9:1 - -1 -1 -1 460 - 1 2 "POST http://h:80/ HTTP/1.1" "-"`,
			parsed{t: t0.Add(time.Microsecond), status: 460, f: policy.Fields{Method: "POST", Path: "/", Client: ip("192.0.2.9")}}},
		{"gateway", Auto, nil,
			`{"level":"info","ts":"2026-11-24T09:00:07.000Z","logger":"access","msg":"request","time":"2026-11-24T09:00:07.123456789Z","method":"GET","path":"/api/\u00e9x","status":429,"duration_seconds":0.0001,"decision":"limited","policy":"p","keys":{"ip":"aa11","api_key":"bb22","user":"cc33","header:x-tenant":"dd44","other":5}}`,
			parsed{t: t0.Add(123456789), status: 429, duration: 100 * time.Microsecond, pseudonymous: true, f: policy.Fields{Method: "GET", Path: "/api/éx", IP: "aa11",
				APIKey: "bb22", User: "cc33", Headers: []policy.KindValue{{Kind: "header:x-tenant", Value: "dd44"}}}}},
		{"gateway, offset time and nested values", Gateway, nil,
			`{"x":{"a":[1,{"b":"}"}]},"logger":"access","msg":"request","time":"2026-11-24T10:00:07+01:00","method":"DELETE","path":"/"}`,
			parsed{t: t0, pseudonymous: true, f: policy.Fields{Method: "DELETE", Path: "/"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &parser{format: tt.format, keyFields: tt.keyFields}
			got, err := parseOne(t, p, tt.line)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, line, want string
	}{
		{"no address", `- - - [24/Nov/2026:09:00:07 +0000] "GET / HTTP/1.1" 200 5`, "remote address"},
		{"bad month", `192.0.2.1 - - [24/Foo/2026:09:00:07 +0000] "GET / HTTP/1.1" 200 5`, "time"},
		{"day 31 in November", `192.0.2.1 - - [31/Nov/2026:09:00:07 +0000] "GET / HTTP/1.1" 200 5`, "time"},
		{"unclosed time", `192.0.2.1 - - [24/Nov/2026:09:00:07 +0000 "GET / HTTP/1.1" 200 5`, "not closed"},
		{"garbage request", `192.0.2.1 - - [24/Nov/2026:09:00:07 +0000] "\x16\x03\x01" 400 0`, "request"},
		{"request not a path", `192.0.2.1 - - [24/Nov/2026:09:00:07 +0000] "GET foo HTTP/1.1" 200 5`, "not a path"},
		{"missing key field", `192.0.2.1 - - [24/Nov/2026:09:00:07 +0000] "GET / HTTP/1.1" 200 5 "-" "-"`, "extra"},
		{"alb bad client", `https 2026-11-24T09:00:09.500000Z app/x bad 10.0.0.1:80 0 0 0 200 200 1 1 "GET https://h/ HTTP/1.1" "-"`, "client"},
		{"json unclosed", `{"logger":"access","msg":"request"`, "not closed"},
		{"json no time", `{"logger":"access","msg":"request","method":"GET","path":"/"}`, "time"},
		{"json no path", `{"logger":"access","msg":"request","time":"2026-11-24T09:00:07Z","method":"GET"}`, "path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &parser{}
			if strings.Contains(tt.name, "key field") {
				p.keyFields = []string{"api_key"}
			}
			_, err := parseOne(t, p, tt.line)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
	// Other lines of the gateway's log and blank lines are skipped, not unparseable.
	for _, line := range []string{"", "  \r", `{"level":"info","msg":"ratelimit-proxy serving"}`,
		`{"level":"info","logger":"proxy","msg":"rate limited","key":"x"}`} {
		if _, err := parseOne(t, &parser{}, line); !errors.Is(err, errSkip) {
			t.Errorf("%q: got %v, want errSkip", line, err)
		}
	}
}

// TestTimeParsersMatchTimePackage checks the hand-written parsers against time.Parse.
func TestTimeParsersMatchTimePackage(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	zones := []*time.Location{time.UTC, time.FixedZone("", -7*3600), time.FixedZone("", 5*3600+1800)}
	for range 5000 {
		ts := time.Unix(rng.Int64N(4_000_000_000), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))])
		clf := ts.Format("02/Jan/2006:15:04:05 -0700")
		got, ok := parseCLFTime([]byte(clf))
		if want := ts.Truncate(time.Second).UnixNano(); !ok || got != want {
			t.Fatalf("parseCLFTime(%q) = %d, %v; want %d", clf, got, ok, want)
		}
		for _, layout := range []string{time.RFC3339Nano, time.RFC3339, "2006-01-02T15:04:05.000000Z07:00"} {
			s := ts.Format(layout)
			want, err := time.Parse(layout, s)
			if err != nil {
				t.Fatal(err)
			}
			if got, ok := parseISOTime([]byte(s)); !ok || got != want.UnixNano() {
				t.Fatalf("parseISOTime(%q) = %d, %v; want %d", s, got, ok, want.UnixNano())
			}
		}
	}
	for _, bad := range []string{"2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z",
		"2026-01-01T00:00:00", "2026-01-01T00:00:00.Z", "2026-01-01T00:00:00.1234567890Z", "2026-01-01T00:00:00+25:00"} {
		if _, ok := parseISOTime([]byte(bad)); ok {
			t.Errorf("parseISOTime(%q) accepted", bad)
		}
	}
}

func TestParseKeyFields(t *testing.T) {
	got, err := ParseKeyFields("api_key, -, header:X-Tenant,user")
	if want := []string{"api_key", "", "header:x-tenant", "user"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"ip", "cookie", "api_key,,user", "header:"} {
		if _, err := ParseKeyFields(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
