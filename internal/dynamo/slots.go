package dynamo

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Sliding-window slots: a closed slot's count is learnt once per Store, sealed while writes
// decided in it may still land, read once it is final.

// loadClosedSlots fills the closed-slot counts of every sliding-window charge, from the cache or
// from DynamoDB for all that are missing: a slot that closed less than lateWrites ago may still
// receive writes decided in it, so it is sealed (see sealSlots) and its count is the one the seal
// returns; an older one is final and read with one consistent BatchGetItem. The seals and the
// read go out concurrently, and every count learnt is cached until the slot stops counting.
func (s *Store) loadClosedSlots(ctx context.Context, ops []op, n int64) error {
	type miss struct {
		o    *op
		i    int
		slot int64
		pk   string
	}
	var misses []miss
	var seals []seal
	var pks []string
	seen := map[string]bool{}
	for j := range ops {
		o := &ops[j]
		if o.done || o.err != nil || o.c.Limit.Algorithm != bucket.SlidingWindow {
			continue
		}
		w := bucket.SlidingWidth(o.c.Limit)
		for i := 0; i < k; i++ {
			slot := o.cur - k + int64(i)
			if v, ok := s.slots.get(slotKey{o.c.Key, slot}, n); ok {
				o.counts[i] = v
				continue
			}
			pk := o.c.Key.String() + "#s" + strconv.FormatInt(slot, 10)
			misses = append(misses, miss{o, i, slot, pk})
			if seen[pk] {
				continue
			}
			seen[pk] = true
			if (slot+1)*w > n-s.lateWrites { // closed less than lateWrites ago
				seals = append(seals, seal{pk: pk, ttl: schema.TTLAt(leaves(o.c.Limit, slot))})
			} else {
				pks = append(pks, pk)
			}
		}
	}
	if len(misses) == 0 {
		return nil
	}
	var items map[string]map[string]types.AttributeValue
	var readErr error
	var wg sync.WaitGroup
	if len(pks) > 0 {
		s.turns.GoWG(&wg, func() { items, readErr = s.readItems(ctx, pks) })
	}
	s.sealSlots(ctx, seals)
	s.turns.Wait(&wg)
	if readErr != nil {
		return readErr
	}
	for i := range seals {
		if seals[i].err != nil {
			return seals[i].err
		}
	}
	if len(seals) > 0 {
		if items == nil {
			items = make(map[string]map[string]types.AttributeValue, len(seals))
		}
		for _, sl := range seals {
			items[sl.pk] = sl.item
		}
	}
	for _, m := range misses {
		v, _, err := schema.Number(items[m.pk], schema.Count)
		if err != nil {
			return fmt.Errorf("dynamo: read %s: %w", m.pk, err)
		}
		m.o.counts[m.i] = v
		s.slots.put(slotKey{m.o.c.Key, m.slot}, v, leaves(m.o.c.Limit, m.slot), n)
	}
	return nil
}

// seal is one closed slot to seal, and what its UpdateItem returned.
type seal struct {
	pk   string
	ttl  types.AttributeValue
	item map[string]types.AttributeValue
	err  error
}

// sealSlots seals the slots concurrently: SET sealed = true (creating the item when the slot is
// empty) returning ALL_NEW. Every write to a slot is conditioned on attribute_not_exists(sealed),
// so after the seal the slot's count is final: a write decided in the slot that lands later is
// rejected instead of being missed by the replicas that cached the count. A seal is idempotent,
// so the SDK may retry it.
func (s *Store) sealSlots(ctx context.Context, seals []seal) {
	if len(seals) == 0 {
		return
	}
	one := func(sl *seal) {
		out, err := s.updateItem(ctx, opSeal, sl.pk, update{
			expr:   "SET #sealed = :true, #ttl = if_not_exists(#ttl, :ttl)",
			names:  map[string]string{"#sealed": attrSealed, "#ttl": schema.TTL},
			values: map[string]types.AttributeValue{":true": &types.AttributeValueMemberBOOL{Value: true}, ":ttl": sl.ttl},
		}, types.ReturnValueAllNew)
		if err != nil {
			s.m.errors.WithLabelValues(opSeal).Inc()
			sl.err = fmt.Errorf("dynamo: seal %s: %w", sl.pk, err)
			return
		}
		sl.item = out.Attributes
	}
	if len(seals) == 1 {
		one(&seals[0])
		return
	}
	var wg sync.WaitGroup
	for i := range seals {
		s.turns.GoWG(&wg, func() { one(&seals[i]) })
	}
	s.turns.Wait(&wg)
}
