package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// The conditional writes of a charge: GCRA (token and leaky bucket) and counters (fixed and
// sliding window), and what their outcome says.

// write returns the charge's conditional write in its current form; a GCRA write leaves the
// marker wid.
func (o *op) write(n int64, wid uint64) update {
	l := o.c.Limit
	switch c := o.c.N(); l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return gcraWrite(n, o.t, o.tau, c, o.formB, wid)
	case bucket.FixedWindow, bucket.Quota:
		return countWrite(l.Count, c, schema.TTLAt(fixedEnd(l, n)), false)
	default: // SlidingWindow
		return countWrite(l.Count-o.counts.closed(), c, schema.TTLAt(leaves(l, o.cur)), true)
	}
}

// gcraWrite spends m requests (m*T of slack: m charges, or one of cost m) from a GCRA bucket at
// instant n. Form (a), for an idle bucket (tat absent or < n), sets tat = n + m*T and needs
// m*T <= tau; form (b) (formB)
// adds m*T to tat while tat >= n and the result stays within n + tau. Both push the write onto
// the item's chain of its last writes (see the give-back rule in refund.go): its marker wid in
// w1 and, in c1, how far the bucket was busy past n before it (tat - n; -1 for form (a), which
// found it idle), the older entries moving down one place.
func gcraWrite(n, t, tau, m int64, formB bool, wid uint64) update {
	names := map[string]string{"#tat": schema.Tat, "#ttl": schema.TTL}
	ttl := schema.TTLAt(n + tau) // tat never passes now + tau
	if !formB {
		u := update{
			expr:   "SET #tat = :next, #ttl = :ttl",
			cond:   "attribute_not_exists(#tat) OR #tat < :now",
			names:  names,
			values: map[string]types.AttributeValue{":next": schema.Num(n + m*t), ":now": schema.Num(n), ":ttl": ttl},
		}
		pushChain(&u, wid, false)
		return u
	}
	u := update{
		expr:   "SET #tat = #tat + :t, #ttl = :ttl",
		cond:   "#tat >= :now AND #tat <= :last",
		names:  names,
		values: map[string]types.AttributeValue{":t": schema.Num(m * t), ":now": schema.Num(n), ":last": schema.Num(n + tau - m*t), ":ttl": ttl},
	}
	pushChain(&u, wid, true)
	return u
}

// chainPos is the position of the write wid in a GCRA item's chain (1 = the latest), 0 when
// it is not there.
func chainPos(item map[string]types.AttributeValue, wid uint64) int {
	for i := 1; i <= chainLen; i++ {
		if w, _, err := schema.Number(item, chainW(i)); err == nil && w != 0 && uint64(w) == wid {
			return i
		}
	}
	return 0
}

// chainLen is how many of its last writes a GCRA item keeps (w1..wN, c1..cN): a charge can be
// given back while fewer than chainLen writes came after its own.
const chainLen = 8

// chainW and chainC are the attribute names of the chain's entry i (1 = the latest write).
func chainW(i int) string { return "w" + strconv.Itoa(i) }
func chainC(i int) string { return "c" + strconv.Itoa(i) }

// idleCert is the c entry of a write that found the bucket idle: no charge before it can be
// given back (a bucket without that charge was idle too, and the write discarded it).
const idleCert = -1

// pushChain adds to u (a GCRA charge write at :now, whose expression starts with SET) the
// write's entry in the item's chain: marker wid and how far tat was past :now before it
// (busy), or idleCert for a write that found the bucket idle, which also drops the older
// entries (nothing before it can be given back).
func pushChain(u *update, wid uint64, busy bool) {
	u.names["#w1"], u.names["#c1"] = chainW(1), chainC(1)
	u.values[":w"] = schema.Unum(wid)
	if !busy {
		u.values[":idle"] = schema.Num(idleCert)
		u.expr += ", #w1 = :w, #c1 = :idle REMOVE "
		for i := 2; i <= chainLen; i++ {
			w, c := "#"+chainW(i), "#"+chainC(i)
			u.names[w], u.names[c] = chainW(i), chainC(i)
			if i > 2 {
				u.expr += ", "
			}
			u.expr += w + ", " + c
		}
		return
	}
	u.values[":none"], u.values[":idle"] = schema.Num(0), schema.Num(idleCert)
	for i := chainLen; i >= 2; i-- {
		w, c, pw, pc := "#"+chainW(i), "#"+chainC(i), "#"+chainW(i-1), "#"+chainC(i-1)
		u.names[w], u.names[c] = chainW(i), chainC(i)
		u.expr += ", " + w + " = if_not_exists(" + pw + ", :none), " + c + " = if_not_exists(" + pc + ", :idle)"
	}
	// Operands are the item's values before the write: #tat is the tat the write found.
	u.expr += ", #w1 = :w, #c1 = #tat - :now"
}

// countWrite adds m to a counter while it stays at most limit. With limit < m the condition
// always fails, so the write still reports the current count without changing it. A sliding
// window's slot (sealable) takes the write only while it is not sealed.
func countWrite(limit, m int64, ttl types.AttributeValue, sealable bool) update {
	u := update{
		expr:   "ADD #count :m SET #ttl = :ttl",
		cond:   "attribute_not_exists(#count) OR #count <= :last",
		names:  map[string]string{"#count": schema.Count, "#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":m": schema.Num(m), ":last": schema.Num(limit - m), ":ttl": ttl},
	}
	if limit < m {
		u.cond = "#count <= :last"
	}
	if sealable {
		u.cond = "(" + u.cond + ") AND attribute_not_exists(#sealed)"
		u.names["#sealed"] = attrSealed
	}
	return u
}

// apply makes o's conditional write until it is applied or the charge is known not to conform.
func (s *Store) apply(ctx context.Context, o *op, n int64) {
	for round := 0; round < maxRounds; round++ {
		wid := s.rnd.Marker()
		// Sent once (noRetry): re-sent after a lost answer, a charge would be counted twice.
		out, err := s.updateItem(ctx, opUpdate, o.pk, o.write(n, wid), types.ReturnValueAllNew, noRetry)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			o.applied, o.wid = true, wid
			if err := o.admit(out.Attributes, n); err != nil {
				o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
			}
			return
		case errors.As(err, &ccf) && isGCRA(o.c.Limit) && chainPos(ccf.Item, wid) > 0:
			// The answer came from a second copy of our write (a duplicate on the way), and
			// the first landed: the charge is applied, once.
			o.applied, o.wid = true, wid
			err := o.admit(ccf.Item, n)
			if err == nil && !o.result.Allowed {
				o.result, err = o.committed(ccf.Item, n) // others wrote since: applied all the same
			}
			if err != nil {
				o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
			}
			return
		case errors.As(err, &ccf):
			again, cerr := o.conditionFailed(ccf.Item, n)
			if cerr != nil {
				o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, cerr)
				return
			}
			if !again {
				return
			}
		default:
			s.m.errors.WithLabelValues(opUpdate).Inc()
			o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
			return
		}
	}
	o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, ErrContention)
}

// admit sets o's result from the item's values after its write was applied.
func (o *op) admit(item map[string]types.AttributeValue, n int64) error {
	l, w := o.c.Limit, o.c.N()
	o.done = true
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		tat, ok, err := schema.Number(item, schema.Tat)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("no tat after the write")
		}
		o.result = gcraResult(l, tat-w*o.t, n, w)
	case bucket.FixedWindow, bucket.Quota:
		c, _, err := schema.Number(item, schema.Count)
		if err != nil {
			return err
		}
		o.result = fixedResult(l, c-w, n, w)
	default:
		c, _, err := schema.Number(item, schema.Count)
		if err != nil {
			return err
		}
		o.counts[k] = c - w
		o.result = slidingResult(l, o.cur, &o.counts, n, w)
	}
	return nil
}

// conditionFailed handles a failed condition given the item as it was (nil when absent). It
// either records that the charge does not conform, or switches the GCRA form and reports that
// the write should be tried again.
func (o *op) conditionFailed(old map[string]types.AttributeValue, n int64) (again bool, err error) {
	l, w := o.c.Limit, o.c.N()
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		tat, ok, err := schema.Number(old, schema.Tat)
		if err != nil {
			return false, err
		}
		switch {
		case !ok || tat < n: // idle (or refunded, or our clock is ahead): form (a)
			o.formB = false
			return true, nil
		case tat <= n+o.tau-w*o.t: // within the burst: form (b)
			o.formB = true
			return true, nil
		}
		o.done = true
		o.result = gcraResult(l, tat, n, w)
	case bucket.FixedWindow, bucket.Quota:
		// The condition count <= Count-w failed: more than Count-w are counted. The count
		// returned makes Remaining exact for a weighted charge.
		c, _, err := schema.Number(old, schema.Count)
		if err != nil {
			return false, err
		}
		o.done = true
		o.result = fixedResult(l, max(c, l.Count-w+1), n, w)
	default:
		c, _, err := schema.Number(old, schema.Count)
		if err != nil {
			return false, err
		}
		o.counts[k] = c
		o.done = true
		if _, sealed := old[attrSealed]; sealed {
			o.result = sealedResult(l, o.cur, &o.counts, n, w)
		} else {
			o.result = slidingResult(l, o.cur, &o.counts, n, w)
		}
	}
	return false, nil
}
