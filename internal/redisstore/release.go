package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Release implements bucket.Releaser: a concurrency slot is removed from its key's set; a
// fixed window's, quota's or sliding window's charge is subtracted while its window, period or
// slot still counts it and the key is the generation it was counted in (a reset makes a new
// one); a token bucket's charge is given back only while the bucket's marker is still the one its
// write left, i.e. nothing wrote since (see bucket.GCRAGiveBackN), and the give-back leaves its own
// marker, so a second copy of it finds its own marker and changes nothing. Leaky-bucket charges
// are never given back. A give-back is sent once: one whose answer is lost may or may not have
// landed, and is not re-sent (a counter's would subtract twice): stricter.
func (s *Store) Release(ctx context.Context, _ time.Time, taken []bucket.Taken) error {
	return s.give(ctx, taken, false)
}

// give gives taken back; refused says they are the committed parts of a refused group, whose
// leaky-bucket charges are given back too (their requests were never served).
func (s *Store) give(ctx context.Context, taken []bucket.Taken, refused bool) error {
	if ctx.Err() != nil || !hasTime(ctx) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	type entry struct {
		key  string
		args []string
	}
	bySlot := map[uint16][]entry{}
	var order []uint16
	for i := range taken {
		tk := &taken[i]
		c := &tk.Charge
		l := &c.Limit
		n := strconv.FormatInt(c.N(), 10)
		tok := strconv.FormatUint(tk.Token, 10)
		var e entry
		switch l.Algorithm {
		case bucket.Concurrency:
			s.mu.Lock()
			delete(s.held, tk.Token)
			s.mu.Unlock()
			e.args = []string{algConcurrency, n, tok, "", ""}
		case bucket.TokenBucket, bucket.LeakyBucket:
			if l.Algorithm == bucket.LeakyBucket && !refused {
				continue
			}
			t, _ := bucket.GCRAParams(*l)
			e.args = []string{algToken, n, strconv.FormatInt(spend(t, c.N()), 10), tok, strconv.FormatUint(s.marker(), 10)}
		case bucket.FixedWindow, bucket.Quota:
			at := tk.At.UnixNano()
			var end int64
			alg := algFixed
			if l.Algorithm == bucket.Quota {
				_, end = bucket.QuotaPeriod(at, *l)
				alg = algQuota
			} else {
				w := span(l.Window)
				end = floorDiv(at, w)*w + w
			}
			e.args = []string{alg, n, strconv.FormatInt(end, 10), tok, ""}
		case bucket.SlidingWindow:
			w := bucket.SlidingWidth(*l)
			e.args = []string{algSliding, n, strconv.FormatInt(w, 10), strconv.FormatInt(floorDiv(tk.At.UnixNano(), w), 10), tok}
		default:
			continue
		}
		if tk.Token == 0 {
			continue // not committed: nothing to give back
		}
		e.key = s.key(c)
		sl := uint16(0)
		if s.cluster {
			sl = Slot(c.Key.String())
		}
		if _, ok := bySlot[sl]; !ok {
			order = append(order, sl)
		}
		bySlot[sl] = append(bySlot[sl], e)
	}
	var errs []error
	for _, sl := range order {
		es := bySlot[sl]
		keys := make([]string, 0, len(es))
		args := []string{strconv.Itoa(len(es))}
		for _, e := range es {
			keys = append(keys, e.key)
			args = append(args, e.args...)
		}
		if _, err := s.exec(ctx, giveScript, keys, args); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisstore: give back: %w", err)
	}
	return nil
}

// hasTime reports whether ctx has a deadline far enough away for a round trip.
func hasTime(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > 5*time.Millisecond
}

// heldSlot is a concurrency slot held here: its id and its key.
type heldSlot struct {
	id  uint64
	key string
}

// renew extends the leases of the concurrency slots held here every SlotLease/3, until Close.
func (s *Store) renew() {
	defer close(s.done)
	t := time.NewTicker(s.slotLease / 3)
	defer t.Stop()
	for {
		k := s.turns.Park()
		select {
		case <-s.stop:
			s.turns.Resume(k)
			return
		case <-t.C:
		}
		s.turns.Resume(k)
		s.mu.Lock()
		held := make([]heldSlot, 0, len(s.held))
		for id, k := range s.held {
			held = append(held, heldSlot{id, k})
		}
		s.mu.Unlock()
		// In id order, not the map's: a seed of the simulator repeats its renewals.
		slices.SortFunc(held, func(a, b heldSlot) int { return cmp.Compare(a.id, b.id) })
		c, err := s.client()
		if len(held) == 0 || err != nil {
			continue
		}
		exp := float64(s.now().Add(s.slotLease).UnixMilli())
		ttl := s.slotLease + time.Duration(s.slackMs)*time.Millisecond
		cmds := make([]rueidisCompleted, 0, 2*len(held))
		for _, h := range held {
			cmds = append(cmds,
				c.B().Zadd().Key(h.key).Xx().ScoreMember().ScoreMember(exp, strconv.FormatUint(h.id, 10)).Build(),
				c.B().Pexpire().Key(h.key).Milliseconds(ttl.Milliseconds()).Build())
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.slotLease/3)
		for _, r := range c.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				s.log.Warn("redis: renewing concurrency slots failed; they expire one slot lease after their last renewal", zap.Error(err))
				break
			}
		}
		cancel()
	}
}
