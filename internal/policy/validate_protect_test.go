package policy

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestParseProtectOffUnlessPresent(t *testing.T) {
	if cfg := mustParse(t, minimal, noEnv); cfg.Protect != nil {
		t.Errorf("got protect %+v, want nil: protection is off unless configured", cfg.Protect)
	}
}

func TestParseProtectDefaults(t *testing.T) {
	cfg := mustParse(t, minimal+"protect: {}\n", noEnv)
	want := ProtectConfig{Concurrency: ProtectConcurrencyConfig{Adaptive: true, Limit: 50, MinLimit: 2, MaxLimit: 1000}, Status: 503,
		MaxBufferedBody: 65536, StreamShare: 0.1}
	if cfg.Protect == nil || !reflect.DeepEqual(*cfg.Protect, want) {
		t.Errorf("got %+v, want %+v", cfg.Protect, want)
	}
}

func TestParseProtectIssueExample(t *testing.T) {
	cfg := mustParse(t, minimal+`protect:
  concurrency:
    adaptive: false
    limit: 7
    min_limit: 1
    max_limit: 9
    queue_timeout: 10ms
  priorities:
    - name: critical
      match: {headers: {X-Priority: critical}}
      reserve: 0.2
    - name: sheddable
      match: {path_prefix: /batch}
  status: 429
`, noEnv)
	p := cfg.Protect
	want := ProtectConcurrencyConfig{Adaptive: false, Limit: 7, MinLimit: 1, MaxLimit: 9, QueueTimeout: 10 * time.Millisecond}
	if p.Concurrency != want {
		t.Errorf("got concurrency %+v, want %+v", p.Concurrency, want)
	}
	if p.Status != 429 || len(p.Priorities) != 2 {
		t.Fatalf("got status %d, %d priorities; want 429, 2", p.Status, len(p.Priorities))
	}
	// Header names are kept as written (they match in any case).
	if got := p.Priorities[0].Match.Headers; !reflect.DeepEqual(got, map[string]string{"X-Priority": "critical"}) {
		t.Errorf("got headers %v, want X-Priority: critical", got)
	}
	if p.Priorities[0].Reserve != 0.2 || p.Priorities[1].Match.PathPrefix != "/batch" {
		t.Errorf("got %+v", p.Priorities)
	}
	if err := cfg.Validate(noEnv); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestValidateProtect(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"limit zero", "protect: {concurrency: {limit: 0}}",
			[]string{`protect.concurrency.limit: "0": must be from 1 to 100000`}},
		{"min above max", "protect: {concurrency: {min_limit: 10, max_limit: 5, limit: 7}}",
			[]string{`protect.concurrency.min_limit: "10": must not exceed max_limit (5)`}},
		{"start outside bounds", "protect: {concurrency: {limit: 2000}}",
			[]string{`protect.concurrency.limit: "2000": must be from min_limit (2) to max_limit (1000): it is the adaptive limit's start`}},
		{"fixed ignores bounds", "protect: {concurrency: {adaptive: false, limit: 2000, min_limit: 0}}", nil},
		{"negative queue", "protect: {concurrency: {queue_timeout: -1ms}}",
			[]string{`protect.concurrency.queue_timeout: "-1ms": must be from 0s (no waiting) to 1m`}},
		{"buffered body", "protect: {max_buffered_body: -1}",
			[]string{`protect.max_buffered_body: "-1": must be from 0 (every body streams) to 67108864 bytes`}},
		{"buffered body too large", "protect: {max_buffered_body: 67108865}",
			[]string{`protect.max_buffered_body: "67108865": must be from 0 (every body streams) to 67108864 bytes`}},
		{"no buffering", "protect: {max_buffered_body: 0}", nil},
		{"stream share zero", "protect: {stream_share: 0}",
			[]string{`protect.stream_share: "0": must be above 0 and at most 1 (a share of the limit)`}},
		{"stream share past 1", "protect: {stream_share: 1.5}",
			[]string{`protect.stream_share: "1.5": must be above 0 and at most 1 (a share of the limit)`}},
		{"write stall", "server: {write_stall_timeout: 10ms}",
			[]string{`server.write_stall_timeout: "10ms": must be from 100ms to 1h`}},
		{"status", "protect: {status: 500}",
			[]string{`protect.status: "500": must be 503 or 429`}},
		{"class name", "protect: {priorities: [{name: vip}, {match: {path_prefix: /x}}]}",
			[]string{`protect.priorities[0].name: "vip": must be critical, default or sheddable`,
				`protect.priorities[1].name: required: critical, default or sheddable`}},
		{"reserve range", "protect: {priorities: [{name: critical, reserve: 1.5}]}",
			[]string{`protect.priorities[0].reserve: "1.5": must be at least 0 and below 1 (a share of the limit)`}},
		{"reserve not a number", "protect: {priorities: [{name: critical, reserve: lots}]}", nil},
		{"sheddable reserve", "protect: {priorities: [{name: sheddable, reserve: 0.1}]}",
			[]string{`protect.priorities[0].reserve: "0.1": must be 0 for sheddable: a reserve is held back from the classes below, and none is below sheddable`}},
		{"two reserves of a class", "protect: {priorities: [{name: critical, reserve: 0.1}, {name: critical, reserve: 0.1}]}",
			[]string{`protect.priorities[1].reserve: "0.1": critical has a reserve already (protect.priorities[0]): one reserve per class`}},
		{"reserves sum", "protect: {priorities: [{name: critical, reserve: 0.6}, {name: default, reserve: 0.5}]}",
			[]string{`protect.priorities: "1.1": the reserves add up to 1 or more: some class would never get a slot`}},
		{"match forms", "protect: {priorities: [{name: critical, match: {methods: [get], path_prefix: batch, headers: {Host: a, X-A: ''}}}]}",
			[]string{`protect.priorities[0].match.methods[0]: "get": must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE`,
				`protect.priorities[0].match.path_prefix: "batch": must start with "/"`,
				`protect.priorities[0].match.headers.Host: "Host": Host never reaches the request headers (net/http moves it out), so this key would never be present`,
				`protect.priorities[0].match.headers.X-A: must not be empty: the value the header must have`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal+c.yaml+"\n"), LoadOptions{Getenv: noEnv})
			if c.name == "reserve not a number" {
				if got := errorLines(t, err); !slices.Equal(got, []string{`protect.priorities[0].reserve: "lots": must be a number`}) {
					t.Errorf("got %q, want the type error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := errorLines(t, cfg.Validate(noEnv))
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestEnvOverrideProtect(t *testing.T) {
	cfg := mustParse(t, minimal+"protect: {concurrency: {limit: 9}}\n", env("RATELIMIT_PROTECT_CONCURRENCY_LIMIT", "40", "RATELIMIT_PROTECT_STATUS", "429"))
	if cfg.Protect.Concurrency.Limit != 40 || cfg.Protect.Status != 429 {
		t.Errorf("got limit %d status %d, want 40 and 429 from the environment", cfg.Protect.Concurrency.Limit, cfg.Protect.Status)
	}
	for _, e := range envVars {
		if e.path == "protect.priorities" {
			t.Errorf("got override %s, want none for a list of mappings", e.name)
		}
	}
}

// TestWarningsPriorityOnAnyClientsHeader: a priority that rests on a header warns when no
// trusted_proxies are set (any client may send the header, so it is believed from none), and
// not when they are, nor for a route.
func TestWarningsPriorityOnAnyClientsHeader(t *testing.T) {
	prio := "protect: {priorities: [{name: sheddable, match: {path_prefix: /batch}}, {name: critical, match: {headers: {X-Priority: critical}}}]}\n"
	cfg := mustParse(t, minimal+prio, noEnv)
	want := []string{"protect.priorities[1].match.headers.X-Priority: any client may send this header, so a priority is believed from it only from trusted_proxies, and none is set: this entry matches no request (match on a route, or list the proxy that sets the header in trusted_proxies)"}
	if got := Warnings(cfg); !slices.Equal(got, want) {
		t.Errorf("without trusted_proxies: got %q\nwant %q", got, want)
	}
	cfg = mustParse(t, minimal+"trusted_proxies: [10.0.0.0/8]\n"+prio, noEnv)
	if got := Warnings(cfg); len(got) != 0 {
		t.Errorf("with trusted_proxies: got %q, want no warning", got)
	}
	cfg = mustParse(t, minimal+"protect: {priorities: [{name: critical, match: {path_prefix: /pay}}]}\n", noEnv)
	if got := Warnings(cfg); len(got) != 0 {
		t.Errorf("a route: got %q, want no warning", got)
	}
}

// TestEnvOverrideFloat: a float field (protect.stream_share) takes its override; the viper
// loader refused every value of it ("must be a number"), because the variable's text never
// became a number.
func TestEnvOverrideFloat(t *testing.T) {
	cfg := mustParse(t, minimal+"protect: {}\n", env("RATELIMIT_PROTECT_STREAM_SHARE", "0.25"))
	if cfg.Protect.StreamShare != 0.25 {
		t.Errorf("got stream_share %v, want 0.25 from the environment", cfg.Protect.StreamShare)
	}
	if err := cfg.Validate(noEnv); err != nil {
		t.Errorf("Validate: %v", err)
	}
	// Without a protect block the override creates one, with every other default.
	cfg = mustParse(t, minimal, env("RATELIMIT_PROTECT_STREAM_SHARE", "1"))
	if cfg.Protect == nil || cfg.Protect.StreamShare != 1 || cfg.Protect.Concurrency.Limit != defaultProtectLimit {
		t.Errorf("got %+v, want a protect block with stream_share 1 and the default limit", cfg.Protect)
	}
	_, err := Parse([]byte(minimal), LoadOptions{Getenv: env("RATELIMIT_PROTECT_STREAM_SHARE", "a tenth")})
	if got, want := errorLines(t, err), []string{`RATELIMIT_PROTECT_STREAM_SHARE: "a tenth": must be a number`}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
