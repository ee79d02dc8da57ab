package console

import (
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The live page: server-rendered HTML with hand-made SVG charts, no script and nothing
// fetched from elsewhere, so it works offline and with JavaScript off. It refreshes itself every
// few seconds (meta refresh).

// pageRefresh is the page's refresh period in seconds.
const pageRefresh = 5

// chart geometry, in SVG user units.
const (
	chartW, chartH = 900.0, 120.0
)

type pagePolicy struct {
	Info               PolicyInfo
	Allowed, Limited   string // SVG polyline points
	Max                uint32
	SumAllowed, SumLim uint64
	Top                []TopKey
}

type pageData struct {
	Now        string
	Refresh    int
	Policies   []pagePolicy
	Exemptions []*Exemption
	Resets     []ResetRecord
}

var pageTmpl = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{{.Refresh}}">
<link rel="icon" href="data:,">
<title>ratelimit-proxy console</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.2em 0 .3em}
section.policy{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:.8em 0}
table{border-collapse:collapse;margin:.3em 0}td,th{padding:.15em .7em;text-align:left;border-bottom:1px solid #eee}
td.n{text-align:right;font-variant-numeric:tabular-nums}
svg{width:100%;max-width:900px;height:auto;background:#fcfcfc;border:1px solid #eee}
.allowed{stroke:#2a7ab0;fill:none;stroke-width:1.5}.limited{stroke:#d2452b;fill:none;stroke-width:1.5}
.legend span{margin-right:1em}.a{color:#2a7ab0}.l{color:#d2452b}.muted{color:#777}
</style></head><body>
<h1>ratelimit-proxy console</h1>
<p class="muted">This replica's view at {{.Now}}; refreshes every {{.Refresh}}s. The API is under <code>/v1/</code> (docs/operations.md).</p>
{{range .Policies}}<section class="policy" id="policy-{{.Info.Name}}">
<h2>{{.Info.Name}}</h2>
<p class="muted">{{.Info.Summary}}</p>
<p class="legend"><span class="a">■ allowed/s</span><span class="l">■ limited/s</span>
<span>last 15 min: {{.SumAllowed}} allowed, {{.SumLim}} limited; peak {{.Max}}/s</span></p>
<svg class="chart" viewBox="0 0 900 130" role="img" aria-label="{{.Info.Name}}: allowed and limited per second over the last 15 minutes">
<line x1="0" y1="125" x2="900" y2="125" stroke="#ccc"/>
<polyline class="allowed" points="{{.Allowed}}"/>
<polyline class="limited" points="{{.Limited}}"/>
</svg>
<table class="top"><tr><th>top key</th><th>requests</th><th>429s</th><th>± error</th></tr>
{{range .Top}}<tr><td><code>{{.Key}}</code></td><td class="n">{{.Requests}}</td><td class="n">{{.Limited}}</td><td class="n">{{.Error}}</td></tr>
{{else}}<tr><td colspan="4" class="muted">no requests lately</td></tr>{{end}}</table>
</section>
{{end}}
<h2>Active exemptions</h2>
<table id="exemptions"><tr><th>id</th><th>policy</th><th>key</th><th>limit</th><th>expires</th><th>reason</th><th>by</th></tr>
{{range .Exemptions}}<tr><td>{{.ID}}</td><td>{{.Policy}}</td><td><code>{{.Key}}</code></td><td>{{if .Unlimited}}unlimited{{else}}{{with .Limit}}{{if .Rate}}{{.Rate}} burst {{.Burst}}{{else}}{{.Limit}}{{if .Window}} per {{.Window}}{{end}}{{end}}{{end}}{{end}}</td><td>{{.ExpiresAt.Format "2006-01-02 15:04:05Z07:00"}}</td><td>{{.Reason}}</td><td>{{.CreatedBy}}</td></tr>
{{else}}<tr><td colspan="7" class="muted">none</td></tr>{{end}}</table>
<h2>Last resets</h2>
<table id="resets"><tr><th>at</th><th>policy</th><th>key</th><th>by</th><th>reason</th></tr>
{{range .Resets}}<tr><td>{{.At.Format "15:04:05Z07:00"}}</td><td>{{.Policy}}</td><td><code>{{.Key}}</code></td><td>{{.Who}}</td><td>{{.Reason}}</td></tr>
{{else}}<tr><td colspan="5" class="muted">none on this replica</td></tr>{{end}}</table>
</body></html>
`))

func (c *Console) page(w http.ResponseWriter, _ *http.Request) {
	now := c.o.Now()
	d := pageData{Now: now.UTC().Format(time.RFC3339), Refresh: pageRefresh,
		Exemptions: c.ex.list(now), Resets: c.resets.list()}
	set := c.o.Policies()
	for _, p := range set.Policies() {
		d.Policies = append(d.Policies, c.pagePolicy(infoOf(p), now))
	}
	// The rate limit service's rules, once they have had calls in the last 15 minutes: a
	// domain may have hundreds of rules, most of them idle at any time.
	var rules []pagePolicy
	for _, dn := range set.RLS().Domains() {
		for _, r := range set.RLS().Domain(dn).Rules() {
			if r.Unlimited {
				continue
			}
			if pp := c.pagePolicy(rlsInfo(dn, r), now); pp.SumAllowed+pp.SumLim > 0 {
				rules = append(rules, pp)
			}
		}
	}
	slices.SortFunc(rules, func(a, b pagePolicy) int { return strings.Compare(a.Info.Name, b.Info.Name) })
	d.Policies = append(d.Policies, rules...)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// Nothing but this page's own inline style may load: no script, no outside resource.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:")
	if err := pageTmpl.Execute(w, d); err != nil {
		c.o.Logger.Warn("admin: rendering the page failed")
	}
}

// pagePolicy is the page's section of one policy (or rls rule).
func (c *Console) pagePolicy(info PolicyInfo, now time.Time) pagePolicy {
	pts := c.series(info.Name, now)
	pp := pagePolicy{Info: info, Top: c.top(info.Name, 10, now)}
	for _, pt := range pts {
		pp.Max = max(pp.Max, pt.Allowed, pt.Limited)
		pp.SumAllowed += uint64(pt.Allowed)
		pp.SumLim += uint64(pt.Limited)
	}
	pp.Allowed = polyline(pts, pp.Max, func(p Point) uint32 { return p.Allowed })
	pp.Limited = polyline(pts, pp.Max, func(p Point) uint32 { return p.Limited })
	return pp
}

// polyline renders a series as SVG polyline points scaled to peak (the chart's top).
func polyline(pts []Point, peak uint32, v func(Point) uint32) string {
	var b strings.Builder
	scale := 0.0
	if peak > 0 {
		scale = (chartH - 5) / float64(peak)
	}
	step := chartW / float64(max(len(pts)-1, 1))
	for i, p := range pts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", float64(i)*step, 125-float64(v(p))*scale)
	}
	return b.String()
}
