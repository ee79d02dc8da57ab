package e2e

// The Grafana dashboard of deploy/grafana in each way the gateway runs: a proxy on the memory
// store, a proxy on DynamoDB, and Envoy's rate limit service alone (which exports no
// ratelimit_decisions_total: a dashboard whose variables read it shows nothing there).

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// rlsScrape returns /metrics of an RLS-only gateway after calls of every common result.
func rlsScrape(t *testing.T) string {
	t.Helper()
	if body, ok := scrapes["rls"]; ok {
		return body
	}
	g := startRLSGateway(t, map[string]string{"e2e.yaml": rlsRules}, "", "")
	g.ask(t, desc("per_minute", "a")) // ok
	g.ask(t, desc("vip", "a"))        // unlimited
	g.ask(t, desc("nothing", "a"))    // unmatched
	// over_limit: a limit of 1 a minute is over by the second call, or the third when a minute
	// ended between the first two.
	over := false
	for range 3 {
		over = over || g.ask(t, desc("wild", "foo1")).GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT
	}
	if !over {
		t.Fatal("three calls of a rule of 1 a minute: none over the limit")
	}
	_, body := get(t, g.admin+"/metrics")
	scrapes["rls"] = body
	return body
}

// dashboardRows returns the queries of every panel, by the title of the row above it.
func dashboardRows(t *testing.T) map[string][][]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type    string
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	rows := map[string][][]string{}
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		var exprs []string
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
		rows[row] = append(rows[row], exprs)
	}
	return rows
}

// TestDashboardInEveryMode: the template variables ($job, $instance) read a metric that every
// mode exports; every metric a query names is exported in some mode; and the rows of each mode
// (Decisions for a proxy, the RLS row for the service) show data: each of their panels has
// queries whose metrics that mode exports.
func TestDashboardInEveryMode(t *testing.T) {
	_, varMetrics := dashboardQueries(t)
	exported := map[string][]string{
		"proxy on memory":   exportedSeriesNames(parseFamilies(t, scrape(t, "memory"))),
		"proxy on DynamoDB": exportedSeriesNames(parseFamilies(t, scrape(t, "dynamodb"))),
		"RLS only":          exportedSeriesNames(parseFamilies(t, rlsScrape(t))),
	}
	for mode, names := range exported {
		for _, m := range varMetrics {
			if !slices.Contains(names, m) {
				t.Errorf("%s: the dashboard's variables read %s, which this mode does not export: every panel is empty", mode, m)
			}
		}
	}

	rows := dashboardRows(t)
	for row, panels := range rows {
		for _, exprs := range panels {
			for _, e := range exprs {
				for _, n := range metricNames(e) {
					if !slices.ContainsFunc([]string{"proxy on memory", "proxy on DynamoDB", "RLS only"}, func(m string) bool { return slices.Contains(exported[m], n) }) {
						t.Errorf("row %q: %s is exported in no mode", row, n)
					}
				}
			}
		}
	}
	for _, c := range []struct{ row, mode string }{
		{"Decisions", "proxy on memory"},
		{"Decisions", "proxy on DynamoDB"},
		{"Rate limit service (RLS)", "RLS only"},
	} {
		panels, ok := rows[c.row]
		if !ok || len(panels) == 0 {
			t.Errorf("the dashboard has no row %q", c.row)
			continue
		}
		for _, exprs := range panels {
			for _, e := range exprs {
				for _, n := range metricNames(e) {
					if !slices.Contains(exported[c.mode], n) {
						t.Errorf("row %q, %s: %s is not exported: the panel is empty", c.row, c.mode, n)
					}
				}
			}
		}
	}
	var rlsMetrics []string
	for _, exprs := range rows["Rate limit service (RLS)"] {
		for _, e := range exprs {
			rlsMetrics = append(rlsMetrics, metricNames(e)...)
		}
	}
	for _, n := range []string{"ratelimit_rls_calls_total", "ratelimit_rls_call_duration_seconds_bucket"} {
		if !slices.Contains(rlsMetrics, n) {
			t.Errorf("the RLS row does not query %s", n)
		}
	}
}
