package sim

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simddb"
)

// The invariants.
//
// After every step (every write the table applies, every decision that ends):
//   - no negative count or tat in the table, and a concurrency item's count equal to its slots;
//   - an exemption applies only from its creation on, and only while the deciding replica's clock
//     reads before its expiry.
//
// At every checkpoint (every checkEvery decisions) and at the end, the exact bound of every
// bucket over every interval of the history (exactcheck: GCRA, fixed and sliding windows with the
// replicas' clock spread, concurrency over the requests in flight), cut at the console's resets
// and the memory store's restarts, with the documented allowance of a reset: a give-back of a
// charge taken before it may return that charge's cost to a counter.
//
// At the end: leased units conserved on every replica that closed (leased = spent + refunded +
// expired, none held), and liveness: once the faults heal, every policy admits a request on every
// replica within livenessWithin.
const (
	checkEvery     = 500
	livenessWithin = 10 * time.Second
	// resetLinger is how long after a reset's answer its writes may still land (a copy the
	// network held) and the replicas may still act on what they knew before it (their console
	// read, and units leased before it).
	resetLinger = maxOrphanAge + readEvery + storeTimeout
)

type judge struct {
	w       *world
	buckets map[string]*bucketHist
	order   []string
	minOff  map[backend]time.Duration
	maxOff  map[backend]time.Duration
	resets  []*resetRec
	exempts map[string][]*exemptRec // by bucket key hex
	memDown time.Time               // the memory replica's last crash
	// redisRestarts are the instants the simulated Redis restarted (lost everything).
	redisRestarts []exactcheck.Window
	violations    []string
	checked       int
	// given: decision id -> charges given back (their decisions no longer count).
	given map[int]bool
	seen  map[string]bool
}

type bucketHist struct {
	backend backend
	pol     *simPolicy
	key     string
	ds      []exactcheck.Decision
	ids     []int // the decision of each entry of ds
	windows []exactcheck.Window
	conc    []exactcheck.Admission
	concID  []int
	concRep []int // the replica of each admission
	// allowance is what resets allow past the bound (give-backs of charges taken before them).
	allowance int64
}

type resetRec struct {
	id         int
	backend    backend
	key        string
	pol        *simPolicy
	start, end time.Time
	done       bool
	err        error
}

type exemptRec struct {
	id      string
	created time.Time
	expires time.Time // on the creating replica's clock
}

func newJudge(w *world) *judge {
	return &judge{w: w, buckets: map[string]*bucketHist{}, minOff: map[backend]time.Duration{}, maxOff: map[backend]time.Duration{},
		exempts: map[string][]*exemptRec{}, given: map[int]bool{}, seen: map[string]bool{}}
}

func (j *judge) violate(format string, args ...any) {
	msg := fmt.Sprintf("step %d: ", j.w.steps) + fmt.Sprintf(format, args...)
	if j.seen[msg] {
		return
	}
	j.seen[msg] = true
	j.violations = append(j.violations, msg)
	j.w.record("VIOLATION %s", msg)
}

func (j *judge) bucket(b backend, p *simPolicy, key string) *bucketHist {
	id := string(b) + "/" + p.name + "/" + key
	h, ok := j.buckets[id]
	if !ok {
		h = &bucketHist{backend: b, pol: p, key: key}
		j.buckets[id] = h
		j.order = append(j.order, id)
		// A bucket first seen after a memory restart starts clean anyway.
	}
	return h
}

// offset records a replica's clock offset (the spread the bounds allow for).
func (j *judge) offset(r *replica) {
	off := r.offset
	if j.w.cfg.Mutant == clockAhead && r.id == 0 {
		off -= clockAheadBy // the judge is told the clocks agree: nothing corrects this one
	}
	if lo, ok := j.minOff[r.backend]; !ok || off < lo {
		j.minOff[r.backend] = off
	}
	if hi, ok := j.maxOff[r.backend]; !ok || off > hi {
		j.maxOff[r.backend] = off
	}
}

// decided takes in a decision that ended on a live replica.
func (j *judge) decided(d *decision) {
	for i, c := range d.charges {
		if d.exempt[i] {
			j.checkExempt(d, c)
			continue
		}
		if !d.admitted || !d.results[i].Allowed {
			continue
		}
		h := j.bucket(d.rep.backend, d.pols[i], c.Key.String())
		if h.pol.conc > 0 {
			h.conc = append(h.conc, exactcheck.Admission{Sent: d.start, Enter: d.end})
			h.concID = append(h.concID, d.id)
			h.concRep = append(h.concRep, d.rep.id)
			continue
		}
		h.ds = append(h.ds, exactcheck.Decision{Replica: d.rep.id, Key: h.key, Start: d.start, End: d.end, Cost: c.N()})
		h.ids = append(h.ids, d.id)
	}
	if j.w.started-j.checked >= checkEvery {
		j.checked = j.w.started
		j.bounds()
	}
}

func (j *judge) checkExempt(d *decision, c bucket.Charge) {
	for _, e := range j.exempts[c.Key.String()] {
		if !d.start.Before(e.created) && d.now.Before(e.expires) {
			return
		}
	}
	j.violate("decision %d on r%d exempted key %s at %s (its clock %s) outside every exemption's life", d.id, d.rep.id, short(c.Key.String()),
		d.start.Sub(j.w.start), d.now.Sub(j.w.start))
}

func short(k string) string { return k[:8] }

// givenBack removes an admitted decision's given-back charges from the bounds: after its
// give-back the state may be as if it was never made.
func (j *judge) givenBack(d *decision, taken []bucket.Taken) {
	for _, t := range taken {
		for i, c := range d.charges {
			if c.Key != t.Charge.Key {
				continue
			}
			h := j.bucket(d.rep.backend, d.pols[i], c.Key.String())
			for k := len(h.ids) - 1; k >= 0; k-- {
				if h.ids[k] == d.id {
					h.ds = slices.Delete(h.ds, k, k+1)
					h.ids = slices.Delete(h.ids, k, k+1)
					break
				}
			}
			// A give-back that lands after a reset of its key returns its cost to the emptied
			// counter (the documented allowance) on DynamoDB. On Redis it finds another
			// generation (a reset deletes the key) and gives nothing: no allowance there.
			if h.backend == backendRedis && !looseRedis {
				continue
			}
			for _, r := range j.resets {
				if r.backend == d.rep.backend && r.key == h.key && r.pol == h.pol && d.start.Before(r.endOrNow()) && !isGCRA(h.pol) {
					h.allowance += c.N()
					break
				}
			}
		}
	}
}

func (r *resetRec) endOrNow() time.Time {
	if r.done {
		return r.end.Add(r.linger())
	}
	return time.Now().Add(r.linger())
}

// linger is how long after its answer a reset may still change its key's bound. On DynamoDB,
// resetLinger. On Redis a reset is one DEL and no replica keeps anything of a key (no deny
// cache, no leases, no console read of resets): answered, it has landed, and the key's bound
// is a fresh key's from its answer on; failed, it may still land, within maxOrphanAge.
func (r *resetRec) linger() time.Duration {
	if r.backend != backendRedis || looseRedis {
		return resetLinger
	}
	if r.done && r.err == nil {
		return 0
	}
	return maxOrphanAge
}

// looseRedis judges Redis with DynamoDB's allowances (SIM_LOOSE_REDIS): how the tighter checks
// were shown to catch what the looser ones miss.
var looseRedis = os.Getenv("SIM_LOOSE_REDIS") != ""

func isGCRA(p *simPolicy) bool { return p.conc == 0 && p.limit.Kind == exactcheck.GCRA }

// exited records the end of an admitted concurrency request.
func (j *judge) exited(d *decision, at time.Time) {
	for i, c := range d.charges {
		if d.pols[i].conc == 0 || d.exempt[i] {
			continue
		}
		h := j.bucket(d.rep.backend, d.pols[i], c.Key.String())
		for k, id := range h.concID {
			if id == d.id && h.conc[k].Exit.IsZero() {
				h.conc[k].Exit = at
			}
		}
	}
}

// crashed ends the replica's requests in flight, and for a memory store starts the window in
// which its state is lost.
func (j *judge) crashed(r *replica, at time.Time) {
	for _, h := range j.buckets {
		if h.backend != r.backend || h.pol.conc == 0 {
			continue
		}
		for k := range h.conc {
			if h.conc[k].Exit.IsZero() && h.concRep[k] == r.id {
				h.conc[k].Exit = at
			}
		}
	}
	if r.backend == backendMemory {
		j.memDown = at
	}
}

func (j *judge) memoryRestarted(at time.Time) {
	for _, h := range j.buckets {
		if h.backend == backendMemory {
			h.windows = append(h.windows, exactcheck.Window{From: j.memDown.Add(-time.Nanosecond), To: at.Add(time.Nanosecond)})
		}
	}
}

// redisRestarted cuts every Redis bucket at a restart of the simulated Redis without
// persistence: it loses every count, so every key starts full (the bound docs/redis.md states:
// one whole limit per restart), and every slot (up to the limit more in flight).
func (j *judge) redisRestarted(at time.Time) {
	j.redisRestarts = append(j.redisRestarts, exactcheck.Window{From: at.Add(-time.Nanosecond), To: at.Add(time.Nanosecond)})
}

func (j *judge) resetStarted(r *replica, c bucket.Charge, at time.Time) int {
	var p *simPolicy
	for i := range policies {
		if cc, _, _, _ := j.w.set.KeyCharge(policies[i].name, "x"); cc.Limit == c.Limit && cc.Lease == c.Lease && cc.MayGiveBack == c.MayGiveBack {
			p = &policies[i]
		}
	}
	rec := &resetRec{id: len(j.resets), backend: r.backend, key: c.Key.String(), pol: p, start: at}
	j.resets = append(j.resets, rec)
	return rec.id
}

func (j *judge) resetEnded(id int, err error, _ bool) {
	r := j.resets[id]
	r.end, r.err, r.done = time.Now(), err, true
}

// exemptionCreated records an exemption the console starts to create at (true time), with the
// expiry it asks for (on its replica's clock).
func (j *judge) exemptionCreated(id, key string, at, expires time.Time) {
	j.exempts[key] = append(j.exempts[key], &exemptRec{id: id, created: at, expires: expires})
}

// onWrite checks an item the table just changed.
func (w *world) onWrite(_, key string, it simddb.Item) {
	w.record("write %s %s", mask(key), maskItem(it))
	if it == nil {
		return
	}
	j := w.judge
	for name, av := range it {
		nv, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			continue
		}
		switch {
		case name == "count" || name == "tat":
			// A counter's give-back that lands after a reset of its key returns its cost to
			// the emptied count (the documented bound of a reset): below zero then.
			if strings.HasPrefix(nv.Value, "-") && !(name == "count" && j.resetLately(key)) {
				j.violate("item %s: %s = %s is negative", mask(key), name, nv.Value)
			}
		}
	}
	if strings.HasSuffix(key, "#c") {
		slots := 0
		for name := range it {
			if slotAttr(name) {
				slots++
			}
		}
		cnt := int64(0)
		if nv, ok := it["count"].(*types.AttributeValueMemberN); ok {
			cnt, _ = strconv.ParseInt(nv.Value, 10, 64)
		}
		if cnt != int64(slots) {
			j.violate("concurrency item %s: count %d, %d slots", mask(key), cnt, slots)
		}
	}
}

// resetLately reports whether the key of item pk was reset lately enough for a give-back of a
// charge taken before the reset to land now.
func (j *judge) resetLately(pk string) bool {
	now := time.Now()
	for _, r := range j.resets {
		if strings.HasPrefix(pk, r.key) && r.backend == backendDynamo && !now.Before(r.start) && now.Before(r.endOrNow().Add(lateWrites)) {
			return true
		}
	}
	return false
}

func slotAttr(name string) bool {
	if len(name) < 2 || name[0] != 'l' || name == "lv" {
		return false
	}
	for _, c := range name[1:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// bounds judges every bucket's history so far.
func (j *judge) bounds() {
	for _, id := range j.order {
		h := j.buckets[id]
		windows := slices.Clone(h.windows)
		if h.backend == backendRedis {
			windows = append(windows, j.redisRestarts...)
		}
		for _, r := range j.resets {
			if r.backend == h.backend && r.key == h.key && r.pol == h.pol {
				// A nanosecond either side: the fake clock puts many events at one instant, and
				// a decision at the reset's very instant may come before or after it.
				windows = append(windows, exactcheck.Window{From: r.start.Add(-time.Nanosecond), To: r.endOrNow().Add(time.Nanosecond)})
			}
		}
		if h.pol.conc > 0 {
			as := slices.Clone(h.conc)
			for k := range as {
				if as[k].Exit.IsZero() {
					as[k].Exit = time.Now()
				}
			}
			if v := exactcheck.CheckConcurrencyResets(h.pol.conc, as, windows); v.Excess() > 0 {
				if debug {
					for k, a := range as {
						if !a.Enter.After(v.From) && a.Exit.After(v.From) {
							fmt.Fprintf(os.Stderr, "  decision %d r%d sent %s entered %s exits %s\n", h.concID[k], h.concRep[k], a.Sent.Sub(j.w.start), a.Enter.Sub(j.w.start), a.Exit.Sub(j.w.start))
						}
					}
				}
				j.violate("%s: %d requests in flight at %s, limit %d", id, v.Admitted, v.From.Sub(j.w.start), h.pol.conc)
			}
			continue
		}
		l := h.pol.limit
		l.MinOffset, l.MaxOffset = j.minOff[h.backend], j.maxOff[h.backend]
		if l.Kind == exactcheck.SlidingWindow {
			// A sliding window counts (t - Window, t]: two decisions exactly Window apart, which
			// the fake clock makes common, are never both counted.
			l.Window -= time.Nanosecond
		}
		if h.allowance > 0 {
			l.Limit += h.allowance
			l.Burst += float64(h.allowance)
		}
		var v exactcheck.Violation
		if len(windows) == 0 {
			v = exactcheck.Check(l, h.ds)
		} else {
			spans := exactcheck.Spans(j.w.start, time.Now(), windows, func(time.Time, time.Time) (exactcheck.Limit, bool) { return l, true }, 0)
			v, _ = exactcheck.CheckSpans(spans, h.ds)
		}
		if v.Excess() > 0 {
			if debug {
				for k, d := range h.ds {
					if !d.Start.Before(v.From) && !d.End.After(v.To) {
						fmt.Fprintf(os.Stderr, "  decision %d r%d [%s, %s] cost %d\n", h.ids[k], d.Replica, d.Start.Sub(j.w.start), d.End.Sub(j.w.start), d.Cost)
					}
				}
				for _, w := range windows {
					fmt.Fprintf(os.Stderr, "  window [%s, %s]\n", w.From.Sub(j.w.start), w.To.Sub(j.w.start))
				}
			}
			j.violate("%s: %d admitted in [%s, %s], bound %.1f", id, v.Admitted, v.From.Sub(j.w.start), v.To.Sub(j.w.start), v.Bound)
		}
	}
}

func (j *judge) final() { j.bounds() }

// leases checks that every closed replica's leased units were spent, given back or expired.
func (j *judge) leases() {
	for _, r := range j.w.reps {
		for _, reg := range r.regs {
			units := map[string]float64{}
			held := 0.0
			mfs, err := reg.Gather()
			if err != nil {
				j.violate("r%d: metrics: %v", r.id, err)
				continue
			}
			for _, mf := range mfs {
				switch mf.GetName() {
				case "ratelimit_dynamodb_lease_units_total":
					for _, m := range mf.GetMetric() {
						for _, lp := range m.GetLabel() {
							units[lp.GetValue()] += m.GetCounter().GetValue()
						}
					}
				case "ratelimit_dynamodb_lease_units_held":
					for _, m := range mf.GetMetric() {
						held += m.GetGauge().GetValue()
					}
				}
			}
			if got := units["spent"] + units["refunded"] + units["expired"] + held; got != units["leased"] {
				j.violate("r%d: %.0f units leased, %.0f spent + %.0f refunded + %.0f expired + %.0f held", r.id, units["leased"],
					units["spent"], units["refunded"], units["expired"], held)
			}
		}
	}
}
