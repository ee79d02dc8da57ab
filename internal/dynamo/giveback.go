package dynamo

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Give-backs: what goes back when a group is rejected (refund.go), when a charge_on answer
// did not consume (Release) and when a slot is released. Each is exact or stricter (never
// roomier than if the charge had never been made), and lands at most once: it carries its own
// id, and its outcome is settled by that id only, never by what the item's state shows (others
// change it, and values recur), so that it can be retried until it lands whatever other
// replicas write meanwhile.

// Give-backs are retried at most giveBackAttempts times, with full-jitter backoff from
// giveBackBackoff, within the caller's context; one that still fails is counted
// (ratelimit_dynamodb_giveback_failures_total) and logged, and leaves the limit stricter.
const (
	giveBackAttempts = 4
	giveBackBackoff  = 5 * time.Millisecond
)

// The give-back rule of a token or leaky bucket. A charge A of cost N added d = N*T to tat.
// Every later write i at instant t_i did tat = max(tat, t_i) + m_i*T. In a bucket that never saw
// A, the same writes leave tat lower by d_i = min(d_{i-1}, max(0, tat_{i-1} - t_i)) (tat_{i-1}
// the real tat before write i): the difference shrinks whenever a write found the A-less bucket
// idle, which a write that found the real bucket busy does not show (the example: A at
// 0 s, B at 0.5 s with burst 2 at 1/s leaves 2 s where a bucket without A has 1.5 s). So taking
// d off tat is exact only while nothing wrote since A; after other writes, exactly the smallest
// of d and their slacks tat_{i-1} - t_i can go back.
//
// Each GCRA item keeps a chain of its last chainLen charge writes (pushChain): w1 the marker of
// the latest, c1 its slack (tat - now before it; idleCert when it found the bucket idle), w2 and
// c2 the one before, and so on. A give-back of A finds A's write in the chain at position j and
// gives back g = min(d, c1, ..., c_{j-1}) in one write conditioned on A still being at j and
// those slacks still at least g: SET tat = tat - g, and c_i = c_i - d for the later writes
// (their slacks in the bucket without A are at least that much smaller: d at most, so
// subtracting d keeps every later give-back on the safe side). The same write replaces A's
// marker at j with the give-back's own id: that settles whether it landed, since the id moves
// down the chain with the entry whatever writes come after, and A's marker, gone for good,
// makes every later copy of the give-back fail. A charge whose write left the
// chain, or came before a write that found the bucket idle, gives nothing back: stricter,
// never looser. The charges of one coalesced write are one write at one instant: each can be
// given back, in any order.

// gcraRefund is the give-back of g of a charge of d = N*T whose write (marker wid) is at
// position pos of the chain; gid is the give-back's own id, which takes wid's place.
func gcraRefund(d, g int64, pos int, wid, gid uint64) update {
	u := update{
		expr:   "SET #tat = #tat - :t, #wp = :gid",
		cond:   "#wp = :w",
		names:  map[string]string{"#tat": schema.Tat, "#wp": chainW(pos)},
		values: map[string]types.AttributeValue{":t": schema.Num(g), ":w": schema.Unum(wid), ":gid": schema.Unum(gid)},
	}
	if pos > 1 {
		u.values[":d"] = schema.Num(d)
	}
	for i := 1; i < pos; i++ {
		c := "#" + chainC(i)
		u.names[c] = chainC(i)
		u.cond += " AND " + c + " >= :t"
		u.expr += ", " + c + " = " + c + " - :d"
	}
	return u
}

// refundable finds the write wid in item's chain and what of d can go back (see the rule
// above); ok is false when nothing can.
func refundable(item map[string]types.AttributeValue, wid uint64, d int64) (pos int, g int64, ok bool) {
	g = d
	for i := 1; i <= chainLen; i++ {
		if w, _, err := schema.Number(item, chainW(i)); err == nil && w != 0 && uint64(w) == wid {
			return i, g, g > 0
		}
		c, present, err := schema.Number(item, chainC(i))
		if err != nil || !present {
			return 0, 0, false
		}
		g = min(g, c)
	}
	return 0, 0, false
}

// gcraGiveBack gives back what is exact of a GCRA charge of d = N*T applied by the write
// marked wid on item pk: first assuming nothing wrote since (one write), else from the chain
// its failed condition returned. Its outcome is settled by its own id only: every attempt
// (ours, and the SDK's copies of them) carries the same id, which a landed attempt leaves in
// the chain in place of wid; an attempt that finds wid no longer in the chain can never land.
func (s *Store) gcraGiveBack(ctx context.Context, op, pk string, d int64, wid uint64) bool {
	gid := s.rnd.Marker()
	pos, g := 1, d
	return s.retryGiveBack(ctx, op, pk, func() (bool, error) {
		for round := 0; round < maxRounds; round++ {
			_, err := s.updateItem(ctx, op, pk, gcraRefund(d, g, pos, wid, gid), types.ReturnValueNone)
			var ccf *types.ConditionalCheckFailedException
			switch {
			case err == nil:
				return true, nil
			case !errors.As(err, &ccf):
				return false, err
			case chainPos(ccf.Item, gid) > 0:
				return true, nil // an earlier attempt landed
			}
			var ok bool
			if pos, g, ok = refundable(ccf.Item, wid, d); !ok {
				// Nothing exact to give back (stricter), or wid left the chain: then no
				// attempt of ours can land any more, and whether one did does not matter.
				return true, nil
			}
		}
		return true, nil // the chain kept moving under us: stricter
	})
}

// The give-back of a counter (window, sliding-window slot, quota period) carries its own id,
// gid, and lands only while gid is not in the item's set g of the ids applied in its current
// epoch e: whatever else writes to the item, gid in g says it landed, and no copy of it (the
// store's retries, a duplicate or a late write on the network) can land a second time. The set
// is bounded whatever the number of processes giving back: when it holds giveBackIDs ids, the
// next give-back starts a new epoch (e+1) with its own id alone, and every give-back is
// conditioned on the epoch it was sent for, so a copy of one whose id the new epoch dropped
// fails too. A give-back learns an item's epoch from a failed condition (and keeps it in the
// Store's epochs cache): a first attempt with a stale epoch costs one more round trip.

// Item attributes of a counter's give-backs.
const (
	attrGiven = "g" // NS: ids of the give-backs applied in the current epoch
	attrEpoch = "e" // N: the epoch of g; absent = 0
)

// giveBackIDs bounds the ids a counter item keeps in g (about 11 bytes each): 64 keep the item
// under 1 KB, one write unit per write (DynamoDB bills a write by the item's size), while a
// fleet's processes each pay one more round trip per new epoch, every 64 give-backs at most.
const giveBackIDs = 64

// countRefund is the give-back of c from a counter item while cond holds, sent for epoch e with
// id gid: it adds gid to g, or (reset) starts epoch e+1 with g = {gid} when g is full.
func countRefund(c int64, cond string, gid uint64, e int64, reset bool) update {
	u := update{
		names: map[string]string{"#count": schema.Count, "#g": attrGiven, "#e": attrEpoch},
		values: map[string]types.AttributeValue{
			":minus": schema.Num(-c), ":gid": schema.Unum(gid), ":k": schema.Num(giveBackIDs),
			":gs": &types.AttributeValueMemberNS{Value: []string{strconv.FormatUint(gid, 10)}},
		},
	}
	if strings.Contains(cond, ":n") {
		u.values[":n"] = schema.Num(c)
	}
	epoch := "attribute_not_exists(#e)"
	if e != 0 {
		epoch = "#e = :e"
		u.values[":e"] = schema.Num(e)
	}
	u.cond = "(" + cond + ") AND " + epoch
	if !reset {
		u.expr = "ADD #count :minus, #g :gs"
		u.cond += " AND (attribute_not_exists(#g) OR (size(#g) < :k AND NOT contains(#g, :gid)))"
		return u
	}
	u.expr = "ADD #count :minus SET #g = :gs, #e = :next"
	u.values[":next"] = schema.Num(e + 1)
	u.cond += " AND size(#g) >= :k AND NOT contains(#g, :gid)"
	return u
}

// countGiveBack takes c off a counter item while cond holds, exactly once or not at all (see
// countRefund), retried as retryGiveBack says.
func (s *Store) countGiveBack(ctx context.Context, op, pk string, c int64, cond string) bool {
	g := s.newCountGive(op, pk, c, cond)
	return s.retryGiveBack(ctx, op, pk, func() (bool, error) {
		done, _, err := g.attempt(ctx)
		return done, err
	})
}

// countGive is one counter give-back: its id and what its attempts so far have told.
type countGive struct {
	s      *Store
	op, pk string
	c      int64
	cond   string
	gid    uint64
	e      int64 // the epoch it is sent for
	reset  bool  // g is full: start a new epoch
	unsure bool  // an attempt may have landed without our knowing
}

func (s *Store) newCountGive(op, pk string, c int64, cond string) *countGive {
	e, _ := s.epochs.get(pk, 0)
	return &countGive{s: s, op: op, pk: pk, c: c, cond: cond, gid: s.rnd.Marker(), e: e}
}

// attempt sends the give-back until its outcome is known: done with landed when it applied,
// done without when cond failed (nothing to give back), not done with the error when an
// attempt's answer was lost (attempt again: the same id and epoch) or whether it landed can no
// longer be known (errGiveBackUnknown). Every attempt is sent once (noRetry), so the store sees
// every lost answer and knows which attempts may have landed. An attempt whose answer was lost
// is re-sent with the same id and epoch: whichever copy lands first makes the others fail. When
// the item's epoch has moved on, an attempt that may have landed in the old one cannot be told
// from one that did not (its id was dropped): the give-back stops there, counted as failed
// (stricter at worst); otherwise it is sent again for the new epoch.
func (g *countGive) attempt(ctx context.Context) (done, landed bool, err error) {
	s := g.s
	for range maxRounds {
		_, err := s.updateItem(ctx, g.op, g.pk, countRefund(g.c, g.cond, g.gid, g.e, g.reset), types.ReturnValueNone, noRetry)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			if g.reset {
				s.epochs.put(g.pk, g.e+1, math.MaxInt64, 0)
			}
			return true, true, nil
		case !errors.As(err, &ccf):
			g.unsure = true // it may have landed, or land later: re-sent as it is
			return false, false, err
		}
		ids, _ := ccf.Item[attrGiven].(*types.AttributeValueMemberNS)
		if ids != nil && slices.Contains(ids.Value, strconv.FormatUint(g.gid, 10)) {
			return true, true, nil // an earlier attempt landed
		}
		ie, _, _ := schema.Number(ccf.Item, attrEpoch)
		s.epochs.put(g.pk, ie, math.MaxInt64, 0)
		switch {
		case ie != g.e && g.unsure:
			return false, false, errGiveBackUnknown
		case ie != g.e:
			g.e, g.reset = ie, false // no attempt landed: sent again for the item's epoch
		case !g.reset && ids != nil && len(ids.Value) >= giveBackIDs:
			g.reset = true // g is full: a new epoch
		default:
			return true, false, nil // cond failed: nothing to give back (window gone, count lower)
		}
	}
	return false, false, ErrContention
}

// errGiveBackUnknown says that a give-back may or may not have landed, and cannot be sent again.
var errGiveBackUnknown = errors.New("dynamo: give-back unanswered, then its epoch ended: whether it landed is unknown")

// slotGiveBack releases concurrency slot id of item pk: idempotent, it removes only its own slot
// attribute, if it is still there.
func (s *Store) slotGiveBack(ctx context.Context, op, pk string, id uint64) bool {
	return s.retryGiveBack(ctx, op, pk, func() (bool, error) {
		_, err := s.updateItem(ctx, op, pk, slotRelease(id), types.ReturnValueNone)
		var ccf *types.ConditionalCheckFailedException
		if err == nil || errors.As(err, &ccf) {
			return true, nil // released, or already gone (reaped, or released before)
		}
		return false, err
	})
}

// retryGiveBack runs attempt, an idempotent give-back, until it is done, at most
// giveBackAttempts times within ctx; a give-back that never gets done is counted and logged.
// It reports whether it got done.
func (s *Store) retryGiveBack(ctx context.Context, op, pk string, attempt func() (done bool, err error)) bool {
	var err error
	for i := 1; ; i++ {
		var done bool
		if done, err = attempt(); done {
			return true
		}
		s.m.errors.WithLabelValues(op).Inc()
		if i == giveBackAttempts || errors.Is(err, errGiveBackUnknown) || !s.sleep(ctx, time.Duration(s.rnd.Int64N(int64(giveBackBackoff)<<i))) {
			break
		}
	}
	s.m.giveBackFailed.WithLabelValues(op).Inc()
	// At most one line per giveBackLogEvery: in an outage every decision's give-back fails, and
	// the counter has them all.
	now := time.Now().UnixNano()
	if last := s.giveLogAt.Load(); now-last >= int64(giveBackLogEvery) && s.giveLogAt.CompareAndSwap(last, now) {
		s.log.Warn("dynamodb give-back failed: the limit stays stricter by what it would have given back",
			zap.String("op", op), zap.String("item", pk), zap.Error(err),
			zap.Int64("failed_since_last_line", s.giveLogged.Swap(0)+1))
	} else {
		s.giveLogged.Add(1)
	}
	return false
}

// giveBackLogEvery spaces the log lines of failed give-backs.
const giveBackLogEvery = 10 * time.Second
