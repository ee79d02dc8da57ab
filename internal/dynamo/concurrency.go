package dynamo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Concurrency limits: slots as leases.
//
// A concurrency key is one item, `<hex>#c`, holding `count` (the slots taken) and one attribute
// per slot in flight, `l<slot id>` = the slot's lease expiry (Unix ns). Every write changes both
// in one conditional UpdateItem, so count is always the number of slot attributes:
//
//   - take:    ADD #count :one SET #l = :expiry, #ttl = :ttl  IF (attribute_not_exists(#count) OR #count < :limit) AND attribute_not_exists(#l)
//   - release: ADD #count :minus REMOVE #l                    IF attribute_exists(#l)
//   - renew:   SET #l = :expiry, #ttl = :ttl                   IF attribute_exists(#l)  (all of a key's slots at once)
//   - reap:    ADD #count :minus_k REMOVE #l1, ..., #lk         IF #l1 = :e1 AND ... (the expiries read)
//
// A slot id is drawn at random per request (62 bits), so a release can only ever remove its own
// slot: a slot reaped while its request was still running (the replica stalled past its lease)
// is simply gone, and its release changes nothing. A Store renews the leases of the slots it
// holds every SlotLease/3 (one write per key); a replica that crashes stops renewing, and its
// slots expire SlotLease after their last renewal. Expired slots are reaped lazily, by the
// first take that finds the key full: its failed condition returns the item (ALL_OLD), which
// lists every slot and its expiry, and it removes the expired ones in one conditional write
// before trying again. So a crashed replica's slots come back at most SlotLease (default 30 s)
// after its last renewal, as soon as someone needs them; a live replica's slots never expire.
//
// Expiries are compared with the reaper's clock: clocks must agree to well within SlotLease
// (NTP gives milliseconds). A replica that cannot reach DynamoDB for longer than SlotLease
// while its requests run loses their slots to reaping, and the key may then briefly have more
// than the limit in flight: leases trade that for never leaking slots forever.

const (
	attrLeasePrefix = "l" // a slot attribute is "l" and the slot id in hex
	// defaultSlotLease is the default of Options.SlotLease.
	defaultSlotLease = 30 * time.Second
	// maxReap bounds the slots one reap write removes (expression size); a take reaps again in
	// its next round if more expired.
	maxReap = 50
	// maxRenew bounds the slots one renew write names.
	maxRenew = 50
)

// slotAttr is the attribute name of slot id.
func slotAttr(id uint64) string { return attrLeasePrefix + strconv.FormatUint(id, 16) }

// newSlotID draws a slot id: never zero (Result.Token's "none"), top two bits clear (the
// fallback store marks its own tokens with the top bit).

// leases is what a Store knows of the slots it holds, to renew them.
type leases struct {
	mu      sync.Mutex
	held    map[string]map[uint64]struct{} // pk -> slot ids
	running bool                           // the renew loop runs
	closed  bool
	stop    chan struct{}
}

func (l *leases) hold(pk string, id uint64) (start bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = make(map[string]map[uint64]struct{})
	}
	ids := l.held[pk]
	if ids == nil {
		ids = make(map[uint64]struct{})
		l.held[pk] = ids
	}
	ids[id] = struct{}{}
	if l.running || l.closed {
		return false
	}
	l.running = true
	return true
}

func (l *leases) drop(pk string, id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ids := l.held[pk]; ids != nil {
		delete(ids, id)
		if len(ids) == 0 {
			delete(l.held, pk)
		}
	}
}

// idle reports that the renew loop should end (nothing held, or closed), and marks it ended.
func (l *leases) idle() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.held) == 0 || l.closed {
		l.running = false
		return true
	}
	return false
}

// snapshot returns the slots held, by item.
func (l *leases) snapshot() map[string][]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]uint64, len(l.held))
	for pk, ids := range l.held {
		for id := range ids {
			out[pk] = append(out[pk], id)
		}
	}
	return out
}

// slotWrite is the take of slot o.slot at instant n.
func (s *Store) slotWrite(o *op, n int64) update {
	exp := n + int64(s.slotLease)
	return update{
		expr: "ADD #count :one SET #l = :exp, #ttl = :ttl",
		// Idempotent: a re-sent take that landed before finds its own slot and fails.
		cond:  "(attribute_not_exists(#count) OR #count < :limit) AND attribute_not_exists(#l)",
		names: map[string]string{"#count": schema.Count, "#l": slotAttr(o.slot), "#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":one": schema.Num(1), ":exp": schema.Num(exp), ":ttl": schema.TTLAt(exp),
			":limit": schema.Num(o.c.Limit.Count)},
	}
}

// slotRelease gives slot id back, if it is still there.
func slotRelease(id uint64) update {
	return update{
		expr:   "ADD #count :minus REMOVE #l",
		cond:   "attribute_exists(#l)",
		names:  map[string]string{"#count": schema.Count, "#l": slotAttr(id)},
		values: map[string]types.AttributeValue{":minus": schema.Num(-1)},
	}
}

// isSlot reports whether o takes a concurrency slot.
func isSlot(o *op) bool { return o.c.Limit.Algorithm == bucket.Concurrency }

// takeSlots takes the slots of the group's concurrency charges, before its other charges are
// written: a request refused for too many in flight then costs no other write. decided reports
// that the group is settled already: a slot was refused (admitted false, the slots taken are
// given back) or a write failed (err).
func (s *Store) takeSlots(ctx context.Context, ops []op, n int64) (admitted, decided bool, err error) {
	any := false
	for i := range ops {
		any = any || isSlot(&ops[i]) && undecided(&ops[i])
	}
	if !any {
		return false, false, nil
	}
	s.each(ops, func(o *op) bool { return isSlot(o) && undecided(o) }, func(o *op) { s.applySlot(ctx, o, n) })
	refused := false
	for i := range ops {
		o := &ops[i]
		if !isSlot(o) {
			continue
		}
		if o.err != nil && err == nil {
			err = o.err
		}
		refused = refused || !o.c.Shadow && o.done && !o.result.Allowed
	}
	if err == nil && !refused {
		return false, false, nil
	}
	s.refund(ctx, ops) // only the slots are applied so far
	for i := range ops {
		if o := &ops[i]; !o.done {
			// Not written: reported like a charge that would conform, as the deny cache does.
			o.result = bucket.Result{Allowed: true, Limit: limitValue(o.c.Limit)}
		}
	}
	return false, true, err
}

// tookSlot decides o from the item its slot take left (the count includes o's own slot).
func (o *op) tookSlot(item map[string]types.AttributeValue) {
	c, _, err := schema.Number(item, schema.Count)
	if err != nil {
		o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
		return
	}
	o.applied, o.done = true, true
	_, o.result = bucket.Concurrent(c-1, o.c.Limit)
	o.result.Token = o.slot
}

// applySlot takes o's slot: admitted while fewer than the limit are taken; when the key is
// full, expired slots (of replicas that stopped renewing) are reaped and the take tried again.
func (s *Store) applySlot(ctx context.Context, o *op, n int64) {
	for round := 0; round < maxRounds; round++ {
		out, err := s.updateItem(ctx, opUpdate, o.pk, s.slotWrite(o, n), types.ReturnValueUpdatedNew)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			o.tookSlot(out.Attributes)
			return
		case errors.As(err, &ccf) && ccf.Item[slotAttr(o.slot)] != nil:
			// The SDK re-sent a take whose answer was lost, and the first attempt landed.
			o.tookSlot(ccf.Item)
			return
		case errors.As(err, &ccf):
			reaped, rerr := s.reap(ctx, o.pk, ccf.Item, n)
			if rerr != nil {
				o.err = fmt.Errorf("dynamo: reap %s: %w", o.pk, rerr)
				return
			}
			if !reaped {
				c, _, _ := schema.Number(ccf.Item, schema.Count)
				o.done = true
				_, o.result = bucket.Concurrent(max(c, o.c.Limit.Count), o.c.Limit)
				return
			}
		default:
			s.m.errors.WithLabelValues(opUpdate).Inc()
			o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, err)
			// The take may have landed without its answer: give the slot back (its release
			// removes only this slot), so that no slot stays counted that no one holds.
			s.slotGiveBack(ctx, opRefund, o.pk, o.slot)
			return
		}
	}
	o.err = fmt.Errorf("dynamo: update %s: %w", o.pk, ErrContention)
}

// reap removes the slots of item (as a failed condition returned it) whose leases expired
// before now, in one write conditioned on the expiries read. It reports whether the item may
// have changed since it was read (a reap was applied, or raced with another writer), so that
// the take should be tried again.
func (s *Store) reap(ctx context.Context, pk string, item map[string]types.AttributeValue, now int64) (bool, error) {
	type slot struct {
		name string
		exp  int64
	}
	var expired []slot
	for name, av := range item {
		if !strings.HasPrefix(name, attrLeasePrefix) {
			continue
		}
		nv, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			continue
		}
		exp, err := strconv.ParseInt(nv.Value, 10, 64)
		if err == nil && exp < now {
			expired = append(expired, slot{name, exp})
		}
	}
	if len(expired) == 0 {
		return false, nil
	}
	sort.Slice(expired, func(i, j int) bool { return expired[i].exp < expired[j].exp })
	expired = expired[:min(len(expired), maxReap)]
	u := update{
		names:  map[string]string{"#count": schema.Count},
		values: map[string]types.AttributeValue{":minus": schema.Num(-int64(len(expired)))},
	}
	var remove, cond []string
	for i, sl := range expired {
		nk, vk := "#l"+strconv.Itoa(i), ":e"+strconv.Itoa(i)
		u.names[nk] = sl.name
		u.values[vk] = schema.Num(sl.exp)
		remove = append(remove, nk)
		cond = append(cond, nk+" = "+vk)
	}
	u.expr = "ADD #count :minus REMOVE " + strings.Join(remove, ", ")
	u.cond = strings.Join(cond, " AND ")
	_, err := s.updateItem(ctx, opReap, pk, u, types.ReturnValueNone, noRetry)
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		s.m.reaped.Add(float64(len(expired)))
		return true, nil
	case errors.As(err, &ccf):
		return true, nil // another writer reaped or renewed first: read again
	default:
		s.m.errors.WithLabelValues(opReap).Inc()
		return false, err
	}
}

// holdSlots records the slots of an admitted group, so that their leases are renewed until
// they are released.
func (s *Store) holdSlots(ops []op) {
	for i := range ops {
		if o := &ops[i]; isSlot(o) && o.applied {
			if s.leases.hold(o.pk, o.slot) {
				s.turns.Go(s.renewLoop)
			}
		}
	}
}

// renewLoop renews the leases every SlotLease/3 while slots are held.
func (s *Store) renewLoop() {
	t := time.NewTicker(s.slotLease / 3)
	defer t.Stop()
	for {
		k := s.turns.Park()
		select {
		case <-s.leases.stop:
			s.turns.Resume(k)
			return
		case <-t.C:
		}
		s.turns.Resume(k)
		if s.leases.idle() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.slotLease/3)
		_ = s.RenewLeases(ctx, s.now()) // a failed renewal is retried at the next tick
		cancel()
	}
}

// RenewLeases extends the lease of every concurrency slot this Store holds to now+SlotLease,
// with one write per key. The Store calls it every SlotLease/3 while it holds slots; a slot
// found reaped (its lease had expired) is forgotten.
func (s *Store) RenewLeases(ctx context.Context, now time.Time) error {
	held := s.leases.snapshot()
	exp := now.UnixNano() + int64(s.slotLease)
	var errs []error
	// In key and slot order: the simulator (internal/testkit/sim) repeats a seed only if the
	// writes come in the same order every run, which a map's iteration does not give.
	for _, pk := range slices.Sorted(maps.Keys(held)) {
		ids := held[pk]
		slices.Sort(ids)
		for start := 0; start < len(ids); start += maxRenew {
			part := ids[start:min(start+maxRenew, len(ids))]
			if err := s.renew(ctx, pk, part, exp); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// renew extends the slots ids of item pk; when one of them is gone (reaped), each is renewed on
// its own and the gone ones are forgotten.
func (s *Store) renew(ctx context.Context, pk string, ids []uint64, exp int64) error {
	u := update{
		names:  map[string]string{"#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":exp": schema.Num(exp), ":ttl": schema.TTLAt(exp)},
	}
	set, cond := []string{"#ttl = :ttl"}, make([]string, 0, len(ids))
	for i, id := range ids {
		nk := "#l" + strconv.Itoa(i)
		u.names[nk] = slotAttr(id)
		set = append(set, nk+" = :exp")
		cond = append(cond, "attribute_exists("+nk+")")
	}
	u.expr, u.cond = "SET "+strings.Join(set, ", "), strings.Join(cond, " AND ")
	_, err := s.updateItem(ctx, opRenew, pk, u, types.ReturnValueNone)
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ccf) && len(ids) > 1:
		var errs []error
		for _, id := range ids {
			errs = append(errs, s.renew(ctx, pk, []uint64{id}, exp))
		}
		return errors.Join(errs...)
	case errors.As(err, &ccf):
		s.leases.drop(pk, ids[0]) // reaped: its release would change nothing either
		return nil
	default:
		s.m.errors.WithLabelValues(opRenew).Inc()
		return fmt.Errorf("dynamo: renew %s: %w", pk, err)
	}
}

// Close stops renewing leases; the slots still held expire SlotLease later. A Store is usable
// after Close, but takes no more leases it would renew. Close is for the end of a process (or
// a test of a crashed replica).
func (s *Store) Close() error {
	s.leases.mu.Lock()
	defer s.leases.mu.Unlock()
	if !s.leases.closed {
		s.leases.closed = true
		close(s.leases.stop)
	}
	return nil
}
