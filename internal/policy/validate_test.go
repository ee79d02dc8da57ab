package policy

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

func TestFieldErrorFormat(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{FieldError{Path: "policies[2].rate", Value: "10/x", Msg: "unit must be s, m or h"}, `policies[2].rate: "10/x": unit must be s, m or h`},
		{FieldError{Path: "upstream", Msg: "required"}, `upstream: required`},
		{FieldError{Path: "a", Value: "quote\"d\n", Msg: "m"}, `a: "quote\"d\n": m`},
		{Errors{{Path: "a", Msg: "x"}, {Path: "b", Value: "v", Msg: "y"}}, "a: x\nb: \"v\": y"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}

func TestParseRate(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr string
	}{
		{"50/s", 50, ""},
		{"0.5/s", 0.5, ""},
		{"60/m", 1, ""},
		{"3600/h", 1, ""},
		{"1000000000/s", 1e9, ""},
		{"10/x", 0, "unit must be s, m or h"},
		{"10/S", 0, "unit must be s, m or h"},
		{"10/sec", 0, "unit must be s, m or h"},
		{"10", 0, "must be N/s, N/m or N/h"},
		{"", 0, "must be N/s, N/m or N/h"},
		{"0/s", 0, "count must be positive"},
		{"0.0/m", 0, "count must be positive"},
		{"-1/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"1e3/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"Inf/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"NaN/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"0x10/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"1_000/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{" 5/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"5./s", 0, "count must be a decimal number such as 50 or 0.5"},
		{".5/s", 0, "count must be a decimal number such as 50 or 0.5"},
		{"1000000001/s", 0, "must be at most 1000000000/s"},
		{"1/s/s", 0, "unit must be s, m or h"},
	}
	for _, tt := range tests {
		got, err := ParseRate(tt.in)
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if got != tt.want || gotErr != tt.wantErr {
			t.Errorf("ParseRate(%q): got %v, %q; want %v, %q", tt.in, got, gotErr, tt.want, tt.wantErr)
		}
	}
}

const (
	okPolicy  = "  - {name: p, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n"
	secret32  = "0123456789abcdef0123456789abcdef"
	hashOfABC = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" // of "abc"
)

func TestValidate(t *testing.T) {
	pubKey := filepath.Join("testdata", "keys", "rsa.pub.pem")
	tests := []struct {
		name   string
		yaml   string
		getenv func(string) string
		want   []string
	}{
		{"minimal is valid", minimal, nil, nil},
		{"upstream required", "policies:\n" + okPolicy, nil, []string{"upstream: required"}},
		{"upstream scheme", "upstream: ftp://h\npolicies:\n" + okPolicy, nil, []string{`upstream: "ftp://h": must be an absolute http or https URL`}},
		{"upstream relative", "upstream: /api\npolicies:\n" + okPolicy, nil, []string{`upstream: "/api": must be an absolute http or https URL`}},
		{"upstream no host", "upstream: 'http:///x'\npolicies:\n" + okPolicy, nil, []string{`upstream: "http:///x": must name a host`}},
		{"upstream credentials", "upstream: http://u:p@h\npolicies:\n" + okPolicy, nil, []string{`upstream: "http://u:xxxxx@h": must not carry credentials`}},
		{"upstream token as user", "upstream: https://tok3n@h\npolicies:\n" + okPolicy, nil, []string{`upstream: "https://xxxxx@h": must not carry credentials`}},
		{"upstream https with path", "upstream: https://h:8443/base\npolicies:\n" + okPolicy, nil, nil},
		{"listen without port", minimal + "listen: localhost\n", nil, []string{`listen: "localhost": must be host:port, such as 127.0.0.1:8080 or :8080`}},
		{"listen bad port", minimal + "listen: :70000\n", nil, []string{`listen: ":70000": port must be a number from 0 to 65535`}},
		{"listen named port", minimal + "listen: :http\n", nil, []string{`listen: ":http": port must be a number from 0 to 65535`}},
		{"admin equals listen", minimal + "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:8080\n", nil,
			[]string{`admin_listen: "127.0.0.1:8080": must differ from listen: metrics and health never share the proxy's port`}},
		{"admin on wildcard of listen's port", minimal + "listen: 127.0.0.1:8080\nadmin_listen: :8080\n", nil,
			[]string{`admin_listen: ":8080": must differ from listen: metrics and health never share the proxy's port`}},
		{"port 0 twice is fine", minimal + "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n", nil, nil},
		{"trusted proxies", minimal + "trusted_proxies: [10.0.0.0/8, 192.0.2.1, '2001:db8::/32', 10.0.0/8, 'fe80::1%eth0']\n", nil,
			[]string{`trusted_proxies[3]: "10.0.0/8": must be an IP address or CIDR`, `trusted_proxies[4]: "fe80::1%eth0": must be an IP address or CIDR`}},
		{"api key header", minimal + "identity: {api_key_header: 'X Api'}\n", nil, []string{`identity.api_key_header: "X Api": must be a valid header name`}},
		{"api key header empty", minimal + "identity: {api_key_header: ''}\n", nil, []string{`identity.api_key_header: required`}},
		{"user header", minimal + "identity: {user_header: 'X:User'}\n", nil, []string{`identity.user_header: "X:User": must be a valid header name`}},
		{"api key header Host", minimal + "identity: {api_key_header: host}\n", nil,
			[]string{`identity.api_key_header: "host": Host never reaches the request headers (net/http moves it out), so this key would never be present`}},
		{"user header Transfer-Encoding", minimal + "identity: {user_header: TRANSFER-encoding}\n", nil,
			[]string{`identity.user_header: "TRANSFER-encoding": Transfer-Encoding never reaches the request headers (net/http moves it out), so this key would never be present`}},
		{"ipv6 prefix bounds", minimal + "identity: {ipv6_prefix: 0}\n", nil,
			[]string{`identity.ipv6_prefix: "0": must be from 1 to 128 (128: every IPv6 address is its own ip key)`}},
		{"ipv6 prefix too long", minimal + "identity: {ipv6_prefix: 129}\n", nil,
			[]string{`identity.ipv6_prefix: "129": must be from 1 to 128 (128: every IPv6 address is its own ip key)`}},
		{"ipv6 prefix per address", minimal + "identity: {ipv6_prefix: 128}\n", nil, nil},
		{"ipv6 prefix /1", minimal + "identity: {ipv6_prefix: 1}\n", nil, nil},
		{"jwt and user header", minimal + "identity: {user_header: X-User, jwt: {hs256_secret_env: S}}\n", env("S", secret32),
			[]string{"identity.jwt: cannot be combined with identity.user_header: the user comes from one of them"}},
		{"jwt without keys", minimal + "identity: {jwt: {claim: sub}}\n", nil, []string{"identity.jwt: needs hs256_secret_env or rs256_public_key_file (or both)"}},
		{"jwt secret unset", minimal + "identity: {jwt: {hs256_secret_env: S}}\n", env(),
			[]string{`identity.jwt.hs256_secret_env: "S": environment variable is not set or empty`}},
		{"jwt secret short", minimal + "identity: {jwt: {hs256_secret_env: S}}\n", env("S", "short"),
			[]string{`identity.jwt.hs256_secret_env: "S": secret must be at least 32 bytes (RFC 7518 §3.2)`}},
		{"jwt secret ok", minimal + "identity: {jwt: {hs256_secret_env: S}}\n", env("S", secret32), nil},
		{"jwt rsa ok", minimal + "identity: {jwt: {rs256_public_key_file: " + pubKey + "}}\n", nil, nil},
		{"jwt both ok", minimal + "identity: {jwt: {hs256_secret_env: S, rs256_public_key_file: " + pubKey + "}}\n", env("S", secret32), nil},
		{"jwt rsa not a key", minimal + "identity: {jwt: {rs256_public_key_file: testdata/keys/not-a-key.pem}}\n", nil,
			[]string{`identity.jwt.rs256_public_key_file: "testdata/keys/not-a-key.pem": must hold a PEM RSA public key (PKIX, PKCS #1 or a certificate)`}},
		{"jwt negative leeway", minimal + "identity: {jwt: {hs256_secret_env: S, leeway: -1s}}\n", env("S", secret32),
			[]string{`identity.jwt.leeway: "-1s": must not be negative`}},
		{"grpc upstream timeout negative", minimal + "grpc_upstream_timeout: -1s\n", nil,
			[]string{`grpc_upstream_timeout: "-1s": must not be negative`}},
		{"grpc upstream timeout zero", minimal + "grpc_upstream_timeout: 0s\n", nil, nil},
		{"grpc upstream timeout set", minimal + "grpc_upstream_timeout: 10m\n", nil, nil},
		{"headers reset", minimal + "headers: {reset: rfc3339}\n", nil, []string{`headers.reset: "rfc3339": must be unix or delta`}},
		{"store backend", minimal + "store: {backend: memcached}\n", nil, []string{`store.backend: "memcached": must be memory, dynamodb or redis`}},
		{"store dynamodb needs a table", minimal + "store: {backend: dynamodb}\n", nil,
			[]string{"store.dynamodb.table: required when store.backend is dynamodb"}},
		{"store dynamodb minimal", minimal + "store: {backend: dynamodb, dynamodb: {table: rate-limits}}\n", nil, nil},
		{"store dynamodb full", minimal + "store:\n  backend: dynamodb\n  on_error: local\n  replicas: 3\n  dynamodb:\n" +
			"    table: rate-limits\n    region: ap-northeast-1\n    endpoint: http://127.0.0.1:8000\n    create_table: true\n    mode: transaction\n    deny_cache: false\n", nil, nil},
		{"store dynamodb empty table", minimal + "store: {backend: dynamodb, dynamodb: {table: ''}}\n", nil,
			[]string{"store.dynamodb.table: required when store.backend is dynamodb"}},
		{"store dynamodb bad values", minimal + "store: {backend: dynamodb, dynamodb: {table: 'rate limits', region: ap-northeast-1a., endpoint: 'localhost:8000', mode: batch}}\n", nil,
			[]string{
				`store.dynamodb.table: "rate limits": must be 3 to 255 of A-Z a-z 0-9 _ . -`,
				`store.dynamodb.endpoint: "localhost:8000": must be an http or https URL with a host, such as http://127.0.0.1:8000`,
				`store.dynamodb.region: "ap-northeast-1a.": must be an AWS region name such as ap-northeast-1`,
				`store.dynamodb.mode: "batch": must be refund or transaction`,
			}},
		{"store dynamodb short table", minimal + "store: {backend: dynamodb, dynamodb: {table: rl}}\n", nil,
			[]string{`store.dynamodb.table: "rl": must be 3 to 255 of A-Z a-z 0-9 _ . -`}},
		{"store dynamodb endpoint credentials", minimal + "store: {backend: dynamodb, dynamodb: {table: t-1, endpoint: 'http://AKID:secret@127.0.0.1:8000'}}\n", nil,
			[]string{`store.dynamodb.endpoint: "http://AKID:xxxxx@127.0.0.1:8000": must not carry credentials: they come from the AWS chain`}},
		{"store dynamodb endpoint https path", minimal + "store: {backend: dynamodb, dynamodb: {table: t-1, endpoint: 'https://dynamodb.example.internal/base'}}\n", nil, nil},
		{"store dynamodb block with memory", minimal + "store: {dynamodb: {table: rate-limits}}\n", nil,
			[]string{"store.dynamodb: set, but store.backend is memory: set store.backend: dynamodb, or remove the block"}},
		{"store on_error local", minimal + "store: {on_error: local, replicas: 3}\n", nil, nil},
		{"store on_error local needs replicas", minimal + "store: {on_error: local}\n", nil,
			[]string{"store.replicas: required with store.on_error local: how many replicas share the limits"}},
		{"store replicas range", minimal + "store: {on_error: local, replicas: -1}\n", nil,
			[]string{`store.replicas: "-1": must be from 1 to 10000`}},
		{"store replicas too many", minimal + "store: {replicas: 10001}\n", nil,
			[]string{`store.replicas: "10001": must be from 1 to 10000`}},
		{"store replicas ignored without local", minimal + "store: {on_error: deny, replicas: 3}\n", nil, nil},
		{"store on_error", minimal + "store: {on_error: ignore}\n", nil, []string{`store.on_error: "ignore": must be allow, deny or local`}},
		{"store timeout", minimal + "store: {timeout: -5ms}\n", nil, []string{`store.timeout: "-5ms": must be positive`}},
		{"store max keys", minimal + "store: {max_keys: 0}\n", nil, []string{`store.max_keys: "0": must be positive`}},
		{"server timeouts", minimal + "server: {read_header_timeout: 0s, idle_timeout: -1s, drain_timeout: 0s, max_header_bytes: -1}\n", nil, []string{
			`server.read_header_timeout: "0s": must be positive`, `server.idle_timeout: "-1s": must be positive`,
			`server.drain_timeout: "0s": must be positive`, `server.max_header_bytes: "-1": must be positive`}},
		{"shutdown delay negative", minimal + "server: {shutdown_delay: -1s}\n", nil, []string{`server.shutdown_delay: "-1s": must be between 0s and 10m`}},
		{"shutdown delay too long", minimal + "server: {shutdown_delay: 11m}\n", nil, []string{`server.shutdown_delay: "11m": must be between 0s and 10m`}},
		{"shutdown delay", minimal + "server: {shutdown_delay: 5s}\n", nil, nil},
		{"window zero on a bucket", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, window: 0s}\n", nil,
			[]string{`policies[0].window: "0s": not used by token_bucket: set rate and burst`}},
		{"window missing", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 1}\n", nil,
			[]string{"policies[0].window: required for fixed_window: a duration such as 1m"}},
		{"window zero in an override", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: sliding_window, limit: 1, window: 1m, overrides: [{key: 10.0.0.0/8, limit: 2, window: -2s}]}\n", nil,
			[]string{`policies[0].overrides[0].window: "-2s": must be positive`}},
		{"max concurrent streams", minimal + "server: {max_concurrent_streams: 0}\n", nil,
			[]string{`server.max_concurrent_streams: "0": must be from 1 to 10000`}},
		{"max concurrent streams ok", minimal + "server: {max_concurrent_streams: 1000}\n", nil, nil},
		{"upstream protocol", minimal + "upstream_protocol: http2\n", nil,
			[]string{`upstream_protocol: "http2": must be http1, h2c or auto`}},
		{"upstream protocol h2c", minimal + "upstream_protocol: h2c\n", nil, nil},
		{"upstream protocol auto", minimal + "upstream_protocol: auto\n", nil, nil},
		{"quota ok", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 1000, period: month, time_zone: Europe/Berlin, offset: 14, cost: 5}\n", nil, nil},
		{"quota week from Monday", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 10, period: week, offset: 1}\n", nil, nil},
		{"quota needs limit and period", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota}\n", nil, []string{
			"policies[0].limit: required for quota: at least 1", "policies[0].period: required for quota: day, week or month"}},
		{"quota bad fields", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 10, period: year, time_zone: Mars/Olympus, window: 24h, rate: 1/s}\n", nil, []string{
			`policies[0].rate: "1/s": not used by quota: set limit and period`,
			`policies[0].window: "24h": not used by quota: set limit and period (day, week or month)`,
			`policies[0].period: "year": must be day, week or month`,
			`policies[0].time_zone: "Mars/Olympus": unknown time zone: use an IANA name such as Europe/Berlin or America/New_York, or UTC`}},
		{"quota Local zone", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 10, period: day, time_zone: Local}\n", nil, []string{
			`policies[0].time_zone: "Local": is this machine's zone, which may differ between replicas: name the zone, such as Europe/Berlin, or UTC`}},
		{"quota offsets", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 1, period: day, offset: 1}\n" +
			"  - {name: b, key: ip, algorithm: quota, limit: 1, period: week, offset: 7}\n" +
			"  - {name: c, key: ip, algorithm: quota, limit: 1, period: month, offset: 28}\n" +
			"  - {name: d, key: ip, algorithm: quota, limit: 1, period: month, offset: -1}\n", nil, []string{
			`policies[0].offset: "1": must be 0 for a daily quota: a day starts at midnight in time_zone`,
			`policies[1].offset: "7": must be from 0 (weeks start on Sunday) to 6 (Saturday) for a weekly quota`,
			`policies[2].offset: "28": must be from 0 (months start on the 1st) to 27 (on the 28th, which every month has) for a monthly quota`,
			`policies[3].offset: "-1": must be from 0 (months start on the 1st) to 27 (on the 28th, which every month has) for a monthly quota`}},
		{"period on a fixed window", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 1, window: 24h, period: day, time_zone: UTC, offset: 2}\n", nil, []string{
			`policies[0].period: "day": not used by fixed_window: calendar periods are algorithm: quota`,
			`policies[0].time_zone: "UTC": not used by fixed_window: calendar periods are algorithm: quota`,
			`policies[0].offset: "2": not used by fixed_window: calendar periods are algorithm: quota`}},
		{"cost ok on every algorithm", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 5, cost: 5}\n" +
			"  - {name: b, key: ip, algorithm: leaky_bucket, rate: 1/s, burst: 4, cost: 5}\n" +
			"  - {name: c, key: ip, algorithm: fixed_window, limit: 5, window: 1m, cost: 5}\n" +
			"  - {name: d, key: ip, algorithm: sliding_window, limit: 5, window: 1m, cost: 5}\n", nil, nil},
		{"cost zero and negative", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 5, cost: 0}\n" +
			"  - {name: b, key: ip, algorithm: token_bucket, rate: 1/s, burst: 5, cost: -2}\n", nil, []string{
			`policies[0].cost: "0": must be at least 1`, `policies[1].cost: "-2": must be at least 1`}},
		{"cost above what the limit holds", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 4, cost: 5}\n" +
			"  - {name: b, key: ip, algorithm: leaky_bucket, rate: 1/s, burst: 3, cost: 5}\n" +
			"  - {name: c, key: ip, algorithm: quota, limit: 4, period: day, cost: 5}\n", nil, []string{
			`policies[0].cost: "5": a request costing 5 never fits in what the limit holds (4): raise the limit or lower cost`,
			`policies[1].cost: "5": a request costing 5 never fits in what the limit holds (4): raise the limit or lower cost`,
			`policies[2].cost: "5": a request costing 5 never fits in what the limit holds (4): raise the limit or lower cost`}},
		{"override below the cost", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: sliding_window, limit: 10, window: 1m, cost: 5, overrides: [{key: 10.0.0.0/8, limit: 3}]}\n", nil, []string{
			`policies[0].overrides[0].limit: "3": a request costing 5 never fits in what the limit holds (3): raise the limit or lower cost`}},
		{"quota and cost on dynamodb", "upstream: http://h\nstore: {backend: dynamodb, dynamodb: {table: rl-1}}\npolicies:\n" +
			"  - {name: a, key: ip, algorithm: quota, limit: 5, period: day}\n  - {name: b, key: ip, algorithm: fixed_window, limit: 5, window: 1m, cost: 2}\n", nil, nil},
		{"costs ok", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 100, period: month, costs: [{methods: [POST], path_prefix: /search, cost: 5}, {path_prefix: /export, cost: 20}]}\n", nil, nil},
		{"costs bad", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 10, window: 1m, costs: [{cost: 2}, {methods: [post], path_prefix: search, cost: 0}, {path_prefix: /x, cost: 11}], " +
			"overrides: [{key: 10.0.0.0/8, limit: 5}]}\n  - {name: b, key: ip, algorithm: concurrency, limit: 1, costs: [{path_prefix: /x, cost: 2}]}\n", nil, []string{
			`policies[0].costs[2].cost: "11": a request costing 11 never fits in what the limit holds (10): raise the limit or lower cost`,
			"policies[0].costs[0]: needs methods or path_prefix: an entry for every request is the policy's cost",
			`policies[0].costs[1].methods[0]: "post": must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE`,
			`policies[0].costs[1].path_prefix: "search": must start with "/"`,
			"policies[0].costs[1].cost: required: at least 1",
			`policies[0].overrides[0].limit: "5": a request costing 11 never fits in what the limit holds (5): raise the limit or lower cost`,
			"policies[1].costs: not used by concurrency: every request holds one slot"}},
		{"cost on concurrency", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: concurrency, limit: 5, cost: 2}\n", nil,
			[]string{`policies[0].cost: "2": not used by concurrency: every request holds one slot`}},
		{"quota with charge_on", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: quota, limit: 5, period: day, charge_on: [401], cost: 2}\n", nil, nil},
		{"log level", minimal + "log: {level: trace}\n", nil, []string{`log.level: "trace": must be debug, info, warn or error`}},
		{"no policies", "upstream: http://h\n", nil, []string{"policies: at least one policy is required"}},
		{"name required", "upstream: http://h\npolicies:\n  - {key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil, []string{"policies[0].name: required"}},
		{"name chars", "upstream: http://h\npolicies:\n  - {name: per/ip, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{`policies[0].name: "per/ip": must be 1 to 64 of A-Z a-z 0-9 _ . -`}},
		{"name too long", "upstream: http://h\npolicies:\n  - {name: " + strings.Repeat("a", 65) + ", key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{`policies[0].name: "` + strings.Repeat("a", 65) + `": must be 1 to 64 of A-Z a-z 0-9 _ . -`}},
		{"name duplicate", "upstream: http://h\npolicies:\n" + okPolicy + "  - {name: q, key: global, algorithm: token_bucket, rate: 1/s, burst: 1}\n" + okPolicy, nil,
			[]string{`policies[2].name: "p": duplicate of policies[0]`}},
		{"key required", "upstream: http://h\npolicies:\n  - {name: a, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{"policies[0].key: required: ip, api_key, user, global or header:NAME"}},
		{"key unknown", "upstream: http://h\npolicies:\n  - {name: a, key: IP, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{`policies[0].key: "IP": must be ip, api_key, user, global or header:NAME`}},
		{"key header empty", "upstream: http://h\npolicies:\n  - {name: a, key: 'header:', algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{`policies[0].key: "header:": header:NAME needs a valid header name`}},
		{"key header ok", "upstream: http://h\npolicies:\n  - {name: a, key: 'header:X-Tenant-Id', algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil, nil},
		{"key header Host", "upstream: http://h\npolicies:\n  - {name: a, key: 'header:Host', algorithm: token_bucket, rate: 1/s, burst: 1}\n" +
			"  - {name: b, key: 'header:transfer-encoding', algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{
				`policies[0].key: "header:Host": Host never reaches the request headers (net/http moves it out), so this key would never be present`,
				`policies[1].key: "header:transfer-encoding": Transfer-Encoding never reaches the request headers (net/http moves it out), so this key would never be present`,
			}},
		{"key user without identity", "upstream: http://h\npolicies:\n  - {name: a, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil,
			[]string{`policies[0].key: "user": needs identity.user_header or identity.jwt`}},
		{"key user with header", "upstream: http://h\nidentity: {user_header: X-User}\npolicies:\n  - {name: a, key: user, algorithm: token_bucket, rate: 1/s, burst: 1}\n", nil, nil},
		{"algorithm required", "upstream: http://h\npolicies:\n  - {name: a, key: ip}\n", nil,
			[]string{"policies[0].algorithm: required: token_bucket, leaky_bucket, fixed_window, sliding_window, concurrency or quota"}},
		{"algorithm unknown", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: gcra}\n", nil,
			[]string{`policies[0].algorithm: "gcra": must be token_bucket, leaky_bucket, fixed_window, sliding_window, concurrency or quota`}},
		{"bucket needs rate and burst", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: leaky_bucket}\n", nil,
			[]string{"policies[0].rate: required for leaky_bucket: N/s, N/m or N/h", "policies[0].burst: required for leaky_bucket: at least 1"}},
		{"bucket rate unit", "upstream: http://h\npolicies:\n" + okPolicy + "  - {name: b, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1}\n  - {name: c, key: ip, algorithm: token_bucket, rate: 10/x, burst: 1}\n", nil,
			[]string{`policies[2].rate: "10/x": unit must be s, m or h`}},
		{"bucket burst negative", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: -3}\n", nil,
			[]string{`policies[0].burst: "-3": must be at least 1`}},
		{"bucket burst too large", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1000/s, burst: 1000000001}\n", nil,
			[]string{`policies[0].burst: "1000000001": must be at most 1000000000`}},
		{"bucket refill too long", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/h, burst: 9000}\n", nil,
			[]string{`policies[0].burst: "9000": burst/rate (the time to refill) must be at most 366 days`}},
		{"slot_lease bounds", "upstream: http://h\nstore: {backend: dynamodb, dynamodb: {table: t-1, slot_lease: 1s}}\npolicies:\n  - {name: a, key: api_key, algorithm: concurrency, limit: 10}\n", nil,
			[]string{`store.dynamodb.slot_lease: "1s": must be from 3s to 10m`}},
		{"clock bounds", "upstream: http://h\nstore: {backend: dynamodb, dynamodb: {table: t-1, clock: {max_correction: 0s, warn_offset: 2h, max_offset: 500us}}}\npolicies:\n  - {name: a, key: ip, algorithm: concurrency, limit: 10}\n", nil,
			[]string{`store.dynamodb.clock.max_correction: "0s": must be from 1ms to 1h`,
				`store.dynamodb.clock.warn_offset: "2h": must be from 1ms to 1h`,
				`store.dynamodb.clock.max_offset: "500µs": must be 0s (off) or from 1ms to 1h`}},
		{"clock ok", "upstream: http://h\nstore: {backend: dynamodb, dynamodb: {table: t-1, clock: {correct: false, max_offset: 250ms}}}\npolicies:\n  - {name: a, key: ip, algorithm: concurrency, limit: 10}\n", nil, nil},
		{"concurrency on dynamodb fits an item", "upstream: http://h\nstore: {backend: dynamodb, dynamodb: {table: t-1}}\npolicies:\n  - {name: a, key: api_key, algorithm: concurrency, limit: 10001, overrides: [{key: 'sha256:0000000000000000000000000000000000000000000000000000000000000000', limit: 20000}]}\n  - {name: b, key: ip, algorithm: concurrency, limit: 10000}\n", nil,
			[]string{`policies[0].limit: "10001": with store.backend dynamodb a concurrency limit must be at most 10000 (one lease attribute per slot in one item)`,
				`policies[0].overrides[0].limit: "20000": with store.backend dynamodb a concurrency limit must be at most 10000 (one lease attribute per slot in one item)`}},
		{"concurrency ok", "upstream: http://h\npolicies:\n  - {name: a, key: api_key, algorithm: concurrency, limit: 10}\n", nil, nil},
		{"concurrency needs limit", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: concurrency}\n", nil,
			[]string{"policies[0].limit: required for concurrency: at least 1"}},
		{"concurrency with other fields", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: concurrency, limit: 2, window: 0s, rate: 1/s, burst: 3}\n", nil,
			[]string{`policies[0].rate: "1/s": not used by concurrency: set limit (requests in flight at once)`,
				`policies[0].burst: "3": not used by concurrency: set limit (requests in flight at once)`,
				`policies[0].window: "0s": not used by concurrency: a slot is held while its request is in flight`}},
		{"concurrency override", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: concurrency, limit: 2, overrides: [{key: 10.0.0.0/8, limit: 50}, {key: 10.1.0.0/16, window: 1m}]}\n", nil,
			[]string{`policies[0].overrides[1].window: "1m": not used by concurrency: a slot is held while its request is in flight`}},
		{"charge_on ok", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 5, window: 15m, charge_on: [401, 403, 5xx, 4XX]}\n" +
			"  - {name: b, key: ip, algorithm: token_bucket, rate: 1/m, burst: 5, charge_on: [429]}\n" +
			"  - {name: c, key: ip, algorithm: sliding_window, limit: 5, window: 15m, charge_on: ['401']}\n", nil, nil},
		{"charge_on bad entries", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 5, window: 15m, charge_on: [401, 6xx, 99, 1000, x, 40x, '']}\n", nil,
			[]string{`policies[0].charge_on[1]: "6xx": must be a status code from 100 to 599 or a class such as 5xx`,
				`policies[0].charge_on[2]: "99": must be a status code from 100 to 599 or a class such as 5xx`,
				`policies[0].charge_on[3]: "1000": must be a status code from 100 to 599 or a class such as 5xx`,
				`policies[0].charge_on[4]: "x": must be a status code from 100 to 599 or a class such as 5xx`,
				`policies[0].charge_on[5]: "40x": must be a status code from 100 to 599 or a class such as 5xx`,
				`policies[0].charge_on[6]: must be a status code from 100 to 599 or a class such as 5xx`}},
		{"charge_on empty", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 5, window: 15m, charge_on: []}\n", nil,
			[]string{`policies[0].charge_on: must list at least one status (such as 401) or class (such as 5xx); remove it to charge every request`}},
		{"charge_on unsupported", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: leaky_bucket, rate: 1/s, burst: 1, charge_on: [401]}\n" +
			"  - {name: b, key: ip, algorithm: concurrency, limit: 1, charge_on: [5xx]}\n", nil,
			[]string{`policies[0].charge_on: not supported by leaky_bucket: a leaky bucket has already held the request for its turn; use token_bucket, fixed_window, sliding_window or quota`,
				`policies[1].charge_on: not supported by concurrency: a concurrency slot is given back when the request ends, whatever its answer; use token_bucket, fixed_window, sliding_window or quota`}},
		{"bucket with window fields", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, limit: 5, window: 90s}\n", nil,
			[]string{`policies[0].limit: "5": not used by token_bucket: set rate and burst`, `policies[0].window: "1m30s": not used by token_bucket: set rate and burst`}},
		{"window needs limit and window", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window}\n", nil,
			[]string{"policies[0].limit: required for fixed_window: at least 1", "policies[0].window: required for fixed_window: a duration such as 1m"}},
		{"window bounds", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: sliding_window, limit: 1, window: 999us}\n  - {name: b, key: ip, algorithm: sliding_window, limit: 1, window: 169h}\n", nil,
			[]string{`policies[0].window: "999µs": must be at least 1ms`, `policies[1].window: "169h": must be at most 168h`}},
		{"window limit bounds", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: -1, window: 1m}\n  - {name: b, key: ip, algorithm: fixed_window, limit: 1000000001, window: 1m}\n", nil,
			[]string{`policies[0].limit: "-1": must be at least 1`, `policies[1].limit: "1000000001": must be at most 1000000000`}},
		{"window with bucket fields", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: fixed_window, limit: 1, window: 1m, rate: 1/s, burst: 2}\n", nil,
			[]string{`policies[0].rate: "1/s": not used by fixed_window: set limit and window`, `policies[0].burst: "2": not used by fixed_window: set limit and window`}},
		{"mode", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, mode: observe}\n", nil,
			[]string{`policies[0].mode: "observe": must be enforce or shadow`}},
		{"match", "upstream: http://h\npolicies:\n  - {name: a, key: ip, algorithm: token_bucket, rate: 1/s, burst: 1, match: {methods: [GET, get, PSOT], path_prefix: api}}\n", nil,
			[]string{
				`policies[0].match.methods[1]: "get": must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE`,
				`policies[0].match.methods[2]: "PSOT": must be an upper-case HTTP method: GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS or TRACE`,
				`policies[0].match.path_prefix: "api": must start with "/"`,
			}},
		{"overrides valid", "upstream: http://h\npolicies:\n  - name: a\n    key: ip\n    algorithm: token_bucket\n    rate: 1/s\n    burst: 1\n    overrides:\n" +
			"      - {key: 10.0.0.0/8, burst: 5}\n      - {key: 10.1.0.0/16, rate: 5/s}\n      - {key: 192.0.2.7, unlimited: true}\n      - {key: '" + hashOfABC + "', rate: 2/s, burst: 2}\n", nil, nil},
		{"override key forms", "upstream: http://h\npolicies:\n  - name: a\n    key: api_key\n    algorithm: fixed_window\n    limit: 1\n    window: 1m\n    overrides:\n" +
			"      - {key: 'sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD', limit: 2}\n" +
			"      - {key: 'sha256:abc', limit: 2}\n      - {key: abc, limit: 2}\n      - {key: 10.0.0.0/8, limit: 2}\n      - {limit: 2}\n", nil,
			[]string{
				`policies[0].overrides[0].key: "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD": must be "sha256:" and 64 lower-case hex digits`,
				`policies[0].overrides[1].key: "sha256:abc": must be "sha256:" and 64 lower-case hex digits`,
				`policies[0].overrides[2].key: must be "sha256:" and 64 lower-case hex digits (the value is not shown: it may be a raw key; hash it with printf %s KEY | sha256sum)`,
				`policies[0].overrides[3].key: "10.0.0.0/8": addresses and CIDRs are keys of ip policies only; use "sha256:" and the hex SHA-256 of the value`,
				`policies[0].overrides[4].key: required: "sha256:" and the hex SHA-256 of the key value`,
			}},
		{"override bad ip key", "upstream: http://h\npolicies:\n  - name: a\n    key: ip\n    algorithm: token_bucket\n    rate: 1/s\n    burst: 1\n    overrides:\n      - {key: 10.0.0.0/33, unlimited: true}\n", nil,
			[]string{`policies[0].overrides[0].key: "10.0.0.0/33": must be "sha256:" and 64 lower-case hex digits, or an IP address or CIDR`}},
		{"override limits", "upstream: http://h\npolicies:\n  - name: a\n    key: ip\n    algorithm: sliding_window\n    limit: 1\n    window: 1m\n    overrides:\n" +
			"      - {key: 10.0.0.1, unlimited: true, limit: 5}\n      - {key: 10.0.0.2}\n      - {key: 10.0.0.3, rate: 1/s, burst: 3}\n      - {key: 10.0.0.4, window: 1us}\n      - {key: 10.0.0.5, unlimited: false, limit: 7}\n", nil,
			[]string{
				"policies[0].overrides[0].unlimited: cannot be combined with rate, burst, limit or window",
				"policies[0].overrides[1]: sets neither unlimited: true nor a limit",
				`policies[0].overrides[2].rate: "1/s": not used by sliding_window: set limit and window`,
				`policies[0].overrides[2].burst: "3": not used by sliding_window: set limit and window`,
				`policies[0].overrides[3].window: "1µs": must be at least 1ms`,
			}},
		{"override bucket values", "upstream: http://h\npolicies:\n  - name: a\n    key: ip\n    algorithm: token_bucket\n    rate: 1/h\n    burst: 1\n    overrides:\n" +
			"      - {key: 10.0.0.1, rate: 1/d}\n      - {key: 10.0.0.2, burst: 100000}\n      - {key: 10.0.0.3, limit: 4}\n", nil,
			[]string{
				`policies[0].overrides[0].rate: "1/d": unit must be s, m or h`,
				`policies[0].overrides[1].burst: "100000": burst/rate (the time to refill) must be at most 366 days`,
				`policies[0].overrides[2].limit: "4": not used by token_bucket: set rate and burst`,
			}},
		{"override duplicates", "upstream: http://h\npolicies:\n  - name: a\n    key: ip\n    algorithm: token_bucket\n    rate: 1/s\n    burst: 1\n    overrides:\n" +
			"      - {key: 10.0.0.0/8, burst: 2}\n      - {key: 10.9.9.9/8, burst: 3}\n      - {key: 192.0.2.1, burst: 2}\n      - {key: 192.0.2.1/32, burst: 3}\n      - {key: '::ffff:192.0.2.1', burst: 3}\n" +
			"      - {key: '" + hashOfABC + "', burst: 2}\n      - {key: '" + hashOfABC + "', burst: 3}\n", nil,
			[]string{
				`policies[0].overrides[1].key: "10.9.9.9/8": duplicate of overrides[0]`,
				`policies[0].overrides[3].key: "192.0.2.1/32": duplicate of overrides[2]`,
				`policies[0].overrides[4].key: "::ffff:192.0.2.1": duplicate of overrides[2]`,
				`policies[0].overrides[6].key: "` + hashOfABC + `": duplicate of overrides[5]`,
			}},
		{"override on global", "upstream: http://h\npolicies:\n  - {name: a, key: global, algorithm: token_bucket, rate: 1/s, burst: 1, overrides: [{key: '" + hashOfABC + "', unlimited: true}]}\n", nil,
			[]string{"policies[0].overrides: a global policy has a single key: change its limit instead"}},
		{"all problems at once", "listen: x\nstore: {on_error: maybe}\npolicies:\n  - {name: '', key: cookie, algorithm: token_bucket, rate: 10/x}\n", nil,
			[]string{
				"upstream: required",
				`listen: "x": must be host:port, such as 127.0.0.1:8080 or :8080`,
				`store.on_error: "maybe": must be allow, deny or local`,
				"policies[0].name: required",
				`policies[0].key: "cookie": must be ip, api_key, user, global or header:NAME`,
				`policies[0].rate: "10/x": unit must be s, m or h`,
				"policies[0].burst: required for token_bucket: at least 1",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, tt.yaml, noEnv)
			getenv := tt.getenv
			if getenv == nil {
				getenv = noEnv
			}
			err := cfg.Validate(getenv)
			got := errorLines(t, err)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			// Compile agrees with Validate.
			_, cerr := Compile(cfg, CompileOptions{Getenv: getenv})
			if (cerr == nil) != (err == nil) {
				t.Errorf("Compile error %v, Validate error %v: want both nil or both set", cerr, err)
			}
		})
	}
}

func TestValidateNeverShowsTheSecret(t *testing.T) {
	cfg := mustParse(t, minimal+"identity: {jwt: {hs256_secret_env: S}}\n", noEnv)
	err := cfg.Validate(env("S", "hunter2"))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("got %v, want an error that does not contain the secret", err)
	}
}

// TestValidateNeverEchoesCredentials covers every message that quotes a value which may hold a
// credential: URLs with user info (parsed or not), a raw key written where its hash belongs, and
// a secret written where its variable's name belongs. Each must still name the field.
func TestValidateNeverEchoesCredentials(t *testing.T) {
	const pw = "hunter2"
	tests := []struct {
		name, yaml, field string
	}{
		{"upstream password", "upstream: http://svc:" + pw + "@h\npolicies:\n" + okPolicy, "upstream"},
		{"upstream token as user", "upstream: https://" + pw + "@h\npolicies:\n" + okPolicy, "upstream"},
		{"upstream bad scheme with password", "upstream: ftp://u:" + pw + "@h\npolicies:\n" + okPolicy, "upstream"},
		{"upstream without scheme (opaque)", "upstream: 'svc:" + pw + "@h'\npolicies:\n" + okPolicy, "upstream"},
		{"upstream unparseable with password", "upstream: 'http://u:" + pw + "@h/%zz'\npolicies:\n" + okPolicy, "upstream"},
		{"upstream password without host", "upstream: 'http://u:" + pw + "@'\npolicies:\n" + okPolicy, "upstream"},
		{"dynamodb endpoint password", minimal + "store: {backend: dynamodb, dynamodb: {table: t-1, endpoint: 'http://AKID:" + pw + "@127.0.0.1:8000'}}\n", "store.dynamodb.endpoint"},
		{"dynamodb endpoint unparseable", minimal + "store: {backend: dynamodb, dynamodb: {table: t-1, endpoint: 'http://AKID:" + pw + "@127.0.0.1:8000/%zz'}}\n", "store.dynamodb.endpoint"},
		{"dynamodb endpoint opaque", minimal + "store: {backend: dynamodb, dynamodb: {table: t-1, endpoint: 'AKID:" + pw + "@127.0.0.1'}}\n", "store.dynamodb.endpoint"},
		{"raw api key as override", "upstream: http://h\npolicies:\n  - {name: a, key: api_key, algorithm: token_bucket, rate: 1/s, burst: 1, overrides: [{key: " + pw + ", unlimited: true}]}\n", "policies[0].overrides[0].key"},
		{"secret as the variable's name", minimal + "identity: {jwt: {hs256_secret_env: '" + pw + "+/='}}\n", "identity.jwt.hs256_secret_env"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := mustParse(t, tt.yaml, noEnv).Validate(noEnv)
			if err == nil {
				t.Fatal("got no error, want one")
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error %q repeats %q", err, pw)
			}
			if !strings.HasPrefix(err.Error(), tt.field+":") {
				t.Errorf("error %q does not start with the field %s", err, tt.field)
			}
		})
	}
}

func TestValidateNilGetenvReadsProcessEnv(t *testing.T) {
	t.Setenv("RATELIMIT_POLICY_TEST_SECRET", secret32)
	cfg := mustParse(t, minimal+"identity: {jwt: {hs256_secret_env: RATELIMIT_POLICY_TEST_SECRET}}\n", noEnv)
	if err := cfg.Validate(nil); err != nil {
		t.Errorf("got %v, want nil with the variable set in the process environment", err)
	}
}

// badConfigs maps each file of testdata/bad to a substring (field path and value) of the error
// that Load or Validate must report.
var badConfigs = map[string]string{
	"admin_same_as_listen":         `admin_listen: "127.0.0.1:8080": must differ from listen`,
	"algorithm_bad":                `policies[0].algorithm: "gcra": must be token_bucket`,
	"backend_bad":                  `store.backend: "memcached": must be memory, dynamodb or redis`,
	"charge_on_bad":                `policies[0].charge_on[1]: "600": must be a status code from 100 to 599 or a class such as 5xx`,
	"concurrency_with_window":      `policies[0].window: "1m": not used by concurrency`,
	"bucket_with_window":           `policies[0].window: "1m": not used by token_bucket`,
	"burst_fraction":               `policies[0].burst: "1.5": must be an integer`,
	"burst_missing":                `policies[0].burst: required for token_bucket`,
	"burst_not_integer":            `policies[1].burst: "lots": must be an integer`,
	"ietf_not_bool":                `headers.ietf_draft: "yes please": must be true or false`,
	"jwt_and_user_header":          `identity.jwt: cannot be combined with identity.user_header`,
	"jwt_key_missing_file":         `identity.jwt.rs256_public_key_file: "testdata/keys/nope.pem": cannot read`,
	"jwt_key_not_rsa":              `identity.jwt.rs256_public_key_file: "testdata/keys/not-a-key.pem": must hold a PEM RSA public key`,
	"jwt_secret_unset":             `identity.jwt.hs256_secret_env: "RATELIMIT_TEST_UNSET_SECRET": environment variable is not set`,
	"key_bad":                      `policies[0].key: "cookie": must be ip, api_key, user, global or header:NAME`,
	"key_header_bad_name":          `policies[0].key: "header:X Tenant": header:NAME needs a valid header name`,
	"key_header_host":              `policies[0].key: "header:Host": Host never reaches the request headers`,
	"ipv6_prefix_bad":              `identity.ipv6_prefix: "0": must be from 1 to 128`,
	"upstream_credentials":         `upstream: "http://svc:xxxxx@127.0.0.1:3000": must not carry credentials`,
	"key_user_without_identity":    `policies[0].key: "user": needs identity.user_header or identity.jwt`,
	"limit_too_large":              `policies[0].limit: "2000000000": must be at most 1000000000`,
	"listen_no_port":               `listen: "127.0.0.1": must be host:port`,
	"log_level_bad":                `log.level: "verbose": must be debug, info, warn or error`,
	"log_pseudonym_secret_unset":   `log.pseudonym_secret_env: "RATELIMIT_TEST_UNSET_SECRET": environment variable is not set`,
	"method_lowercase":             `policies[0].match.methods[1]: "post": must be an upper-case HTTP method`,
	"mode_bad":                     `policies[0].mode: "dry-run": must be enforce or shadow`,
	"name_bad_chars":               `policies[0].name: "per ip": must be 1 to 64 of`,
	"name_duplicate":               `policies[1].name: "a": duplicate of policies[0]`,
	"no_policies":                  `policies: at least one policy is required`,
	"dynamodb_endpoint_bad":        `store.dynamodb.endpoint: "dynamodb.local:8000": must be an http or https URL with a host`,
	"dynamodb_mode_bad":            `store.dynamodb.mode: "atomic": must be refund or transaction`,
	"dynamodb_table_missing":       `store.dynamodb.table: required when store.backend is dynamodb`,
	"dynamodb_with_memory":         `store.dynamodb: set, but store.backend is memory`,
	"dynamodb_unknown_field":       `store.dynamodb.tabel: unknown field`,
	"local_without_replicas":       `store.replicas: required with store.on_error local`,
	"on_error_bad":                 `store.on_error: "retry": must be allow, deny or local`,
	"override_bad_hash":            `policies[0].overrides[0].key: "sha256:ABC": must be "sha256:" and 64 lower-case hex digits`,
	"override_cidr_on_api_key":     `policies[0].overrides[0].key: "10.0.0.0/8": addresses and CIDRs are keys of ip policies only`,
	"override_duplicate":           `policies[0].overrides[1].key: "10.1.2.3/8": duplicate of overrides[0]`,
	"override_empty":               `policies[0].overrides[0]: sets neither unlimited: true nor a limit`,
	"override_on_global":           `policies[0].overrides: a global policy has a single key`,
	"override_other_family":        `policies[0].overrides[0].rate: "10/s": not used by fixed_window`,
	"override_unlimited_and_limit": `policies[0].overrides[0].unlimited: cannot be combined with rate, burst, limit or window`,
	"path_prefix_relative":         `policies[0].match.path_prefix: "api/": must start with "/"`,
	"policies_not_list":            `policies: must be a list`,
	"rate_bad_unit":                `policies[2].rate: "10/x": unit must be s, m or h`,
	"rate_zero":                    `policies[0].rate: "0/s": count must be positive`,
	"refill_too_long":              `policies[0].burst: "100000": burst/rate (the time to refill) must be at most 366 days`,
	"reset_bad":                    `headers.reset: "iso8601": must be unix or delta`,
	"store_not_mapping":            `store: "memory": must be a mapping`,
	"timeout_bad_duration":         `store.timeout: "fast": must be a duration`,
	"timeout_zero":                 `store.timeout: "0s": must be positive`,
	"trusted_proxy_bad":            `trusted_proxies[1]: "10.0.0/8": must be an IP address or CIDR`,
	"unknown_in_jwt":               `identity.jwt.audiance: unknown field`,
	"unknown_in_match":             `policies[0].match.method: unknown field`,
	"unknown_in_override":          `policies[0].overrides[0].unlimted: unknown field`,
	"unknown_in_policy":            `policies[0].ratee: unknown field`,
	"unknown_nested":               `store.timeot: unknown field`,
	"unknown_top_level":            `listn: unknown field`,
	"upstream_missing":             `upstream: required`,
	"upstream_scheme":              `upstream: "ftp://127.0.0.1": must be an absolute http or https URL`,
	"window_not_duration":          `policies[0].window: "1 minute": must be a duration`,
	"window_too_small":             `policies[0].window: "100µs": must be at least 1ms`,
	"window_zero":                  `policies[0].window: "0s": must be positive`,
	"window_negative":              `policies[0].window: "-1m": must be positive`,
	"override_window_zero":         `policies[0].overrides[0].window: "0s": must be positive`,
	"window_with_rate":             `policies[0].rate: "5/m": not used by sliding_window`,
	"yaml_duplicate_key":           `yaml_duplicate_key.yaml: upstream: written twice (first on line 2)`,
	"yaml_syntax":                  `yaml_syntax.yaml: invalid YAML: yaml: line 3:`,
}

func TestBadConfigs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "bad", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 30 {
		t.Errorf("got %d bad configs, want at least 30", len(files))
	}
	seen := map[string]bool{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			want, ok := badConfigs[name]
			if !ok {
				t.Fatalf("no expected message for %s", f)
			}
			cfg, err := Load(f, LoadOptions{Getenv: noEnv})
			if err == nil {
				err = cfg.Validate(noEnv)
			}
			if err == nil {
				t.Fatalf("got no error, want %q", want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("got\n%v\nwant it to contain\n%s", err, want)
			}
		})
	}
	for name := range badConfigs {
		if !seen[name] {
			t.Errorf("table entry %s has no file testdata/bad/%s.yaml", name, name)
		}
	}
}

func TestValidateReadsKeyFile(t *testing.T) {
	// A key file that disappears between Validate and Compile is reported by Compile too.
	dir := t.TempDir()
	path := filepath.Join(dir, "k.pem")
	data, err := os.ReadFile(filepath.Join("testdata", "keys", "rsa.pub.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, minimal+"identity: {jwt: {rs256_public_key_file: "+path+"}}\n", noEnv)
	if err := cfg.Validate(noEnv); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err = Compile(cfg, CompileOptions{Getenv: noEnv})
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 || es[0].Path != "identity.jwt.rs256_public_key_file" {
		t.Errorf("got %v, want one identity.jwt.rs256_public_key_file error", err)
	}
}

// TestOnErrorValuesAreBuckets: store.on_error accepts exactly what bucket.ParseOnError does,
// which applies the rule ("" is its default, allow).
func TestOnErrorValuesAreBuckets(t *testing.T) {
	for _, v := range []string{`""`, "allow", "deny", "local", "Deny", "fail"} {
		cfg := mustParse(t, minimal+"store: {on_error: "+v+", replicas: 2}\n", noEnv)
		_, perr := bucket.ParseOnError(cfg.Store.OnError)
		if verr := cfg.Validate(noEnv); (verr == nil) != (perr == nil) {
			t.Errorf("on_error %s: Validate %v, bucket.ParseOnError %v", v, verr, perr)
		}
	}
}
