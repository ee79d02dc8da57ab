package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	rpolicy "github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactcheck"
)

// The console's writes while the load and the faults run (issue 32 item 15): resets of every
// policy marked reset, one at a time, each through a replica drawn by the seed; exemptions of
// the policies marked exempt, one at a time, each created through one replica and either left
// to expire or deleted through another. Everything goes through the admin listeners' HTTP API
// with the write token, as an operator's `ratelimit-proxy admin` would (the Host is the
// listener's own 127.0.0.1:PORT, which a listener that checks Host accepts). The judge cuts
// each policy's history at these writes (see windows).

// The console workload's pace.
const (
	resetEvery = 600 * time.Millisecond // one reset of some policy this often
	exemptLife = 3 * time.Second
	// exemptGap: no exemption between two, for more than two windows (fx's 2 s), so that the
	// span after an expiry holds a whole window: an exemption that outlives its expiry
	// over-admits there by the exemption's limit less the policy's.
	exemptGap   = 4500 * time.Millisecond
	exemptFirst = time.Second // the first exemption's creation, after the load starts
	// exemptAfterDelete: the next exemption after one deleted (gone from every replica; an
	// exemption that outlives its expiry shows after an expiry, where exemptGap holds).
	exemptAfterDelete = 500 * time.Millisecond
	exemptDelete      = time.Second           // a deleted exemption lives this long once applied everywhere
	pollEvery         = 20 * time.Millisecond // polling the replicas' lists (processes, with deadlines)
	// applyWithin is how long every replica gets to apply a change of the exemptions (one read
	// period of 1 s, plus faults): past it the exemption's state is unknown, and its whole life
	// is judged by no span.
	applyWithin = 5 * time.Second
	// resetDelayRate of the concurrency items' reset writes wait resetDelay more at the relay.
	resetDelayRate = 0.5
	resetDelay     = 200 * time.Millisecond
	// expiryMargin widens an expiry's window beyond the replicas' clock offsets.
	expiryMargin = 50 * time.Millisecond
)

// resetRec is one reset as the workload saw it.
type resetRec struct {
	Policy   string    `json:"policy"`
	Replica  int       `json:"replica"`
	Sent     time.Time `json:"-"`
	Answered time.Time `json:"-"`
	Status   int       `json:"status"` // 0: no answer
}

// exemptRec is one exemption's life as the workload saw it.
type exemptRec struct {
	Policy     string
	ID         string
	Created    int // the create's status
	CreateSent time.Time
	LiveFrom   time.Time // every replica lists it from here (zero: unknown)
	ExpiresAt  time.Time
	Deleted    int // the delete's status; 0: not deleted
	DeleteSent time.Time
	GoneAt     time.Time // no replica applies it from here (zero: unknown)
	Outcome    string    // expired, ended (expiring after the load), deleted, failed
}

// consoleLog is what the workload did, and (DynamoDB) every reset write the relay forwarded.
type consoleLog struct {
	mu       sync.Mutex
	resets   []resetRec
	exempts  []*exemptRec
	landings []ddbrelay.Write
}

// The bodies of the writes that empty an item for a reset (internal/dynamo/console.go): a bucket's
// tat, a counter's count, a concurrency item's count and slots (removed all at once, or, since
// issue 32 item 1, in writes that each take their own slots off the count while they are all
// there: attribute_exists, where a release names its one slot #l and a reap conditions on the
// slots' expiries). The self-test's reset mutants send a concurrency item's reset write as
// "ADD #count :minus" alone (reset-leaves-slots: no slot removed) or without its condition
// (reset-reads-then-writes-unconditionally); those land as resets too, or the judge could not
// cut the history where they land. The run fails when a reset answered 200 without one of these
// landing within it: then this list is stale.
var (
	resetWrite     = regexp.MustCompile(`"UpdateExpression":"(REMOVE #tat|REMOVE #count|SET #count = :zero|ADD #count :minus")`)
	slotResetWrite = regexp.MustCompile(`"UpdateExpression":"ADD #count :minus REMOVE #l0[,"]`)
	slotResetCond  = regexp.MustCompile(`attribute_exists\(#l0\)`)
	// concurrencyReset matches a concurrency item's reset write in every form above (the
	// relay's targeted delay: Item #c$ leaves the other items out). A reap's write has the
	// reset's shape and differs in its condition only, which a pattern cannot exclude: a reap
	// may be delayed too, one more race for the store to survive.
	concurrencyReset = regexp.MustCompile(`"UpdateExpression":"(REMOVE #count|ADD #count :minus("| REMOVE #l0[,"]))`)
)

// isResetWrite reports whether body is a reset's write: a slot-removing write is one when it
// is conditioned on its slots' existence or on nothing (a reap conditions on their expiries).
func isResetWrite(body []byte) bool {
	if resetWrite.Match(body) {
		return true
	}
	return slotResetWrite.Match(body) && (slotResetCond.Match(body) || !bytes.Contains(body, []byte(`"ConditionExpression"`)))
}

// watch is the relay's Options.Watch: it keeps the reset writes.
func (cl *consoleLog) watch(w ddbrelay.Write) {
	if !isResetWrite(w.Body) {
		return
	}
	w.Body = nil
	cl.mu.Lock()
	cl.landings = append(cl.landings, w)
	cl.mu.Unlock()
}

// console drives the console's writes until ctx ends.
type console struct {
	reps  []*replica
	ps    []policy
	token string
	seed  uint64
	rng   *rand.Rand // the resets' (exemptions draws from its own)
	log   *consoleLog
	// minOff and maxOff bound the replicas' clock offsets (an expiry's window).
	minOff, maxOff time.Duration
	// storeTimeout is the replicas' store.timeout: the longest a read of the exemptions that
	// began before a delete may take to answer (and put the deleted one back).
	storeTimeout time.Duration
	// memory: the memory store's run, which begins with an exemption deleted (applied at once,
	// so the next one, left to expire, expires within a short run's load).
	memory bool
	client *http.Client
}

func (c *console) replica(rng *rand.Rand) *replica {
	return c.reps[rng.IntN(len(c.reps))]
}

func (c *console) run(ctx context.Context) {
	var wg sync.WaitGroup
	var resets []policy
	for _, p := range c.ps {
		if p.reset {
			resets = append(resets, p)
		}
		if p.exempt {
			wg.Add(1)
			go func() { defer wg.Done(); c.exemptions(ctx, p) }()
		}
	}
	if len(resets) > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); c.resets(ctx, resets) }()
	}
	wg.Wait()
}

// resets resets the policies in turn, one at a time (so that each reset write the relay sees
// belongs to the one reset in flight).
func (c *console) resets(ctx context.Context, ps []policy) {
	t := time.NewTicker(resetEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p := ps[i%len(ps)]
		r := c.replica(c.rng)
		rec := resetRec{Policy: p.name, Replica: r.i, Sent: time.Now()}
		rec.Status, _ = c.call(context.WithoutCancel(ctx), r, http.MethodPost, "/v1/keys/"+p.name+"/reset", map[string]any{"reason": "check-exact"})
		rec.Answered = time.Now()
		c.log.mu.Lock()
		c.log.resets = append(c.log.resets, rec)
		c.log.mu.Unlock()
	}
}

// exemptions gives p's key one exemption after another until ctx ends: every other one is
// deleted once every replica applies it, the others expire (which comes first follows the
// seed's parity, so that consecutive runs, whose seeds follow each other, see both; the memory
// store's run begins with one deleted).
func (c *console) exemptions(ctx context.Context, p policy) {
	rng := rand.New(rand.NewPCG(c.seed, 3)) // the resets draw from c.rng meanwhile
	first := int(c.seed % 2)
	if c.memory {
		first = 1
	}
	gap := exemptFirst
	for i := first; ; i++ {
		if !sleep(ctx, gap) {
			return
		}
		e := &exemptRec{Policy: p.name, CreateSent: time.Now()}
		e.ExpiresAt = e.CreateSent.Add(exemptLife)
		status, body := c.call(ctx, c.replica(rng), http.MethodPost, "/v1/exemptions", map[string]any{
			"policy": p.name, "limit": map[string]any{"limit": exemptLimit}, "expires_at": e.ExpiresAt, "reason": "check-exact"})
		e.Created = status
		var created struct{ ID string }
		_ = json.Unmarshal(body, &created)
		e.ID = created.ID
		c.log.mu.Lock()
		c.log.exempts = append(c.log.exempts, e)
		c.log.mu.Unlock()
		if status != http.StatusCreated || e.ID == "" {
			e.Outcome = "failed"
			sleep(ctx, time.Until(e.ExpiresAt)) // it may have been stored: none other until its expiry
			gap = exemptGap
			i-- // the next one takes this one's turn: a failed create must not skip the delete
			continue
		}
		if at, ok := c.pollAll(ctx, e.ID, true, time.Now().Add(applyWithin)); ok {
			e.LiveFrom = at
		}
		if i%2 == 1 && !e.LiveFrom.IsZero() && time.Until(e.ExpiresAt) > exemptDelete+500*time.Millisecond {
			sleep(ctx, exemptDelete)
			r := c.replica(rng)
			e.DeleteSent = time.Now()
			e.Deleted, _ = c.call(context.WithoutCancel(ctx), r, http.MethodDelete, "/v1/exemptions/"+e.ID, nil)
			answered := time.Now()
			if e.Deleted == http.StatusOK {
				if at, ok := c.pollAll(context.WithoutCancel(ctx), e.ID, false, answered.Add(applyWithin)); ok {
					// A replica's read of the exemptions that began before the delete landed may
					// put it back when it answers: within the console's store timeout.
					e.GoneAt = maxTime(at, answered.Add(c.storeTimeout))
					e.Outcome = "deleted"
				}
			}
			if e.Outcome == "" {
				e.Outcome = "failed"
			}
		}
		if e.Outcome == "deleted" {
			gap = exemptAfterDelete
			continue
		}
		gap = exemptGap
		// Expired once every replica's clock is past its expiry; "ended": the load ended first.
		ok := sleep(ctx, time.Until(e.ExpiresAt.Add(-c.minOff+expiryMargin)))
		if e.Outcome == "" {
			e.Outcome = "expired"
			if !ok {
				e.Outcome = "ended"
			}
		}
		if !ok {
			return
		}
	}
}

// pollAll polls every replica's GET /v1/exemptions until each lists id (present) or none does
// (!present), and returns the latest answer that showed it so, or false at the deadline.
func (c *console) pollAll(ctx context.Context, id string, present bool, deadline time.Time) (time.Time, bool) {
	var last time.Time
	for _, r := range c.reps {
		for {
			status, body := c.call(ctx, r, http.MethodGet, "/v1/exemptions", nil)
			at := time.Now()
			if status == http.StatusOK && bytes.Contains(body, []byte(`"`+id+`"`)) == present {
				last = maxTime(last, at)
				break
			}
			if at.After(deadline) || !sleep(ctx, pollEvery) {
				return time.Time{}, false
			}
		}
	}
	return last, true
}

// call sends one admin request to r and returns its status (0: no answer) and body.
func (c *console) call(ctx context.Context, r *replica, method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+r.admin+path, rd)
	if err != nil {
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, b
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// consoleStats is what the console workload did in a run (and over all runs in exact.json).
type consoleStats struct {
	Resets             int `json:"resets"`
	ResetsFailed       int `json:"resets_failed"`
	ResetWrites        int `json:"reset_writes_landed"`
	ExemptionsCreated  int `json:"exemptions_created"`
	ExemptionsExpired  int `json:"exemptions_expired"`
	ExemptionsDeleted  int `json:"exemptions_deleted"`
	ExemptionsFailed   int `json:"exemptions_failed"`
	DecisionsJudged    int `json:"decisions_judged"`
	DecisionsInWindows int `json:"decisions_in_windows"` // admitted, but inside a window: judged by no span
}

func (s *consoleStats) add(o consoleStats) {
	s.Resets += o.Resets
	s.ResetsFailed += o.ResetsFailed
	s.ResetWrites += o.ResetWrites
	s.ExemptionsCreated += o.ExemptionsCreated
	s.ExemptionsExpired += o.ExemptionsExpired
	s.ExemptionsDeleted += o.ExemptionsDeleted
	s.ExemptionsFailed += o.ExemptionsFailed
	s.DecisionsJudged += o.DecisionsJudged
	s.DecisionsInWindows += o.DecisionsInWindows
}

// bounds is what the judge needs of the console's writes, per policy: the windows where the
// bound may have changed, and the limit in force between them.
type bounds struct {
	windows map[string][]exactcheck.Window
	// all are windows of every policy (the memory store's restart: every key full again).
	all []exactcheck.Window
	// live are the exemptions' live stretches, per policy: their limit applies inside.
	live map[string][]exactcheck.Window
}

// windowsOf is the policy's windows, all included.
func (b *bounds) windowsOf(policy string) []exactcheck.Window {
	return append(append([]exactcheck.Window(nil), b.windows[policy]...), b.all...)
}

// limitAt returns the limit of a piece of policy p's history between windows: an exemption's
// when the piece lies in one's live stretch, else the policy's.
func (b *bounds) limitAt(p policy, l exactcheck.Limit) func(from, to time.Time) (exactcheck.Limit, bool) {
	return func(from, to time.Time) (exactcheck.Limit, bool) {
		for _, w := range b.live[p.name] {
			if !from.Before(w.From) && !to.After(w.To) {
				el := l
				el.Limit = exemptLimit
				return el, true
			}
		}
		return l, true
	}
}

// consoleBounds turns the console log into the judge's bounds. memory: resets landed inside
// their own calls (the store is in the process); else the relay's landings of reset writes say
// where, each the reset of the policy whose key digest its item carries (digests: digest ->
// policy; a landing of another digest counts for every policy reset). It fails when a reset
// answered 200 while no reset write of its policy landed within it (resetWrite no longer
// recognises the store's reset writes: the judge would miss them).
func consoleBounds(cl *consoleLog, memory bool, digests map[string]string, minOff, maxOff time.Duration) (*bounds, consoleStats, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	b := &bounds{windows: map[string][]exactcheck.Window{}, live: map[string][]exactcheck.Window{}}
	var st consoleStats
	resetPolicies := map[string]bool{}
	for _, r := range cl.resets {
		resetPolicies[r.Policy] = true
	}
	owners := func(w ddbrelay.Write) map[string]bool {
		out := map[string]bool{}
		for _, it := range w.Items {
			if p, ok := digests[digestOf(it.Key)]; ok {
				out[p] = true
			}
		}
		if len(out) == 0 {
			return resetPolicies // whose it is is unknown: it may have reset any of them
		}
		return out
	}
	for _, r := range cl.resets {
		st.Resets++
		if r.Status != http.StatusOK {
			st.ResetsFailed++
		}
		if memory {
			b.windows[r.Policy] = append(b.windows[r.Policy], exactcheck.Window{From: r.Sent, To: r.Answered})
			continue
		}
		found := false
		for _, w := range cl.landings {
			found = found || (!w.Sent.Before(r.Sent) && !w.Answered.After(r.Answered) && owners(w)[r.Policy])
		}
		if r.Status == http.StatusOK && !found {
			return nil, st, fmt.Errorf("a reset of policy %s answered 200 with no reset write of its landing within it: resetWrite (console.go) no longer matches the store's reset writes", r.Policy)
		}
	}
	for _, w := range cl.landings {
		st.ResetWrites++
		for p := range owners(w) {
			b.windows[p] = append(b.windows[p], exactcheck.Window{From: w.Sent, To: w.Answered})
		}
	}
	for _, e := range cl.exempts {
		// Expiry lands on each replica when its own clock reaches ExpiresAt.
		expiry := exactcheck.Window{From: e.ExpiresAt.Add(-maxOff - expiryMargin), To: e.ExpiresAt.Add(-minOff + expiryMargin)}
		switch {
		case e.Created == http.StatusCreated:
			st.ExemptionsCreated++
		}
		switch {
		case (e.Outcome == "expired" || e.Outcome == "ended") && !e.LiveFrom.IsZero():
			if e.Outcome == "expired" {
				st.ExemptionsExpired++ // "ended" expired after the load: nothing judged it
			}
			b.windows[e.Policy] = append(b.windows[e.Policy], exactcheck.Window{From: e.CreateSent, To: e.LiveFrom}, expiry)
			b.live[e.Policy] = append(b.live[e.Policy], exactcheck.Window{From: e.LiveFrom, To: expiry.From})
		case e.Outcome == "deleted":
			st.ExemptionsDeleted++
			b.windows[e.Policy] = append(b.windows[e.Policy], exactcheck.Window{From: e.CreateSent, To: e.LiveFrom}, exactcheck.Window{From: e.DeleteSent, To: e.GoneAt})
			b.live[e.Policy] = append(b.live[e.Policy], exactcheck.Window{From: e.LiveFrom, To: e.DeleteSent})
		default: // failed, or never seen everywhere: in force or not, anywhere in its life
			st.ExemptionsFailed++
			b.windows[e.Policy] = append(b.windows[e.Policy], exactcheck.Window{From: e.CreateSent, To: expiry.To})
		}
	}
	return b, st, nil
}

// digestOf is the key digest of an item's key (internal/dynamo: the digest, then '#' and the
// item's kind).
func digestOf(pk string) string {
	d, _, _ := strings.Cut(pk, "#")
	return d
}

// keyDigests are the key digests of the policies ps as the replicas compute them, from one
// replica's configuration file (a global key's digest: what its items' keys begin with).
func keyDigests(cfgPath string, ps []policy, getenv func(string) string) (map[string]string, error) {
	cfg, err := rpolicy.Load(cfgPath, rpolicy.LoadOptions{Getenv: getenv})
	if err != nil {
		return nil, err
	}
	set, err := rpolicy.Compile(cfg, rpolicy.CompileOptions{Getenv: getenv})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range ps {
		c, _, _, err := set.KeyCharge(p.name, "")
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", p.name, err)
		}
		out[c.Key.String()] = p.name
	}
	return out, nil
}
