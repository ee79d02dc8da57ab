package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a replay. Its JSON form is the output of `replay --json`.
type Report struct {
	// Lines read; Requests among them; Unparseable lines (the first few in Errors); Skipped
	// lines that are well-formed but no request (empty lines, the gateway's other log lines).
	Lines       int64 `json:"lines"`
	Requests    int64 `json:"requests"`
	Unparseable int64 `json:"unparseable"`
	Skipped     int64 `json:"skipped"`
	// OutOfOrder requests were older than a line before them and decided at the later time.
	OutOfOrder int64 `json:"out_of_order"`
	// Admitted + Limited = Requests; Unmatched (no policy applied) are among the admitted.
	Admitted  int64 `json:"admitted"`
	Limited   int64 `json:"limited"`
	Unmatched int64 `json:"unmatched"`
	// From and To are the simulated clock's first and last instants (zero without requests).
	From     time.Time      `json:"from"`
	To       time.Time      `json:"to"`
	Policies []PolicyReport `json:"policies"`
	Errors   []LineError    `json:"errors"`
	// Series is the time series that --plot draws.
	Series Series `json:"series"`
}

// PolicyReport is one policy's part of a Report.
type PolicyReport struct {
	Name string `json:"name"`
	Mode string `json:"mode"` // enforce or shadow
	Key  string `json:"key"`  // ip, api_key, user, global, header:name
	// Matched = Admitted + Limited + ShadowLimited + LimitedElsewhere.
	Matched       int64 `json:"matched"`
	Admitted      int64 `json:"admitted"`
	Limited       int64 `json:"limited"`
	ShadowLimited int64 `json:"shadow_limited"`
	// LimitedElsewhere: another policy limited the request, so this one charged nothing.
	LimitedElsewhere int64 `json:"limited_elsewhere"`
	// PeakPerSecond is the most requests the policy matched in one second, at PeakAt.
	PeakPerSecond int64      `json:"peak_per_second"`
	PeakAt        *time.Time `json:"peak_at,omitempty"`
	// DistinctLimitedKeys is how many keys were limited (or shadow-limited) at least once; when
	// DistinctLimitedKeysExact is false, at least that many (the count is bounded by
	// store.max_keys).
	DistinctLimitedKeys      int64 `json:"distinct_limited_keys"`
	DistinctLimitedKeysExact bool  `json:"distinct_limited_keys_exact"`
	// TopLimitedKeys are the keys limited most, most first.
	TopLimitedKeys []KeyCount `json:"top_limited_keys"`
}

// KeyCount is a limited key, named `kind:pseudonym` (or "global"), and how many of its
// requests were limited. Over is the most by which Limited may exceed the truth (0: exact; the
// top-keys summary has a fixed size).
type KeyCount struct {
	Key     string `json:"key"`
	Limited int64  `json:"limited"`
	Over    int64  `json:"over,omitempty"`
}

// Series counts admitted and limited requests per policy in buckets of StepSeconds from
// Start. Limited includes shadow-limited.
type Series struct {
	Start       time.Time      `json:"start"`
	StepSeconds float64        `json:"step_seconds"`
	Policies    []PolicySeries `json:"policies"`
}

// PolicySeries is one policy's counts per bucket.
type PolicySeries struct {
	Name     string  `json:"name"`
	Admitted []int64 `json:"admitted"`
	Limited  []int64 `json:"limited"`
}

// Report returns the results so far.
func (r *Replayer) Report() *Report {
	t := r.totals
	rep := &Report{
		Lines: t.lines, Requests: t.requests, Unparseable: t.unparseable, Skipped: t.skipped,
		OutOfOrder: t.outOfOrder, Admitted: t.admitted, Limited: t.limited, Unmatched: t.unmatched,
		Errors: append([]LineError{}, r.errs...),
	}
	if r.started {
		rep.From, rep.To = time.Unix(0, r.first).UTC(), time.Unix(0, r.clock).UTC()
		rep.Series.Start = time.Unix(0, r.series.start).UTC()
	}
	rep.Series.StepSeconds = time.Duration(r.series.width).Seconds()
	for i := range r.stats {
		ps := &r.stats[i]
		mode := "enforce"
		if ps.pol.Shadow {
			mode = "shadow"
		}
		pr := PolicyReport{
			Name: ps.pol.Name, Mode: mode, Key: ps.pol.KeyKind,
			Matched: ps.matched, Admitted: ps.admitted, Limited: ps.limited,
			ShadowLimited: ps.shadowLimited, LimitedElsewhere: ps.limitedElsewhere,
			PeakPerSecond:            ps.peak.max,
			DistinctLimitedKeys:      int64(len(ps.distinct)),
			DistinctLimitedKeysExact: !ps.distinctCapped,
			TopLimitedKeys:           []KeyCount{},
		}
		if ps.peak.max > 0 {
			at := time.Unix(ps.peak.at, 0).UTC()
			pr.PeakAt = &at
		}
		for _, e := range ps.top.most(r.o.Top) {
			pr.TopLimitedKeys = append(pr.TopLimitedKeys, KeyCount{Key: e.label, Limited: e.count, Over: e.over})
		}
		rep.Policies = append(rep.Policies, pr)
		rep.Series.Policies = append(rep.Series.Policies, PolicySeries{
			Name:     ps.pol.Name,
			Admitted: append([]int64{}, r.series.admitted[i][:r.series.n]...),
			Limited:  append([]int64{}, r.series.limited[i][:r.series.n]...),
		})
	}
	return rep
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteText writes the report for people: totals, a table of the policies, the top limited keys
// and the first unparseable lines.
func (rep *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d lines: %d requests, %d unparseable, %d skipped", rep.Lines, rep.Requests, rep.Unparseable, rep.Skipped)
	if rep.OutOfOrder > 0 {
		fmt.Fprintf(&b, ", %d out of order", rep.OutOfOrder)
	}
	b.WriteString("\n")
	if rep.Requests > 0 {
		fmt.Fprintf(&b, "simulated time %s to %s (%s)\n", rep.From.Format(time.RFC3339), rep.To.Format(time.RFC3339),
			rep.To.Sub(rep.From).Round(time.Second))
		fmt.Fprintf(&b, "requests: %d admitted (%d matched no policy), %d limited (%s)\n",
			rep.Admitted, rep.Unmatched, rep.Limited, percent(rep.Limited, rep.Requests))
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tmode\tkey\tmatched\tadmitted\tlimited\tshadow-limited\tlimited elsewhere\tpeak/s\tlimited keys")
	for _, p := range rep.Policies {
		distinct := fmt.Sprint(p.DistinctLimitedKeys)
		if !p.DistinctLimitedKeysExact {
			distinct = "≥" + distinct
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Name, p.Mode, p.Key, p.Matched, p.Admitted,
			p.Limited, p.ShadowLimited, p.LimitedElsewhere, p.PeakPerSecond, distinct)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Policies {
		if len(p.TopLimitedKeys) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nkeys limited most by %s:\n", p.Name)
		for _, k := range p.TopLimitedKeys {
			over := ""
			if k.Over > 0 {
				over = fmt.Sprintf(" (at most %d fewer)", k.Over)
			}
			fmt.Fprintf(&b, "  %-50s %d%s\n", k.Key, k.Limited, over)
		}
	}
	if len(rep.Errors) > 0 {
		fmt.Fprintf(&b, "\nunparseable lines (first %d of %d):\n", len(rep.Errors), rep.Unparseable)
		for _, e := range rep.Errors {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func percent(n, of int64) string {
	if of == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.2f%%", 100*float64(n)/float64(of))
}
