package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

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
// Refunds are sent once (not idempotent); a slot release may be retried (it only removes its
// own slot). The calls run concurrently within ctx. Charges that cannot be given back stay
// spent (stricter), and a slot whose release fails is reaped once its lease expires.
func (s *Store) Release(ctx context.Context, now time.Time, taken []bucket.Taken) error {
	n := now.UnixNano()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i := range taken {
		tk := &taken[i]
		pk, u, retry, ok := s.releaseWrite(tk, n)
		if !ok {
			continue
		}
		gcra := tk.Charge.Limit.Algorithm == bucket.TokenBucket
		if s.deny != nil {
			// A refund moves a count back: this replica's deny cache must not outlive it.
			s.deny.remove(tk.Charge.Key)
		}
		if l := tk.Charge.Limit; l.Algorithm == bucket.SlidingWindow {
			// Nor its cached count of the refunded slot (read again, or sealed again, next time).
			s.slots.remove(slotKey{tk.Charge.Key, slotOf(l, tk.At.UnixNano())})
		}
		wg.Go(func() {
			var opts []func(*dynamodb.Options)
			if !retry {
				opts = append(opts, noRetry)
			}
			var err error
			if gcra {
				t, _ := bucket.GCRAParams(tk.Charge.Limit)
				_, err = s.gcraGiveBack(ctx, opRelease, pk, tk.Charge.N()*t, tk.Token, opts...)
			} else {
				_, err = s.updateItem(ctx, opRelease, pk, u, types.ReturnValueNone, opts...)
			}
			var ccf *types.ConditionalCheckFailedException
			if err != nil && !errors.As(err, &ccf) {
				// A failed condition is a charge already given back (its slot reaped, its
				// window or epoch gone): nothing to do.
				s.m.errors.WithLabelValues(opRelease).Inc()
				mu.Lock()
				errs = append(errs, fmt.Errorf("dynamo: release %s: %w", pk, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// releaseWrite is the write that gives tk back at instant n, and whether the SDK may retry it;
// ok is false when nothing is to be written (see Release).
func (s *Store) releaseWrite(tk *bucket.Taken, n int64) (pk string, u update, retry, ok bool) {
	c, at := tk.Charge, tk.At.UnixNano()
	if leased(c) {
		// Spent from this replica's lease, not written to an item (validate refuses charge_on
		// with leases; this keeps a refund from ever reaching the wrong item).
		return "", update{}, false, false
	}
	key := c.Key.String()
	l := c.Limit
	switch l.Algorithm {
	case bucket.Concurrency:
		if tk.Token == 0 {
			return "", update{}, false, false
		}
		pk = key + "#c"
		s.leases.drop(pk, tk.Token)
		return pk, slotRelease(tk.Token), true, true
	case bucket.FixedWindow:
		end := fixedEnd(l, at)
		if n >= end {
			return "", update{}, false, false
		}
		return key + "#w" + strconv.FormatInt(end-int64(l.Window), 10), countRefund(c.N()), false, true
	case bucket.Quota:
		if _, end := bucket.QuotaPeriod(at, l); n >= end {
			return "", update{}, false, false
		}
		return quotaItem(key, l, at), countRefund(c.N()), false, true
	case bucket.SlidingWindow:
		slot := slotOf(l, at)
		if n >= leaves(l, slot) {
			return "", update{}, false, false
		}
		return key + "#s" + strconv.FormatInt(slot, 10), countRefund(c.N()), false, true
	case bucket.TokenBucket:
		if tk.Token == 0 {
			return "", update{}, false, false
		}
		// Token is the marker of the take's write; Release gives back what the chain says is
		// exact (gcraGiveBack), at any later instant.
		return key + "#g", update{}, false, true
	}
	return "", update{}, false, false // leaky bucket: never refunded
}

// remove forgets k.
func (c *boundedCache[K, V]) remove(k K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}

// countRefund takes n requests off a window's, slot's or period's count, never below zero.
func countRefund(n int64) update {
	return update{
		expr:   "ADD #count :minus",
		cond:   "#count >= :n",
		names:  map[string]string{"#count": attrCount},
		values: map[string]types.AttributeValue{":minus": num(-n), ":n": num(n)},
	}
}
