package main

import (
	"crypto/rand"
	"encoding/hex"
	"math"
	"net/http"
	"sort"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
)

// judge checks every bucket of the run's history, each policy span by span between the
// console's writes (b: see exactcheck's spans).
func judge(res *runResult, ps []policy, recs []*record, reps []*replica, b *bounds) {
	var minOff, maxOff time.Duration
	for _, r := range reps {
		minOff, maxOff = min(minOff, r.offset), max(maxOff, r.offset)
	}
	chargeOn := map[string]bool{}
	for _, p := range ps {
		chargeOn[p.name] = p.chargeOn
	}
	spans, first, last := spansOf(ps, recs, b, minOff, maxOff)
	res.Load = offeredVsBound(ps, recs, spans)
	byBucket := map[[2]string][]exactcheck.Decision{}
	admissions := map[string][]exactcheck.Admission{}
	offered := map[string][]exactcheck.Decision{} // every request answered (its cost), for under-admission
	var all []exactcheck.Decision
	for _, rec := range recs {
		switch {
		case rec.status == 0:
			res.NoAnswer++
		case rec.status == http.StatusOK || rec.status == http.StatusTooManyRequests || rec.status == http.StatusUnauthorized:
			res.Decisions++
		default:
			res.Other[rec.status]++
		}
		if rec.by != "gate" && rec.status != 0 {
			offered[rec.policy] = append(offered[rec.policy], exactcheck.Decision{Start: rec.sent, End: rec.sent, Cost: rec.cost})
		}
		if rec.enter.IsZero() || (chargeOn[rec.policy] && !charged(rec.id)) {
			continue // not admitted, or admitted and given back (charge_on)
		}
		// The decision was made after the request was sent and before the upstream saw it.
		d := exactcheck.Decision{Replica: rec.replica, Key: rec.policy, Start: rec.sent, End: rec.enter, Cost: rec.cost}
		all = append(all, d)
		byBucket[[2]string{rec.policy, ""}] = append(byBucket[[2]string{rec.policy, ""}], d)
		if rec.gate != "" {
			g := d
			g.Cost = 1
			byBucket[[2]string{"gate", rec.gate}] = append(byBucket[[2]string{"gate", rec.gate}], g)
		}
		admissions[rec.policy] = append(admissions[rec.policy], exactcheck.Admission{Sent: rec.sent, Enter: rec.enter, Exit: rec.exit})
	}
	w := exactcheck.Widths(all)
	res.Widths = widthMS{P50: ms(w.P50), P99: ms(w.P99), Max: ms(w.Max)}
	since := func(t time.Time) float64 {
		if t.IsZero() {
			return 0 // a bucket without admissions has no worst interval
		}
		return ms(t.Sub(first))
	}
	add := func(policy, key string, v exactcheck.Violation) {
		res.Checks = append(res.Checks, checkResult{Policy: policy, Key: key, Admitted: v.Admitted, Bound: v.Bound, Excess: v.Excess(), FromMS: since(v.From), ToMS: since(v.To)})
	}
	for _, p := range ps {
		if p.concurrency > 0 {
			add(p.name, "", exactcheck.CheckConcurrencyResets(p.concurrency, admissions[p.name], b.windowsOf(p.name)))
			continue
		}
		ds := byBucket[[2]string{p.name, ""}]
		v, judged := exactcheck.CheckSpans(spans[p.name], ds)
		add(p.name, "", v)
		res.Console.DecisionsJudged += judged
		res.Console.DecisionsInWindows += len(ds) - judged
		// Under-admission, span by span: what was admitted against the least of what was
		// offered and what the bound allows.
		for _, sp := range spans[p.name] {
			var adm, off int64
			for _, d := range ds {
				if !d.Start.Before(sp.From) && !d.End.After(sp.To) {
					adm += d.Cost
				}
			}
			for _, d := range offered[p.name] {
				if !d.Start.Before(sp.From) && !d.Start.After(sp.To) {
					off += d.Cost
				}
			}
			res.Admitted += adm
			res.Possible += math.Min(float64(off), capacity(sp.Limit, sp.To.Sub(sp.From)))
		}
	}
	gl := exactcheck.Limit{Kind: exactcheck.GCRA, Rate: gateRate, Burst: gateBurst, MinOffset: minOff, MaxOffset: maxOff}
	keys := []string{}
	for k := range byBucket {
		if k[0] == "gate" {
			keys = append(keys, k[1])
		}
	}
	sort.Strings(keys)
	gateSpans := exactcheck.Spans(first, last, b.all, func(time.Time, time.Time) (exactcheck.Limit, bool) { return gl, true }, minSpan)
	for _, k := range keys {
		v, _ := exactcheck.CheckSpans(gateSpans, byBucket[[2]string{"gate", k}])
		add("gate", k, v)
	}
}

// minSpan is the shortest span judged: the pieces between the writes of one reset (a sliding
// window's slots are emptied one write each) are judged by none, and add nothing to the bound
// the load is measured against (each would add a whole window's limit).
const minSpan = 200 * time.Millisecond

// ratioSpan is the shortest span whose load enters offered_vs_bound. A shorter one (between a
// reset and an exemption's change, say) is judged like the others, but its bound is at least a
// whole window's limit however short it is, so no steady load is twice it there: counted, they
// would make the ratio say more about the console's pace than about the load.
const ratioSpan = time.Second

// spansOf cuts each policy's history (from the first request sent to the last answer) at the
// console's writes.
func spansOf(ps []policy, recs []*record, b *bounds, minOff, maxOff time.Duration) (map[string][]exactcheck.Span, time.Time, time.Time) {
	var first, last time.Time
	for _, rec := range recs {
		if first.IsZero() || rec.sent.Before(first) {
			first = rec.sent
		}
		last = maxTime(maxTime(last, rec.recv), rec.sent)
	}
	spans := map[string][]exactcheck.Span{}
	for _, p := range ps {
		l := p.limit
		l.MinOffset, l.MaxOffset = minOff, maxOff
		spans[p.name] = exactcheck.Spans(first, last, b.windowsOf(p.name), b.limitAt(p, l), minSpan)
	}
	return spans, first, last
}

// loadRatio is one policy's offered load against its bound over the intervals the checker
// judges: Offered and Bound in units over the run (a concurrency limit: requests in flight on
// average, and the limit), Ratio = Offered / Bound. Below 1 a gateway that limits nothing
// would pass; the check asks for at least minLoadRatio.
type loadRatio struct {
	Offered float64 `json:"offered"`
	Bound   float64 `json:"bound"`
	Ratio   float64 `json:"ratio"`
}

// minLoadRatio is how far past its bound every policy must be offered.
const minLoadRatio = 2

// offeredVsBound computes each policy's loadRatio from what the generator sent (answered or
// not), over the spans the checker judges: the units sent inside them against the sum of each
// span's bound under its limit (a bucket's burst + rate x span; a window's limit x span /
// window, at least one window's: every reset makes the key full again, so each span adds its
// own). A concurrency limit: the requests in flight on average over the run, against it.
func offeredVsBound(ps []policy, recs []*record, spans map[string][]exactcheck.Span) map[string]loadRatio {
	chargeOn := map[string]bool{}
	for _, p := range ps {
		chargeOn[p.name] = p.chargeOn
	}
	type sent struct {
		at   time.Time
		cost int64
	}
	byPolicy := map[string][]sent{}
	for _, rec := range recs {
		if chargeOn[rec.policy] && !charged(rec.id) {
			continue // its charge is given back: no load on the bound
		}
		byPolicy[rec.policy] = append(byPolicy[rec.policy], sent{rec.sent, rec.cost})
	}
	// A concurrency policy's offered load is averaged over the span the requests were sent in.
	var sentFirst, sentLast time.Time
	for _, rec := range recs {
		if sentFirst.IsZero() || rec.sent.Before(sentFirst) {
			sentFirst = rec.sent
		}
		sentLast = maxTime(sentLast, rec.sent)
	}
	span := sentLast.Sub(sentFirst).Seconds()
	out := map[string]loadRatio{}
	if span <= 0 {
		return out
	}
	for _, p := range ps {
		var lr loadRatio
		if p.concurrency > 0 {
			lr = loadRatio{Offered: float64(len(byPolicy[p.name])) * p.hold.Seconds() / span, Bound: float64(p.concurrency)}
		} else {
			for _, sp := range spans[p.name] {
				// The load's span: the answers that came after the last request was sent
				// (a concurrency policy's held 2 s) are judged, but nothing was offered then.
				sp.From, sp.To = maxTime(sp.From, sentFirst), minTime(sp.To, sentLast)
				if sp.To.Sub(sp.From) < ratioSpan {
					continue // judged, but too short for any load to be twice its bound
				}
				for _, s := range byPolicy[p.name] {
					if !s.at.Before(sp.From) && !s.at.After(sp.To) {
						lr.Offered += float64(s.cost)
					}
				}
				l, d := sp.Limit, sp.To.Sub(sp.From).Seconds()
				if l.Kind == exactcheck.GCRA {
					lr.Bound += l.Burst + l.Rate*d
				} else {
					lr.Bound += float64(l.Limit) * max(1, d/l.Window.Seconds())
				}
			}
		}
		lr.Offered, lr.Bound = round3(lr.Offered), round3(lr.Bound)
		if lr.Bound > 0 {
			lr.Ratio = round3(lr.Offered / lr.Bound)
		}
		out[p.name] = lr
	}
	return out
}

// capacity is the most a bucket may admit over a span: what under-admission is measured against.
func capacity(l exactcheck.Limit, span time.Duration) float64 {
	switch l.Kind {
	case exactcheck.GCRA:
		return l.Burst + l.Rate*span.Seconds()
	case exactcheck.SlidingWindow:
		return float64(l.Limit) * math.Ceil(span.Seconds()/l.Window.Seconds())
	default:
		return float64(l.Limit) * (math.Floor(span.Seconds()/l.Window.Seconds()) + 1)
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
