// Package replay replays access logs through policies offline.
//
// It answers "what would this configuration have done to that traffic?" offline: it
// reads access logs (nginx/Apache combined, AWS ALB, the gateway's own log.access lines) and runs
// every request through a compiled policy set and a memory store, on a simulated clock taken
// from the log's own timestamps, never the wall clock.
//
// It decides exactly as the gateway does: the same policy.Set plans each line
// (policy.Set.PlanFields: the same matching, overrides and bucket keys as Set.Plan) and the same
// memstore.Store takes the charges, so a line is admitted, limited or shadow-limited for the same
// reasons a request would be. It reports per policy the requests matched, admitted, limited and
// shadow-limited, the peak rate, the keys limited most (as log pseudonyms, never raw values) and
// a time series for plotting (see Plot).
//
// Memory is bounded: the store by store.max_keys, the distinct limited keys by the same number,
// the top keys by a fixed-size summary, the time series by a fixed number of buckets, and the
// lines of one second of a combined log (see Replayer) by that second's traffic.
package replay

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/memstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// Defaults of Options.
const (
	DefaultTop       = 10
	DefaultMaxErrors = 5
	DefaultMaxKeys   = 1_000_000
	// maxLine is the longest line read; a longer one is unparseable.
	maxLine = 1 << 20
)

// Options configure New. Set is required.
type Options struct {
	// Set is the compiled policy set to replay. (Required)
	Set *policy.Set
	// MaxKeys bounds the memory store and the distinct limited keys kept (store.max_keys).
	// (Optional) default 1,000,000.
	MaxKeys int
	// Pseudonyms name limited keys in the report. (Optional) default: a random secret, so the
	// names are stable within this replay only; pass the gateway's (log.pseudonym_secret_env) to
	// get the names its logs use.
	Pseudonyms *policy.Pseudonyms
	// Format of the logs. (Optional) default Auto.
	Format Format
	// KeyFields are the kinds of the extra fields after a combined line's user agent (see
	// ParseKeyFields). (Optional) default none.
	KeyFields []string
	// Top is how many limited keys are reported per policy. (Optional) default 10.
	Top int
	// MaxErrors is how many unparseable lines are reported (all are counted). (Optional)
	// default 5.
	MaxErrors int
	// Progress, when set, is called every few thousand lines with how far the replay has read
	// (see Progress), and by Finish. (Optional) default: none.
	Progress func(Progress)
}

// Replayer replays logs. Feed it with Read, once per log in time order, then call Report. It is
// not safe for concurrent use; its zero value is not usable (see New).
//
// The clock. Each line is decided at its own timestamp; a line older than the latest one seen
// (nginx writes a line when the response ends, so a slow request follows quicker later ones) is
// decided at the latest instead, since the store's clock never runs backwards, and counted as
// out of order. Logs given as several files are read one after the other: give them oldest first.
//
// One-second timestamps. A combined log stamps lines to the second; deciding all of one second's
// requests at the same instant would turn a steady 100/s into a burst of 100 every second,
// and a token bucket with a small burst would reject what the gateway admitted. So the lines of
// one second (consecutive lines with the same timestamp) are spread evenly across it: the k-th
// of n is decided at second + k/n s. Sub-second timestamps (ALB, the gateway) are used as they
// are.
type Replayer struct {
	o       Options
	set     *policy.Set
	store   *memstore.Store
	parser  parser
	rec     record
	plan    policy.Plan
	results []bucket.Result
	ctx     context.Context

	clock   int64 // latest instant decided (unix ns); the simulated clock
	lastRaw int64 // latest raw timestamp read
	started bool

	batch      []record // one second of a combined log, waiting to be spread
	batchSec   int64
	arena      [][]byte // copies of the batch's strings; chunks never move
	arenaChunk int

	releases  releaseHeap // concurrency slots and charge_on refunds due when answers end
	taken     []bucket.Taken
	stats     []policyStats // by policy index
	keyBudget int           // distinct limited keys still allowed in the sets
	series    series

	totals totals
	errs   []LineError
	file   string
	first  int64
	err    error // a store failure; Read returns it
}

// LineError is an unparseable line.
type LineError struct {
	File string `json:"file"`
	Line int64  `json:"line"`
	Err  string `json:"error"`
}

func (e LineError) String() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Err) }

type totals struct {
	lines, requests, unparseable, skipped, outOfOrder int64
	unmatched, admitted, limited                      int64
}

// New returns a Replayer for o.
func New(o Options) (*Replayer, error) {
	if o.Set == nil {
		return nil, errors.New("replay: a policy set is required")
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Pseudonyms == nil {
		o.Pseudonyms = policy.NewPseudonyms(nil)
	}
	if o.Top <= 0 {
		o.Top = DefaultTop
	}
	if o.MaxErrors < 0 {
		o.MaxErrors = 0
	} else if o.MaxErrors == 0 {
		o.MaxErrors = DefaultMaxErrors
	}
	for _, k := range o.KeyFields {
		if !validKind(k) {
			return nil, fmt.Errorf("replay: key field %q: must be api_key, user, header:NAME or empty", k)
		}
	}
	pols := o.Set.Policies()
	r := &Replayer{
		o:         o,
		set:       o.Set,
		store:     memstore.New(memstore.Options{MaxKeys: o.MaxKeys}),
		parser:    parser{format: o.Format, keyFields: o.KeyFields},
		results:   make([]bucket.Result, len(pols)),
		ctx:       context.Background(), // the memory store does no I/O; Read checks its ctx per block
		stats:     make([]policyStats, len(pols)),
		keyBudget: o.MaxKeys,
		series:    newSeries(len(pols)),
	}
	for i := range r.stats {
		r.stats[i].init(pols[i], topCapacity(o.Top))
	}
	return r, nil
}

// Read replays one log; name labels its unparseable lines. A gzip-compressed log (ALB writes
// them, logrotate keeps them) is decompressed. It returns early with ctx's error when ctx ends,
// and with the reader's error when reading fails; unparseable lines are counted, never an error.
func (r *Replayer) Read(ctx context.Context, name string, rd io.Reader) error {
	br := bufio.NewReaderSize(rd, 256<<10)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("replay: %s: %w", name, err)
		}
		defer zr.Close()
		br = bufio.NewReaderSize(zr, 256<<10)
	}
	r.file = name
	var lineNo int64
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Longer than the buffer: gather it up to maxLine, else skip it.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				if len(long) <= maxLine {
					long = append(long, line...)
				}
			}
			if len(long) > maxLine {
				lineNo++
				r.totals.lines++
				r.unparseable(lineNo, fmt.Errorf("line longer than %d bytes", maxLine))
				if err != nil {
					break
				}
				continue
			}
			line = long
		}
		if len(line) > 0 {
			lineNo++
			if lineNo&0xffff == 0 {
				if cerr := ctx.Err(); cerr != nil {
					return cerr
				}
			}
			r.line(lineNo, trimNewline(line))
			if lineNo%progressEvery == 0 {
				r.progress(false)
			}
		}
		if err != nil {
			if err == io.EOF {
				break
			}
			return fmt.Errorf("replay: %s: %w", name, err)
		}
	}
	r.flush()
	return r.err
}

func trimNewline(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		return b[:n-1]
	}
	return b
}

func (r *Replayer) unparseable(lineNo int64, err error) {
	r.totals.unparseable++
	if len(r.errs) < r.o.MaxErrors {
		r.errs = append(r.errs, LineError{File: r.file, Line: lineNo, Err: err.Error()})
	}
}

// line handles one line.
func (r *Replayer) line(lineNo int64, b []byte) {
	r.totals.lines++
	rec := &r.rec
	if err := r.parser.parse(b, rec); err != nil {
		if errors.Is(err, errSkip) {
			r.totals.skipped++
			return
		}
		r.unparseable(lineNo, err)
		return
	}
	r.totals.requests++
	if rec.t < r.lastRaw {
		r.totals.outOfOrder++
	} else {
		r.lastRaw = rec.t
	}
	if !rec.coarse {
		r.flush()
		r.decide(rec, rec.t)
		return
	}
	if len(r.batch) > 0 && rec.t != r.batchSec {
		r.flush()
	}
	r.batchSec = rec.t
	r.keep(rec)
}

// keep appends a copy of rec to the batch, its strings copied into the arena.
func (r *Replayer) keep(rec *record) {
	r.batch = append(r.batch, *rec)
	c := &r.batch[len(r.batch)-1]
	c.f.Method = r.copyString(c.f.Method)
	c.f.Path = r.copyString(c.f.Path)
	c.f.IP = r.copyString(c.f.IP)
	c.f.APIKey = r.copyString(c.f.APIKey)
	c.f.User = r.copyString(c.f.User)
	c.f.Headers = c.headers[:len(rec.f.Headers)]
	for i := range c.f.Headers {
		c.f.Headers[i].Value = r.copyString(c.f.Headers[i].Value)
		c.f.Headers[i].Kind = r.copyString(c.f.Headers[i].Kind)
	}
}

const arenaChunk = 1 << 20

func (r *Replayer) copyString(s string) string {
	if s == "" {
		return ""
	}
	for {
		if r.arenaChunk == len(r.arena) {
			r.arena = append(r.arena, make([]byte, 0, max(arenaChunk, len(s))))
		}
		ch := r.arena[r.arenaChunk]
		switch {
		case len(ch)+len(s) <= cap(ch):
			start := len(ch)
			ch = append(ch, s...)
			r.arena[r.arenaChunk] = ch
			return view(ch[start:])
		case len(ch) == 0:
			// Too small even empty (a huge value): nothing points into it, replace it.
			r.arena[r.arenaChunk] = make([]byte, 0, max(arenaChunk, len(s)))
		default:
			r.arenaChunk++
		}
	}
}

// flush decides the batched lines of one second, spread evenly across it.
func (r *Replayer) flush() {
	n := int64(len(r.batch))
	if n == 0 {
		return
	}
	for k := range r.batch {
		r.decide(&r.batch[k], r.batchSec+int64(k)*int64(time.Second)/n)
	}
	clear(r.batch) // drop the strings' references into the arena
	r.batch = r.batch[:0]
	for i := range r.arena {
		r.arena[i] = r.arena[i][:0]
	}
	r.arenaChunk = 0
}

// decide runs one request through the policies at instant t (unix ns), or at the clock when t
// is older.
func (r *Replayer) decide(rec *record, t int64) {
	if !r.started {
		r.started, r.first, r.clock = true, t, t
		r.series.start = t
	}
	if t > r.clock {
		r.clock = t
	}
	now := r.clock
	r.releaseDue(now)
	r.set.PlanFields(&rec.f, &r.plan)
	charges := r.plan.Charges
	if len(charges) == 0 {
		r.totals.unmatched++
		r.totals.admitted++
		return
	}
	results := r.results[:len(charges)]
	clear(results)
	admitted, err := r.store.Take(r.ctx, time.Unix(0, now), charges, results)
	if err != nil {
		// Memory.Take fails only for a canceled context or too few results; neither happens
		// here, but a broken invariant must not pass for a decision.
		if r.err == nil {
			r.err = fmt.Errorf("replay: memory store: %w", err)
		}
		return
	}
	if admitted {
		r.totals.admitted++
		r.giveBackLater(rec, now, results)
	} else {
		r.totals.limited++
	}
	for i := range charges {
		pol := r.plan.Policies[i]
		ps := &r.stats[pol.Index]
		ps.matched++
		ps.peak.add(now)
		limited := false
		switch {
		case admitted && results[i].Allowed:
			ps.admitted++
		case admitted: // only a shadow charge can fail in an admitted group
			ps.shadowLimited++
			limited = true
		case !charges[i].Shadow && !results[i].Allowed:
			ps.limited++
			limited = true
		default:
			ps.limitedElsewhere++
		}
		r.series.add(now, pol.Index, limited)
		if limited {
			r.limitedKey(ps, rec, i)
		}
	}
}

// limitedKey counts a limited charge against its key.
func (r *Replayer) limitedKey(ps *policyStats, rec *record, i int) {
	k := r.plan.Charges[i].Key
	if _, ok := ps.distinct[k]; !ok {
		if r.keyBudget > 0 {
			ps.distinct[k] = struct{}{}
			r.keyBudget--
		} else {
			ps.distinctCapped = true
		}
	}
	ps.top.add(k, func() string { return r.keyLabel(rec, i) })
}

// keyLabel is how the report names the key of charge i: the pseudonym of its value, as the
// gateway's logs name it, or the value itself when the log held a pseudonym already.
func (r *Replayer) keyLabel(rec *record, i int) string {
	kind := r.plan.Policies[i].KeyKind
	if kind == "global" {
		return "global"
	}
	v := r.plan.KeyValue(i)
	if rec.pseudonymous {
		return kind + ":" + v // KeyValue copied it: no alias of the line
	}
	return kind + ":" + r.o.Pseudonyms.Of(kind, v)
}

// giveBackLater schedules what the gateway gives back when an admitted request's answer ends
// (proxy.Handler.giveBack): every concurrency slot, and the reservation of every charge_on
// policy whose list does not hold the answer's status, unless the upstream did not answer a
// request it got (the gateway keeps those charges): no status (0: the client hung up, as the
// gateway logs it; 499 in nginx's log) or 504 (the upstream's answer did not come in time). The
// answer ends the logged duration after the decision; without a duration in the log, at once.
func (r *Replayer) giveBackLater(rec *record, now int64, results []bucket.Result) {
	unanswered := rec.status == 0 || rec.status == 499 || rec.status == http.StatusGatewayTimeout
	for i, c := range r.plan.Charges {
		if !results[i].Allowed {
			continue
		}
		pol := r.plan.Policies[i]
		if c.Limit.Algorithm != bucket.Concurrency && (pol.ChargeOn == nil || unanswered || pol.ChargeOn.Has(rec.status)) {
			continue
		}
		r.releases.push(release{at: now + rec.duration, taken: bucket.Taken{Charge: c, At: time.Unix(0, now), Token: results[i].Token}})
	}
}

// releaseDue gives back what is due by now, in time order, each at its own instant.
func (r *Replayer) releaseDue(now int64) {
	for len(r.releases) > 0 && r.releases[0].at <= now {
		at := r.releases[0].at
		r.taken = r.taken[:0]
		for len(r.releases) > 0 && r.releases[0].at == at {
			r.taken = append(r.taken, r.releases.pop().taken)
		}
		if err := r.store.Release(r.ctx, time.Unix(0, at), r.taken); err != nil && r.err == nil {
			r.err = fmt.Errorf("replay: memory store release: %w", err)
		}
	}
}

// release is a charge to give back at an instant.
type release struct {
	at    int64
	taken bucket.Taken
}

// releaseHeap is a min-heap of releases by instant.
type releaseHeap []release

func (h *releaseHeap) push(x release) {
	*h = append(*h, x)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if a[p].at <= a[i].at {
			break
		}
		a[p], a[i] = a[i], a[p]
		i = p
	}
}

func (h *releaseHeap) pop() release {
	a := *h
	top := a[0]
	n := len(a) - 1
	a[0] = a[n]
	a = a[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if rr := l + 1; rr < n && a[rr].at < a[l].at {
			m = rr
		}
		if a[i].at <= a[m].at {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
