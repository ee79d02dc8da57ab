package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Release implements bucket.Releaser: concurrency slots are removed from their item (their
// leases are no longer renewed); charge_on refunds take the charge back off the item it was
// written to, whole (a charge of cost N gives back N), with conditions that keep them from ever
// admitting past the limit:
//
//   - fixed window and quota: ADD #count -N on the window or period of the take, IF #count >= N,
//     while that window or period is still the current one;
//   - sliding window: ADD #count -N on the slot of the take, IF #count >= N, while that slot is
//     still counted (a sealed slot's readers have cached the higher count: stricter);
//   - token bucket: SET #tat = #tat - g IF the take's write (its marker, Token) is still in the
//     item's chain of last writes, g being what the writes after it leave exact to give back:
//     all N*T while nothing wrote since, less (or nothing) after writes that found a bucket
//     without the charge idle (see gcraGiveBack).
//
// Every give-back is idempotent and retried until it lands, within ctx and a bound (see
// giveback.go); the calls run concurrently. Charges that cannot be given back exactly stay
// spent (stricter), and a slot whose release fails is reaped once its lease expires. The error
// names the give-backs that failed after every attempt (also counted and logged).
func (s *Store) Release(ctx context.Context, now time.Time, taken []bucket.Taken) error {
	n := now.UnixNano()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i := range taken {
		tk := &taken[i]
		pk, ok := s.releaseItem(tk, n)
		if !ok {
			continue
		}
		if s.deny != nil {
			// A refund moves a count back: this replica's deny cache must not outlive it.
			s.deny.remove(tk.Charge.Key)
		}
		l := tk.Charge.Limit
		if l.Algorithm == bucket.SlidingWindow {
			// Nor its cached count of the refunded slot (read again, or sealed again, next time).
			s.slots.remove(slotKey{tk.Charge.Key, slotOf(l, tk.At.UnixNano())})
		}
		s.turns.GoWG(&wg, func() {
			var done bool
			switch l.Algorithm {
			case bucket.Concurrency:
				done = s.slotGiveBack(ctx, opRelease, pk, tk.Token)
			case bucket.TokenBucket:
				t, _ := bucket.GCRAParams(l)
				done = s.gcraGiveBack(ctx, opRelease, pk, tk.Charge.N()*t, tk.Token)
			default:
				done = s.countGiveBack(ctx, opRelease, pk, tk.Charge.N(), "#count >= :n")
			}
			if !done {
				mu.Lock()
				errs = append(errs, fmt.Errorf("dynamo: release %s: give-back failed", pk))
				mu.Unlock()
			}
		})
	}
	s.turns.Wait(&wg)
	return errors.Join(errs...)
}

// releaseItem is the item whose give-back gives tk back at instant n; ok is false when
// nothing is to be given back (see Release).
func (s *Store) releaseItem(tk *bucket.Taken, n int64) (pk string, ok bool) {
	c, at := tk.Charge, tk.At.UnixNano()
	if leased(c) {
		// Spent from this replica's lease, not written to an item (validate refuses charge_on
		// with leases; this keeps a refund from ever reaching the wrong item).
		return "", false
	}
	key := c.Key.String()
	l := c.Limit
	switch l.Algorithm {
	case bucket.Concurrency:
		if tk.Token == 0 {
			return "", false
		}
		pk = key + "#c"
		s.leases.drop(pk, tk.Token)
		return pk, true
	case bucket.FixedWindow:
		end := fixedEnd(l, at)
		if n >= end {
			return "", false
		}
		return key + "#w" + strconv.FormatInt(end-int64(l.Window), 10), true
	case bucket.Quota:
		if _, end := bucket.QuotaPeriod(at, l); n >= end {
			return "", false
		}
		return quotaItem(key, l, at), true
	case bucket.SlidingWindow:
		slot := slotOf(l, at)
		if n >= leaves(l, slot) {
			return "", false
		}
		return key + "#s" + strconv.FormatInt(slot, 10), true
	case bucket.TokenBucket:
		// Token is the marker of the take's write; the give-back gives back what the chain
		// says is exact (gcraGiveBack), at any later instant.
		return key + "#g", tk.Token != 0
	}
	return "", false // leaky bucket: never refunded
}

// remove forgets k.
func (c *boundedCache[K, V]) remove(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}
