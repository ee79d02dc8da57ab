package e2e

// /metrics after real traffic: lint-clean by client_golang's own linter (the code behind
// `promtool check metrics`), and the source of the metric names the Grafana dashboard may use.

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metricsPolicies gives traffic every outcome: admitted, limited, shadow-limited, held by a leaky
// bucket, unmatched (the /free/ path) and upstream errors (the /reset path).
const metricsPolicies = `identity:
  user_header: X-User-Id
policies:
  - name: per-ip
    key: ip
    algorithm: token_bucket
    rate: 1/h
    burst: 4
    match: {path_prefix: /api/}
  - name: per-user-shadow
    key: user
    algorithm: fixed_window
    limit: 1
    window: 1h
    mode: shadow
    match: {path_prefix: /api/}
  - name: leaky
    key: ip
    algorithm: leaky_bucket
    rate: 50/s
    burst: 5
    match: {path_prefix: /leaky/}
`

// metricsAfterTraffic starts a gateway with the given store block, sends it traffic of every
// kind, and returns its /metrics body.
func metricsAfterTraffic(t *testing.T, store string, env ...string) string {
	t.Helper()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/reset" {
			// A reset before any response: the gateway answers 502 and counts reason="reset".
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				c.Close()
			}
			return
		}
		w.Write([]byte("ok"))
	})
	g := startGateway(t, up.URL, store+metricsPolicies, env...)
	statuses := map[int]int{}
	for range 8 { // burst 4: four admitted (one of them reset upstream), then 429s
		path := "/api/x"
		if statuses[http.StatusOK] == 1 && statuses[http.StatusBadGateway] == 0 {
			path = "/api/reset"
		}
		resp, _ := get(t, g.proxy+path, "X-User-Id", "alice")
		statuses[resp.StatusCode]++
	}
	for range 3 {
		resp, _ := get(t, g.proxy+"/leaky/x")
		statuses[resp.StatusCode]++
	}
	resp, _ := get(t, g.proxy+"/free/x")
	statuses[resp.StatusCode]++
	if statuses[http.StatusOK] < 4 || statuses[http.StatusTooManyRequests] < 1 || statuses[http.StatusBadGateway] != 1 {
		t.Fatalf("statuses %v: want admitted (200), limited (429) and one upstream error (502)", statuses)
	}
	_, body := get(t, g.admin+"/metrics")
	for _, series := range []string{
		`ratelimit_requests_total{policy="per-ip",result="allowed"}`,
		`ratelimit_requests_total{policy="per-ip",result="limited"}`,
		`ratelimit_requests_total{policy="per-user-shadow",result="shadow_limited"}`,
		`ratelimit_decisions_total{result="unmatched"}`,
		`ratelimit_upstream_errors_total{reason="reset"}`,
	} {
		if v := metric(t, g.admin, series); v < 1 {
			t.Errorf("%s = %v after the traffic, want at least 1: the traffic did not reach every path", series, v)
		}
	}
	return body
}

// scrapes caches one /metrics body per store backend: TestMetricsLintClean and
// TestDashboardQueriesExportedMetrics read the same gateways.
var scrapes = map[string]string{}

// scrape returns /metrics after metricsAfterTraffic for "memory" or "dynamodb" (which ends the
// test as dynamoEndpoint does when DynamoDB Local is not running).
func scrape(t *testing.T, backend string) string {
	t.Helper()
	if body, ok := scrapes[backend]; ok {
		return body
	}
	var body string
	switch backend {
	case "memory":
		// With the upstream protection on, so that its families are linted and dashboarded too.
		body = metricsAfterTraffic(t, "protect: {concurrency: {queue_timeout: 10ms}}\n")
	case "dynamodb":
		ep := dynamoEndpoint(t)
		body = metricsAfterTraffic(t, dynamoStore("ratelimit-metrics-"+randomSuffix(), ep, true, "2s", ""), awsEnv()...)
	}
	scrapes[backend] = body
	return body
}

// TestMetricsLintClean runs promlint, the linter behind `promtool check metrics`, on /metrics
// after traffic, with the memory store and with DynamoDB (whose store adds its own metrics).
// Every family counts, the Go and process collectors' too.
func TestMetricsLintClean(t *testing.T) {
	for _, backend := range []string{"memory", "dynamodb"} {
		t.Run(backend, func(t *testing.T) { lintClean(t, scrape(t, backend)) })
	}
}

func lintClean(t *testing.T, body string) {
	t.Helper()
	families := parseFamilies(t, body)
	var ours int
	for name := range families {
		if strings.HasPrefix(name, "ratelimit_") {
			ours++
		}
	}
	if ours < 15 {
		t.Fatalf("only %d ratelimit_* families in /metrics, want at least 15:\n%s", ours, body)
	}
	problems, err := promlint.New(strings.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	t.Logf("%d metric families (%d ratelimit_*), %d promlint problems", len(families), ours, len(problems))
}

func parseFamilies(t *testing.T, body string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return families
}

// exportedSeriesNames returns every name a PromQL query can select from the families: a
// histogram's _bucket, _sum and _count, a summary's _sum and _count besides its own name.
func exportedSeriesNames(families map[string]*dto.MetricFamily) []string {
	var names []string
	for name, f := range families {
		names = append(names, name)
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names = append(names, name+"_bucket", name+"_sum", name+"_count")
		case dto.MetricType_SUMMARY:
			names = append(names, name+"_sum", name+"_count")
		}
	}
	slices.Sort(names)
	return names
}

const dashboardFile = "../../deploy/grafana/ratelimit-proxy.json"

// dashboardQueries returns every PromQL expression of the dashboard (panels, panels inside rows)
// and the metrics its template variables read (label_values(METRIC, label)).
func dashboardQueries(t *testing.T) (exprs, variableMetrics []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		ID      int     `json:"id"`
		Type    string  `json:"type"`
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s: the dashboard needs a uid and a title (got %q, %q)", dashboardFile, d.UID, d.Title)
	}
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share the id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("template variable %s: %q is not label_values(METRIC, label)", v.Name, v.Definition)
			continue
		}
		variableMetrics = append(variableMetrics, m[1])
	}
	return exprs, variableMetrics
}

var (
	labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	// Parts of a PromQL expression that hold no metric name.
	promqlStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
		"and", "or", "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression selects: identifiers left once
// strings, label matchers, ranges and grouping clauses are removed, that are neither functions
// or aggregations (followed by "(") nor keywords.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promqlIdent.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] == '$' || s[loc[0]-1] == '.' || isDigit(s[loc[0]-1])) {
			continue // a Grafana variable, or the exponent of a number such as 1e3
		}
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") || slices.Contains(promqlKeywords, name) {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func TestMetricNamesFromPromQL(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (result) (rate(ratelimit_decisions_total{job=~"$job", result="limited"}[$__rate_interval]))`: {"ratelimit_decisions_total"},
		`histogram_quantile(0.99, sum by (le, backend) (rate(a_seconds_bucket{x="y{z}"}[5m])))`:              {"a_seconds_bucket"},
		`sum(rate(a_total[1m])) / sum without (op) (rate(b_total[1m])) > bool 0`:                             {"a_total", "b_total"},
		`time() - max(c_timestamp_seconds{instance=~"$instance"}) offset 5m`:                                 {"c_timestamp_seconds"},
		`a_total and on (job) group_left (x) b_info or 1e3 * d:recorded:rate5m`:                              {"a_total", "b_info", "d:recorded:rate5m"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%s) = %v, want %v", expr, got, want)
		}
	}
}

// TestDashboardQueriesExportedMetrics checks that every metric the Grafana dashboard queries is
// one the gateway exports (with the memory store or DynamoDB, after traffic), histogram series
// suffixes included, and that the dashboard shows what operators ask of it first.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	exprs, varMetrics := dashboardQueries(t)
	if len(exprs) < 15 {
		t.Fatalf("%d queries in the dashboard, want at least 15", len(exprs))
	}
	var queried []string
	for _, e := range exprs {
		names := metricNames(e)
		if len(names) == 0 {
			t.Errorf("query %q selects no metric", e)
		}
		for _, n := range names {
			if !slices.Contains(queried, n) {
				queried = append(queried, n)
			}
		}
	}
	for _, n := range varMetrics {
		if !slices.Contains(queried, n) {
			queried = append(queried, n)
		}
	}
	var exported []string
	for _, backend := range []string{"memory", "dynamodb"} {
		exported = append(exported, exportedSeriesNames(parseFamilies(t, scrape(t, backend)))...)
	}
	exported = append(exported, exportedSeriesNames(parseFamilies(t, rlsScrape(t)))...) // the RLS row
	for _, n := range queried {
		if !slices.Contains(exported, n) {
			t.Errorf("the dashboard queries %s, which the gateway does not export", n)
		}
	}
	for _, n := range []string{
		"ratelimit_decisions_total", "ratelimit_requests_total", // decisions by result and policy, 429 rate
		"ratelimit_store_duration_seconds_bucket", "ratelimit_store_errors_total", // store latency and errors
		"ratelimit_store_healthy",                    // breaker state
		"ratelimit_deny_cache_hits_total",            // deny cache
		"ratelimit_upstream_duration_seconds_bucket", // upstream latency
	} {
		if !slices.Contains(queried, n) {
			t.Errorf("the dashboard does not query %s", n)
		}
	}
	if !t.Failed() {
		t.Logf("%d queries over %d metrics, all exported", len(exprs), len(queried))
	}
}
