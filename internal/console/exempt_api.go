package console

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// maxExemption bounds an exemption's life: an exemption is for a launch or an incident, not a
// lasting limit (that belongs in the file, as an override).
const maxExemption = 90 * 24 * time.Hour

// DefaultMaxExemptions is admin.max_exemptions' default: the live exemptions a store holds.
const DefaultMaxExemptions = 1000

// MaxReason bounds a write's reason, in bytes: it is stored with an exemption, which every
// replica reads, and written in audit lines.
const MaxReason = 1024

// checkReason answers 400 for a reason past MaxReason, reporting whether it is within it.
func checkReason(w http.ResponseWriter, reason string) bool {
	if len(reason) > MaxReason {
		writeProblem(w, http.StatusBadRequest, "bad-reason", fmt.Sprintf("reason: %d bytes: must be at most %d bytes.", len(reason), MaxReason))
		return false
	}
	return true
}

// tooMany answers 409: the store holds admin.max_exemptions live exemptions.
func (c *Console) tooMany(w http.ResponseWriter) {
	writeProblem(w, http.StatusConflict, "too-many-exemptions", fmt.Sprintf(
		"%d live exemptions are held, admin.max_exemptions: delete one (DELETE /v1/exemptions/{id}) or wait for one to expire.", c.o.MaxExemptions))
}

func (c *Console) postExemption(w http.ResponseWriter, r *http.Request) {
	var b writeBody
	if !decodeBody(w, r, &b) || !checkReason(w, b.Reason) {
		return
	}
	if b.Policy == "" {
		writeProblem(w, http.StatusBadRequest, "bad-exemption", "policy is missing.")
		return
	}
	t, status, detail := c.resolveAny(b.Policy, b.Key, b.Pseudonym, b.Domain, b.Entries)
	if status != 0 {
		writeProblem(w, status, "bad-key", detail)
		return
	}
	now := c.o.Now()
	e := &Exemption{ID: newID(), Policy: t.pol.Name, Key: t.label, Unlimited: b.Unlimited, Reason: b.Reason,
		CreatedBy: c.o.WriteTokenName, CreatedAt: now.UTC(), BucketKey: t.charge.Key}
	switch {
	case b.Unlimited && b.Limit != nil:
		writeProblem(w, http.StatusBadRequest, "bad-exemption", "Give limit or unlimited, not both.")
		return
	case !b.Unlimited && b.Limit == nil:
		writeProblem(w, http.StatusBadRequest, "bad-exemption", `Give limit (e.g. {"rate": "20/s", "burst": 40} or {"limit": 200}) or "unlimited": true.`)
		return
	case b.Limit != nil:
		var win time.Duration
		if b.Limit.Window != "" {
			d, err := time.ParseDuration(b.Limit.Window)
			if err != nil {
				writeProblem(w, http.StatusBadRequest, "bad-exemption", fmt.Sprintf("limit.window %q: not a duration (e.g. 1m).", b.Limit.Window))
				return
			}
			win = d
		}
		lim, err := t.pol.ReplacementLimit(b.Limit.Rate, b.Limit.Burst, b.Limit.Limit, win)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "bad-exemption", err.Error())
			return
		}
		e.Limit, e.BucketLimit = b.Limit, lim
	}
	switch {
	case b.ExpiresIn != "" && b.ExpiresAt != nil:
		writeProblem(w, http.StatusBadRequest, "bad-exemption", "Give expires_in or expires_at, not both.")
		return
	case b.ExpiresIn != "":
		d, err := time.ParseDuration(b.ExpiresIn)
		if err != nil || d <= 0 {
			writeProblem(w, http.StatusBadRequest, "bad-exemption", fmt.Sprintf("expires_in %q: must be a positive duration (e.g. 2h).", b.ExpiresIn))
			return
		}
		e.ExpiresAt = now.Add(d).UTC()
	case b.ExpiresAt != nil:
		e.ExpiresAt = b.ExpiresAt.UTC()
	default:
		writeProblem(w, http.StatusBadRequest, "bad-exemption", "Give expires_in (e.g. 2h) or expires_at (RFC 3339): an exemption always ends.")
		return
	}
	if !e.ExpiresAt.After(now) || e.ExpiresAt.Sub(now) > maxExemption {
		writeProblem(w, http.StatusBadRequest, "bad-exemption", fmt.Sprintf("expires_at %s: must be in the future and within %s.", e.ExpiresAt.Format(time.RFC3339), maxExemption))
		return
	}
	if c.o.Shared != nil {
		data, err := json.Marshal(sharedOf(e))
		stored := false
		if err == nil {
			ctx, cancel := context.WithTimeout(r.Context(), c.o.StoreTimeout)
			stored, err = c.o.Shared.PutExemption(ctx, e.ID, data, e.ExpiresAt, c.o.MaxExemptions)
			cancel()
		}
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "store-error", "The exemption could not be stored: "+err.Error())
			return
		}
		if !stored {
			c.tooMany(w)
			return
		}
		c.ex.put(now, e)
	} else if !c.ex.add(now, e, c.o.MaxExemptions) {
		c.tooMany(w)
		return
	}
	c.audit(actionExempt, zap.String("id", e.ID), zap.String("policy", e.Policy), zap.String("key", e.Key),
		zap.Time("expires_at", e.ExpiresAt), zap.Bool("unlimited", e.Unlimited), zap.String("reason", e.Reason))
	writeJSON(w, http.StatusCreated, e)
}

func (c *Console) getExemptions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"exemptions": c.ex.list(c.o.Now())})
}

func (c *Console) deleteExemption(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	now := c.o.Now()
	found := false
	if c.o.Shared != nil {
		ctx, cancel := context.WithTimeout(r.Context(), c.o.StoreTimeout)
		var err error
		found, err = c.o.Shared.DeleteExemption(ctx, id)
		cancel()
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "store-error", "The exemption could not be removed: "+err.Error())
			return
		}
	}
	e, ok := c.ex.remove(now, id)
	if c.o.Shared != nil {
		ok = found // the store's word: this replica's copy may lag a second behind it
	}
	if !ok {
		writeProblem(w, http.StatusNotFound, "bad-exemption", fmt.Sprintf("No active exemption %q; GET /v1/exemptions lists them.", id))
		return
	}
	fields := []zap.Field{zap.String("id", id)}
	if e != nil {
		fields = append(fields, zap.String("policy", e.Policy), zap.String("key", e.Key))
	}
	c.audit(actionUnexempt, fields...)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "deleted": true})
}

// sharedExemption is an exemption as stored for the other replicas: with its bucket key (a
// digest), which the API does not show. Each replica compiles the limit from its own policy set.
type sharedExemption struct {
	Exemption
	BucketKeyHex string `json:"bucket_key"`
}

func sharedOf(e *Exemption) sharedExemption {
	return sharedExemption{Exemption: *e, BucketKeyHex: e.BucketKey.String()}
}

// syncPeriod is how often a replica reads the shared exemptions: an exemption made on another
// replica applies here within it (plus the store's answer).
const syncPeriod = time.Second

// Run reads the shared exemptions every second until ctx ends (a no-op without Options.Shared).
func (c *Console) Run(ctx context.Context) {
	if c.o.Shared == nil {
		return
	}
	t := time.NewTicker(syncPeriod)
	defer t.Stop()
	var fails syncFailures
	for {
		err := c.Sync(ctx)
		if ctx.Err() != nil {
			return
		}
		fails.note(c.o.Logger, c.o.Now(), err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// syncFailLogEvery bounds the log of a sync that keeps failing (a missing table, no rights):
// its first failure is logged at once, then at most one line per this period.
const syncFailLogEvery = time.Minute

// syncFailures logs a failing sync once, then at most once a syncFailLogEvery with the count of
// failures since, and its recovery once.
type syncFailures struct {
	failing    bool
	lastLogged time.Time
	since      int // failures not logged
}

func (f *syncFailures) note(log *zap.Logger, now time.Time, err error) {
	switch {
	case err == nil && f.failing:
		log.Info("admin: reading the shared exemptions works again")
		*f = syncFailures{}
	case err == nil:
	case !f.failing || now.Sub(f.lastLogged) >= syncFailLogEvery:
		fields := []zap.Field{zap.Error(err)}
		if f.failing {
			fields = append(fields, zap.Int("failures_since_last_line", f.since+1))
		}
		log.Warn("admin: reading the shared exemptions failed; retried every second, logged at most once a minute", fields...)
		f.failing, f.lastLogged, f.since = true, now, 0
	default:
		f.since++
	}
}

// Sync replaces this replica's exemptions by the shared ones. An exemption whose policy is gone
// or whose limit no longer fits the policy is skipped.
func (c *Console) Sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.o.StoreTimeout)
	defer cancel()
	raw, err := c.o.Shared.Exemptions(ctx)
	if err != nil {
		return err
	}
	set := c.o.Policies()
	es := make([]*Exemption, 0, len(raw))
	for _, data := range raw {
		var se sharedExemption
		if json.Unmarshal(data, &se) != nil {
			continue
		}
		e := se.Exemption
		kb, err := hex.DecodeString(se.BucketKeyHex)
		if err != nil || len(kb) != len(e.BucketKey) {
			continue
		}
		copy(e.BucketKey[:], kb)
		pol := set.Policy(e.Policy)
		if pol == nil { // an rls rule's exemption, named by the rule's label
			if _, r := set.RLS().RuleByLabel(e.Policy); r != nil {
				pol = rlsPolicy(r)
			}
		}
		if pol == nil {
			continue
		}
		if e.Limit != nil {
			var win time.Duration
			if e.Limit.Window != "" {
				win, _ = time.ParseDuration(e.Limit.Window)
			}
			if e.BucketLimit, err = pol.ReplacementLimit(e.Limit.Rate, e.Limit.Burst, e.Limit.Limit, win); err != nil {
				continue
			}
		}
		es = append(es, &e)
	}
	c.ex.replace(c.o.Now(), es)
	return nil
}
