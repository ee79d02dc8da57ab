package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"
)

// report is .cache/bench/overload.json.
type report struct {
	Capacity          int            `json:"capacity"`
	ServiceMS         float64        `json:"service_ms"`
	CapacityPerSecond float64        `json:"capacity_per_second"`
	QueueTimeoutMS    float64        `json:"queue_timeout_ms"`
	Reserve           float64        `json:"critical_reserve"`
	ClientTimeoutMS   float64        `json:"client_timeout_ms"`
	Configs           []configResult `json:"configs"`
	Targets           []target       `json:"targets"` // the targets, adaptive run
	// Hostile compares the honest clients without and with hostile ones beside them.
	Hostile *hostileReport `json:"hostile,omitempty"`
}

type configResult struct {
	config
	Steps []step `json:"steps"`
	// Limits is the limit and the requests in flight every 200ms (seconds since the run began;
	// -1 without protection).
	Limits      []limitPoint `json:"limits"`
	PhaseStarts []float64    `json:"phase_starts_s"`
	// SettleS is, for the halved step, how long after the capacity halved the limit stayed for
	// good within 25% of where it ended (-1 without protection).
	SettleS float64 `json:"settle_s"`
	// AfterSettle is the halved step's requests sent once the limit settled.
	AfterSettle *step `json:"after_settle,omitempty"`
	samples     []sample
}

type limitPoint struct {
	T        float64 `json:"t_s"`
	Limit    float64 `json:"limit"`
	Inflight float64 `json:"inflight"`
}

// step is one load step of one configuration.
type step struct {
	Name        string             `json:"name"`
	Load        float64            `json:"load"` // multiple of the original capacity
	Seconds     float64            `json:"seconds"`
	CapacityPS  float64            `json:"capacity_per_second"` // the upstream's, halved or not
	OfferedPS   map[string]float64 `json:"offered_per_second"`
	AdmittedPS  map[string]float64 `json:"admitted_per_second"`
	Shed        map[string]int     `json:"shed"`
	Timeouts    int                `json:"client_timeouts"`
	Errors      int                `json:"errors"`
	P50MS       float64            `json:"admitted_p50_ms"`
	P99MS       float64            `json:"admitted_p99_ms"`
	GoodputPS   float64            `json:"goodput_per_second"` // admitted (200 within the client's timeout)
	GoodputRate float64            `json:"goodput_of_capacity"`
}

type target struct {
	What   string `json:"what"`
	Target string `json:"target"`
	Got    string `json:"got"`
	Met    bool   `json:"met"`
}

func summarize(o options, c config, samples []sample, limits []limitPoint, starts []float64) configResult {
	r := configResult{config: c, Limits: limits, PhaseStarts: starts, SettleS: -1, samples: samples}
	for pi, ph := range phases(o) {
		var in []sample
		for _, s := range samples {
			if s.phase == pi {
				in = append(in, s)
			}
		}
		r.Steps = append(r.Steps, stepOf(o, ph, in, ph.Dur.Seconds()))
	}
	if len(limits) > 0 && limits[0].Limit >= 0 {
		halvedAt := starts[len(starts)-1]
		r.SettleS = settle(limits, halvedAt)
		if r.SettleS >= 0 {
			var in []sample
			from := time.Duration((halvedAt + r.SettleS) * float64(time.Second))
			for _, s := range samples {
				if s.phase == len(starts)-1 && s.start >= from {
					in = append(in, s)
				}
			}
			ph := phases(o)[len(starts)-1]
			st := stepOf(o, ph, in, ph.Dur.Seconds()-r.SettleS)
			st.Name += ", after the limit settled"
			r.AfterSettle = &st
		}
	}
	return r
}

func stepOf(o options, ph phase, in []sample, secs float64) step {
	st := step{Name: ph.Name, Load: ph.Load, Seconds: secs, OfferedPS: map[string]float64{}, AdmittedPS: map[string]float64{}, Shed: map[string]int{}}
	capN := o.capacity
	if ph.Halved {
		capN = max(1, o.capacity/2)
	}
	st.CapacityPS = float64(capN) / o.service.Seconds()
	var lat []float64
	for _, s := range in {
		name := classNames[s.class]
		st.OfferedPS[name]++
		switch s.outcome {
		case outOK:
			st.AdmittedPS[name]++
			lat = append(lat, ms(s.latency))
		case outShed:
			st.Shed[name]++
		case outTimeout:
			st.Timeouts++
		default:
			st.Errors++
		}
	}
	var ok float64
	for _, n := range classNames {
		ok += st.AdmittedPS[n]
		st.OfferedPS[n] = round(st.OfferedPS[n] / secs)
		st.AdmittedPS[n] = round(st.AdmittedPS[n] / secs)
	}
	st.GoodputPS = round(ok / secs)
	st.GoodputRate = round(st.GoodputPS / st.CapacityPS)
	st.P50MS, st.P99MS = round(quantile(lat, 0.5)), round(quantile(lat, 0.99))
	return st
}

// settle is how long after at the limit entered, for good, the band of 25% around where it
// ended (the median of the step's last 3 seconds); -1 when it never did.
func settle(limits []limitPoint, at float64) float64 {
	var tail []float64
	end := limits[len(limits)-1].T
	for _, p := range limits {
		if p.T >= end-3 {
			tail = append(tail, p.Limit)
		}
	}
	final := quantile(tail, 0.5)
	lo, hi := final*0.75, final*1.25
	settled := -1.0
	for _, p := range limits {
		if p.T < at {
			continue
		}
		if p.Limit < lo || p.Limit > hi {
			settled = -1
			continue
		}
		if settled < 0 {
			settled = p.T - at
		}
	}
	return round(settled)
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func round(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return -1
	}
	return math.Round(x*100) / 100
}

func (r *configResult) stepNamed(name string) *step {
	for i := range r.Steps {
		if r.Steps[i].Name == name {
			return &r.Steps[i]
		}
	}
	return nil
}

// evaluate checks the adaptive run against the targets.
func (rep *report) evaluate(o options) {
	var a *configResult
	for i := range rep.Configs {
		if rep.Configs[i].Name == "adaptive" {
			a = &rep.Configs[i]
		}
	}
	if a == nil {
		return
	}
	base := a.stepNamed("unloaded").P99MS
	bound := 2*base + ms(o.queueTimeout)
	add := func(what, tgt, got string, met bool) {
		rep.Targets = append(rep.Targets, target{What: what, Target: tgt, Got: got, Met: met})
	}
	s4 := a.stepNamed("4x")
	add("4x: p99 of admitted", fmt.Sprintf("<= 2 x unloaded p99 (%.1f ms) + queue_timeout = %.1f ms", base, bound),
		fmt.Sprintf("%.1f ms", s4.P99MS), s4.P99MS <= bound)
	add("4x: goodput", fmt.Sprintf(">= 90%% of capacity (%.0f/s)", s4.CapacityPS),
		fmt.Sprintf("%.0f/s (%.0f%%)", s4.GoodputPS, 100*s4.GoodputRate), s4.GoodputRate >= 0.9)
	crit := s4.AdmittedPS["critical"] / s4.OfferedPS["critical"]
	add("4x: critical admitted", ">= 99%", fmt.Sprintf("%.2f%%", 100*crit), crit >= 0.99)
	shedShare := func(c string) float64 {
		return float64(s4.Shed[c]) / (s4.OfferedPS[c] * s4.Seconds)
	}
	add("4x: sheddable shed before default", "sheddable's shed share >= default's",
		fmt.Sprintf("sheddable %.0f%%, default %.0f%%, critical %.0f%%", 100*shedShare("sheddable"), 100*shedShare("default"), 100*shedShare("critical")),
		shedShare("sheddable") >= shedShare("default"))
	add("capacity halved: the limit settles", "within 5 s", fmt.Sprintf("%.1f s", a.SettleS), a.SettleS >= 0 && a.SettleS <= 5)
	if as := a.AfterSettle; as != nil {
		add("capacity halved, settled: p99 of admitted", fmt.Sprintf("<= %.1f ms", bound), fmt.Sprintf("%.1f ms", as.P99MS), as.P99MS <= bound)
		add("capacity halved, settled: goodput", fmt.Sprintf(">= 90%% of capacity (%.0f/s)", as.CapacityPS),
			fmt.Sprintf("%.0f/s (%.0f%%)", as.GoodputPS, 100*as.GoodputRate), as.GoodputRate >= 0.9)
	}
}

func (rep *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nupstream: %d in parallel x %.0fms = %.0f req/s; queue_timeout %.0fms; clients give up after %.0fms\n",
		rep.Capacity, rep.ServiceMS, rep.CapacityPerSecond, rep.QueueTimeoutMS, rep.ClientTimeoutMS)
	fmt.Fprintf(w, "%-9s %-42s %8s %8s %8s %9s %9s %8s %8s %8s\n", "config", "step", "offer/s", "good/s", "good%", "p50 ms", "p99 ms", "shed c", "shed d", "shed s")
	for _, c := range rep.Configs {
		rows := c.Steps
		if c.AfterSettle != nil {
			rows = append(slices.Clone(rows), *c.AfterSettle)
		}
		for _, s := range rows {
			var off float64
			for _, n := range classNames {
				off += s.OfferedPS[n]
			}
			fmt.Fprintf(w, "%-9s %-42s %8.0f %8.0f %7.0f%% %9.1f %9.1f %8d %8d %8d\n", c.Name, s.Name, off, s.GoodputPS, 100*s.GoodputRate,
				s.P50MS, s.P99MS, s.Shed["critical"], s.Shed["default"], s.Shed["sheddable"])
		}
		if c.SettleS != -1 {
			fmt.Fprintf(w, "%-9s the limit settled %.1fs after the capacity halved\n", c.Name, c.SettleS)
		}
	}
	if rep.Hostile != nil {
		defer rep.Hostile.print(w)
	}
	fmt.Fprintln(w, "\ntargets (adaptive):")
	for _, t := range rep.Targets {
		mark := "MET"
		if !t.Met {
			mark = "NOT MET"
		}
		fmt.Fprintf(w, "  %-44s %-52s got %-40s %s\n", t.What, t.Target, t.Got, mark)
	}
}

// plot draws, per configuration, admitted and shed requests per second and the p99 of admitted
// requests per second of the run (left), and the limit with the requests in flight (right).
func plot(rep *report) []byte {
	const panelW, panelH, pad = 560, 220, 50
	rows := len(rep.Configs)
	W, H := 2*panelW+3*pad, rows*(panelH+pad)+pad+30
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">make bench-overload: upstream %d x %.0fms (%.0f req/s), load 0.1x 0.5x 1x 2x 4x, then capacity halved</text>`+"\n",
		pad, rep.Capacity, rep.ServiceMS, rep.CapacityPerSecond)
	for i, c := range rep.Configs {
		y0 := 30 + pad + i*(panelH+pad)
		var end float64
		if n := len(c.Limits); n > 0 {
			end = c.Limits[n-1].T
		}
		for _, s := range c.samples {
			end = math.Max(end, s.start.Seconds())
		}
		secs := int(end) + 1
		ok, shed := make([]float64, secs), make([]float64, secs)
		lat := make([][]float64, secs)
		for _, s := range c.samples {
			k := min(int(s.start.Seconds()), secs-1)
			switch s.outcome {
			case outOK:
				ok[k]++
				lat[k] = append(lat[k], ms(s.latency))
			case outShed:
				shed[k]++
			}
		}
		p99 := make([]float64, secs)
		for k := range lat {
			p99[k] = quantile(lat[k], 0.99)
		}
		xs := make([]float64, secs)
		for k := range xs {
			xs[k] = float64(k) + 0.5
		}
		left := frame{x: pad, y: y0, w: panelW, h: panelH, xmax: float64(secs), ymax: niceMax(append(slices.Clone(ok), shed...))}
		left.axes(&b, c.Name+": admitted/s (green), shed/s (red); p99 ms (purple, right scale)")
		left.line(&b, xs, ok, "green", left.ymax)
		left.line(&b, xs, shed, "red", left.ymax)
		pmax := niceMax(p99)
		left.line(&b, xs, p99, "purple", pmax)
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="purple">%.0f ms</text>`+"\n", left.x+left.w+4, left.y+10, pmax)
		left.marks(&b, c.PhaseStarts)
		right := frame{x: 2*pad + panelW, y: y0, w: panelW, h: panelH, xmax: float64(secs)}
		var lt, lv, iv []float64
		for _, p := range c.Limits {
			lt, lv, iv = append(lt, p.T), append(lv, p.Limit), append(iv, p.Inflight)
		}
		right.ymax = niceMax(append(slices.Clone(lv), iv...))
		title := c.Name + ": limit (blue), in flight (grey)"
		if len(lv) == 0 || lv[0] < 0 {
			title = c.Name + ": no protection, no limit"
			right.ymax = 1
		}
		right.axes(&b, title)
		if len(lv) > 0 && lv[0] >= 0 {
			right.line(&b, lt, iv, "grey", right.ymax)
			right.line(&b, lt, lv, "blue", right.ymax)
		}
		right.marks(&b, c.PhaseStarts)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

type frame struct {
	x, y, w, h int
	xmax, ymax float64
}

func (f frame) axes(b *bytes.Buffer, title string) {
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>`+"\n", f.x, f.y, f.w, f.h)
	fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", f.x, f.y-6, title)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%.0f</text><text x="%d" y="%d" text-anchor="end">0</text>`+"\n", f.x-4, f.y+10, f.ymax, f.x-4, f.y+f.h)
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%.0f s</text>`+"\n", f.x+f.w, f.y+f.h+14, f.xmax)
}

func (f frame) line(b *bytes.Buffer, xs, ys []float64, color string, ymax float64) {
	if ymax <= 0 {
		return
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="`, color)
	for i := range xs {
		y := ys[i]
		if math.IsNaN(y) {
			continue
		}
		px := float64(f.x) + xs[i]/f.xmax*float64(f.w)
		py := float64(f.y+f.h) - math.Min(y, ymax)/ymax*float64(f.h)
		fmt.Fprintf(b, "%.1f,%.1f ", px, py)
	}
	b.WriteString(`"/>` + "\n")
}

// marks draws the step boundaries.
func (f frame) marks(b *bytes.Buffer, starts []float64) {
	for _, s := range starts[1:] {
		px := float64(f.x) + s/f.xmax*float64(f.w)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#bbb" stroke-dasharray="3,3"/>`+"\n", px, f.y, px, f.y+f.h)
	}
}

func niceMax(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		if !math.IsNaN(x) {
			m = math.Max(m, x)
		}
	}
	if m <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(m)))
	for _, f := range []float64{1, 2, 5, 10} {
		if m <= f*p {
			return f * p
		}
	}
	return 10 * p
}
