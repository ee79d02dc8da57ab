package replay

import (
	"context"
	"strings"
	"testing"
)

// The fuzz targets feed arbitrary lines to each parser: none may panic, and a line they accept
// must be a request the policies can plan (a method, a path starting with /).
func fuzzParser(f *testing.F, format Format, keyFields []string, seeds ...string) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		p := &parser{format: format, keyFields: keyFields}
		var rec record
		err := p.parse([]byte(line), &rec)
		if err != nil {
			return
		}
		if rec.f.Method == "" || !strings.HasPrefix(rec.f.Path, "/") && rec.f.Path != "*" {
			t.Fatalf("accepted %q as method %q path %q", line, rec.f.Method, rec.f.Path)
		}
	})
}

func FuzzParseCombined(f *testing.F) {
	fuzzParser(f, Combined, []string{"api_key", "", "header:x-tenant", "duration"},
		`192.0.2.1 - - [24/Nov/2026:10:00:07 +0100] "GET /api/x?key=secret HTTP/1.1" 200 5 "-" "curl/8" "k" "-" "t"`,
		`2001:db8::1 - frank [24/Nov/2026:09:00:07 +0000] "POST /a%2Fb%20c HTTP/1.0" 201 0`,
		`192.0.2.1 - - [24/Nov/2026:09:00:07 +0000] "GET / HTTP/1.1" 429 5 "https://r/" "Mozilla \"x\" 5" "sk_1" "s" acme`)
}

func FuzzParseALB(f *testing.F) {
	fuzzParser(f, ALB, nil,
		`https 2026-11-24T09:00:09.500000Z app/my-lb/50dc6c495c0c9188 [2001:db8::2]:2817 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "GET https://api.example.com:443/api/orders?x=1 HTTP/1.1" "curl/7.46.0" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337281-1d84f3d73c47ec4e58577259" "api.example.com" "arn" 1 2026-11-24T09:00:07.250000Z "forward" "-" "-" "10.0.0.1:80" "200" "-" "-"`,
		`http 2026-11-24T09:00:07.000001Z app/lb/1 192.0.2.9:1 - -1 -1 -1 460 - 1 2 "POST http://h:80/ HTTP/1.1" "-"`)
}

func FuzzParseGateway(f *testing.F) {
	fuzzParser(f, Gateway, nil,
		`{"level":"info","ts":"2026-11-24T09:00:07.000Z","logger":"access","msg":"request","time":"2026-11-24T09:00:07.123456789Z","method":"GET","path":"/api/\u00e9x","status":429,"keys":{"ip":"aa11","api_key":"bb22","header:x-t":"c"}}`,
		`{"x":{"a":[1,{"b":"}"}]},"logger":"access","msg":"request","time":"2026-11-24T10:00:07+01:00","method":"DELETE","path":"/"}`,
		`{"logger":"access","msg":"request","time":"2026-11-24T09:00:07Z","method":"GET","path":"/\ud83d\ude00"}`)
}

// FuzzReplay feeds whole logs (any format, mixed) to a Replayer: no panic, and every line is
// counted once as a request, an unparseable line or a skipped one.
func FuzzReplay(f *testing.F) {
	f.Add("192.0.2.1 - - [24/Nov/2026:10:00:07 +0100] \"GET / HTTP/1.1\" 200 5 \"-\" \"-\" \"k\"\n{\"logger\":\"access\",\"msg\":\"request\",\"time\":\"2026-11-24T09:00:07Z\",\"method\":\"GET\",\"path\":\"/\",\"keys\":{\"ip\":\"x\"}}\n\ngarbage\n")
	set := compile(f, `upstream: http://h
policies:
  - {name: per-ip, key: ip, algorithm: token_bucket, rate: 2/s, burst: 1}
  - {name: per-key, key: api_key, algorithm: sliding_window, limit: 3, window: 1s}
`)
	f.Fuzz(func(t *testing.T, log string) {
		r, err := New(Options{Set: set, MaxKeys: 64, KeyFields: []string{"api_key"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Read(context.Background(), "fuzz", strings.NewReader(log)); err != nil {
			t.Fatal(err)
		}
		rep := r.Report()
		if rep.Requests+rep.Unparseable+rep.Skipped != rep.Lines || rep.Admitted+rep.Limited != rep.Requests {
			t.Fatalf("counts do not add up: %+v", rep)
		}
	})
}
