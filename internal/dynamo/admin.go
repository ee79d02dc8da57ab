package dynamo

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The operators' console on the shared store (package admin): Peek reads a key's items without
// writing, Reset empties them, and both the resets and the exemptions reach every replica
// through two items that each replica reads once a second (Exemptions):
//
//	pk = ratelimit-proxy#resets      r (M: bucket key hex -> reset instant, Unix ns)
//	pk = ratelimit-proxy#exemptions  x (M: exemption id -> its JSON)
//
// A replica that sees a reset newer than the last it applied drops what it knows locally of the
// key: its deny-cache entry, its GCRA hint, its cached closed sliding-window slots and what its
// lease pools know of the shards (empty until, the tat or count learnt), so that its next
// request asks the table. Units a replica had already leased stay its to spend (they were taken
// from the pool before the reset). So every replica honours a reset within one read period
// (1 s) plus store.timeout for the read, plus one lease TTL for leased pools whose units were
// all leased out before the reset; docs/operations.md states the bound.
const (
	resetsItem     = "ratelimit-proxy#resets"
	exemptionsItem = "ratelimit-proxy#exemptions"
	attrResets     = "r"
	attrExemptions = "x"
	// resetMemory is how long a reset stays in the shared item: replicas read it every second,
	// so one that has not read it in this long has restarted (and has nothing stale to drop).
	resetMemory = 10 * time.Minute
)

// adminState is what Exemptions remembers between reads: the zero value is ready.
type adminState struct {
	mu      sync.Mutex
	applied map[string]int64 // bucket key hex -> the newest reset applied here
}

// admin returns the Store's console state, its map made on first use. The caller locks mu
// before using applied.
func (s *Store) admin() *adminState {
	st := &s.adm
	st.mu.Lock()
	if st.applied == nil {
		st.applied = make(map[string]int64)
	}
	st.mu.Unlock()
	return st
}

// Peek returns the state of c's key at now without charging it, from consistent reads of its
// items, as bucket.Memory.Peek describes. For a leased pool, units leased to replicas count as
// spent (the table cannot see whether they are): Remaining is what the pool still has to lease.
func (s *Store) Peek(ctx context.Context, now time.Time, c bucket.Charge) (bucket.Result, error) {
	n := now.UnixNano()
	c.Cost = 1
	l := c.Limit
	pks := peekItems(c, n)
	items, err := s.adminRead(ctx, pks)
	if err != nil {
		return bucket.Result{}, fmt.Errorf("dynamo: peek: %w", err)
	}
	var r bucket.Result
	switch {
	case leased(c) && isGCRA(l):
		r = bucket.Result{Limit: l.Burst}
		for i, pk := range pks {
			tat, _, _ := number(items[pk], attrTat)
			t, tau := bucket.ShardGCRA(l, len(pks), i)
			r.Remaining += max(tau-max(tat-n, 0), 0) / t
			r.Reset = max(r.Reset, time.Duration(max(tat-n, 0)))
		}
		r.Allowed = r.Remaining > 0
		if !r.Allowed {
			r.RetryAfter = time.Second
		}
		return r, nil
	case leased(c):
		r = bucket.Result{Limit: l.Count, Reset: time.Duration(fixedEnd(l, n) - n)}
		for i, pk := range pks {
			used, _, _ := number(items[pk], attrCount)
			r.Remaining += max(bucket.ShardCapacity(l.Count, len(pks), i)-used, 0)
		}
		r.Allowed = r.Remaining > 0
		if !r.Allowed {
			r.RetryAfter = r.Reset
		}
		return r, nil
	}
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		tat, _, err := number(items[pks[0]], attrTat)
		if err != nil {
			return bucket.Result{}, fmt.Errorf("dynamo: peek: %w", err)
		}
		r = gcraResult(l, tat, n, 1)
		if r.Allowed {
			r.Remaining++
		}
		r.Reset = time.Duration(max(tat-n, 0))
	case bucket.FixedWindow, bucket.Quota:
		used, _, _ := number(items[pks[0]], attrCount)
		r = fixedResult(l, used, n, 1)
		if r.Allowed {
			r.Remaining++
		}
	case bucket.SlidingWindow:
		var counts slotCounts
		for i, pk := range pks {
			counts[i], _, _ = number(items[pk], attrCount)
		}
		r = slidingResult(l, slotOf(l, n), &counts, n, 1)
		if r.Allowed {
			r.Remaining++
		}
	case bucket.Concurrency:
		used, _, _ := number(items[pks[0]], attrCount)
		_, r = bucket.Concurrent(used, l)
		if r.Allowed {
			r.Remaining++
		}
	default:
		return bucket.Result{}, fmt.Errorf("dynamo: peek: unknown algorithm %d", l.Algorithm)
	}
	r.Token, r.Wait = 0, 0
	if r.Allowed {
		r.RetryAfter = 0
	}
	return r, nil
}

// peekItems names the items that hold c's state at n: a leased pool's shards, a sliding window's
// K+1 counted slots (oldest first), or the key's one item.
func peekItems(c bucket.Charge, n int64) []string {
	key, l := c.Key.String(), c.Limit
	if leased(c) {
		p := &pool{base: key, gcra: l.Algorithm == bucket.TokenBucket, key: leaseKey{key: c.Key, limit: l, lease: c.Lease}}
		pks := make([]string, max(c.Lease.Shards, 1))
		for i := range pks {
			pks[i] = p.itemKey(i, n)
		}
		return pks
	}
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return []string{key + "#g"}
	case bucket.FixedWindow:
		return []string{key + "#w" + strconv.FormatInt(fixedEnd(l, n)-int64(l.Window), 10)}
	case bucket.Quota:
		return []string{quotaItem(key, l, n)}
	case bucket.SlidingWindow:
		cur := slotOf(l, n)
		pks := make([]string, k+1)
		for i := range pks {
			pks[i] = key + "#s" + strconv.FormatInt(cur-k+int64(i), 10)
		}
		return pks
	case bucket.Concurrency:
		return []string{key + "#c"}
	}
	return nil
}

// Reset makes c's key full again at now: it empties every item that counts against the key
// (a bucket's tat and its chain of writes, the window's or period's count, the counted slots of a
// sliding window, a concurrency item's slots, a leased pool's shards), then records the reset in
// the shared resets item so that every replica drops what it knows locally (see Exemptions), and
// drops it here at once. A give-back of a charge taken before the reset that lands after it may
// return its cost to a window (at most the cost of the charges in flight at the reset); a GCRA
// give-back finds its write gone from the chain and gives nothing.
func (s *Store) Reset(ctx context.Context, now time.Time, c bucket.Charge) error {
	n := now.UnixNano()
	for _, pk := range peekItems(c, n) {
		if err := s.emptyItem(ctx, pk, c); err != nil {
			return fmt.Errorf("dynamo: reset %s: %w", c.Key, err)
		}
	}
	hexKey := c.Key.String()
	if err := s.putMapEntry(ctx, resetsItem, attrResets, hexKey, num(n), n); err != nil {
		return fmt.Errorf("dynamo: reset %s: %w", c.Key, err)
	}
	s.forgetKey(c.Key)
	st := s.admin()
	st.mu.Lock()
	st.applied[hexKey] = max(st.applied[hexKey], n)
	st.mu.Unlock()
	return nil
}

// emptyItem empties one item of c's key, unconditionally: a reset is the operator's word.
func (s *Store) emptyItem(ctx context.Context, pk string, c bucket.Charge) error {
	var u update
	switch {
	case strings.Contains(pk, "#g"):
		// lv too: a lease give-back lands only while lv holds its own lease write's marker, so
		// one in flight at the reset gives nothing to the emptied bucket.
		u = update{expr: "REMOVE #tat, #lv", names: map[string]string{"#tat": attrTat, "#lv": attrLeaseWrite}}
		for i := 1; i <= chainLen; i++ {
			w, cc := "#w"+strconv.Itoa(i), "#c"+strconv.Itoa(i)
			u.expr += ", " + w + ", " + cc
			u.names[w], u.names[cc] = chainW(i), chainC(i)
		}
	case c.Limit.Algorithm == bucket.Concurrency:
		items, err := s.adminRead(ctx, []string{pk})
		if err != nil {
			return err
		}
		u = update{expr: "REMOVE #count", names: map[string]string{"#count": attrCount}}
		i := 0
		for name := range items[pk] {
			if strings.HasPrefix(name, attrLeasePrefix) && i < 100 {
				nk := "#l" + strconv.Itoa(i)
				u.expr += ", " + nk
				u.names[nk] = name
				i++
			}
		}
	default: // a counter: fixed window, quota, sliding-window slot, leased window shard
		u = update{expr: "SET #count = :zero", names: map[string]string{"#count": attrCount},
			values: map[string]types.AttributeValue{":zero": num(0)}}
	}
	_, err := s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	return err
}

// opAdmin labels the console's calls in the store metrics.
const opAdmin = "admin"

// putMapEntry sets entry name of map attribute attr of item pk to v, creating the map when the
// item has none.
func (s *Store) putMapEntry(ctx context.Context, pk, attr, name string, v types.AttributeValue, n int64) error {
	u := update{expr: "SET #m.#k = :v, #ttl = :ttl", cond: "attribute_exists(#m)",
		names:  map[string]string{"#m": attr, "#k": name, "#ttl": attrTTL},
		values: map[string]types.AttributeValue{":v": v, ":ttl": ttlAt(n + int64(resetMemory))}}
	_, err := s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	var cf *types.ConditionalCheckFailedException
	if !errors.As(err, &cf) {
		return err
	}
	// No map yet: create it with the entry, unless another replica just did.
	u = update{expr: "SET #m = :m, #ttl = :ttl", cond: "attribute_not_exists(#m)",
		names: map[string]string{"#m": attr, "#ttl": attrTTL},
		values: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{name: v}},
			":ttl": ttlAt(n + int64(resetMemory))}}
	_, err = s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	if errors.As(err, &cf) {
		return s.putMapEntry(ctx, pk, attr, name, v, n)
	}
	return err
}

// removeMapEntries removes entries of map attribute attr of item pk.
func (s *Store) removeMapEntries(ctx context.Context, pk, attr string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	u := update{expr: "REMOVE ", cond: "attribute_exists(#m)", names: map[string]string{"#m": attr}}
	for i, name := range names {
		if i > 0 {
			u.expr += ", "
		}
		nk := "#k" + strconv.Itoa(i)
		u.expr += "#m." + nk
		u.names[nk] = name
	}
	_, err := s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	var cf *types.ConditionalCheckFailedException
	if errors.As(err, &cf) {
		return nil
	}
	return err
}

// forgetKey drops what this Store knows locally of key: its deny-cache entry, GCRA hint, cached
// closed slots, and what its lease pools learnt of their shards.
func (s *Store) forgetKey(key bucket.Key) {
	if s.deny != nil {
		s.deny.mu.Lock()
		delete(s.deny.m, key)
		s.deny.mu.Unlock()
	}
	s.hints.mu.Lock()
	delete(s.hints.m, key)
	s.hints.mu.Unlock()
	s.slots.mu.Lock()
	for sk := range s.slots.m {
		if sk.key == key {
			delete(s.slots.m, sk)
		}
	}
	s.slots.mu.Unlock()
	s.ls.mu.Lock()
	var pools []*pool
	for lk, p := range s.ls.pools {
		if lk.key == key {
			pools = append(pools, p)
		}
	}
	s.ls.mu.Unlock()
	for _, p := range pools {
		p.mu.Lock()
		p.emptyUntil, p.resetAt, p.fails = 0, 0, 0
		for i := range p.shards {
			sh := &p.shards[i]
			sh.emptyUntil, sh.tat, sh.used, sh.usedIn, sh.empty = 0, 0, 0, 0, false
		}
		p.mu.Unlock()
	}
}

// PutExemption stores an exemption (its JSON) in the shared exemptions item, where every
// replica's Exemptions reads it.
func (s *Store) PutExemption(ctx context.Context, id string, data []byte, expires time.Time) error {
	return s.putMapEntry(ctx, exemptionsItem, attrExemptions, id, &types.AttributeValueMemberS{Value: string(data)}, expires.UnixNano())
}

// DeleteExemption removes exemption id from the shared item.
func (s *Store) DeleteExemption(ctx context.Context, id string) error {
	return s.removeMapEntries(ctx, exemptionsItem, attrExemptions, []string{id})
}

// Exemptions reads the shared exemptions and resets (one consistent read of both items),
// applies the resets this replica has not applied yet (see forgetKey), prunes resets older than
// resetMemory, and returns every exemption's JSON. The console calls it once a second.
func (s *Store) Exemptions(ctx context.Context) ([][]byte, error) {
	items, err := s.adminRead(ctx, []string{resetsItem, exemptionsItem})
	if err != nil {
		return nil, fmt.Errorf("dynamo: admin read: %w", err)
	}
	n := s.now().UnixNano()
	var stale []string
	if m, ok := items[resetsItem][attrResets].(*types.AttributeValueMemberM); ok {
		st := s.admin()
		for hexKey, av := range m.Value {
			nv, ok := av.(*types.AttributeValueMemberN)
			if !ok {
				continue
			}
			at, err := strconv.ParseInt(nv.Value, 10, 64)
			if err != nil {
				continue
			}
			if n-at > int64(resetMemory) {
				stale = append(stale, hexKey)
				continue
			}
			st.mu.Lock()
			fresh := at > st.applied[hexKey]
			if fresh {
				st.applied[hexKey] = at
			}
			st.mu.Unlock()
			if key, ok := parseKey(hexKey); fresh && ok {
				s.forgetKey(key)
			}
		}
	}
	if len(stale) > 0 {
		_ = s.removeMapEntries(ctx, resetsItem, attrResets, stale) // pruned again next time
	}
	var out [][]byte
	if m, ok := items[exemptionsItem][attrExemptions].(*types.AttributeValueMemberM); ok {
		for _, av := range m.Value {
			if sv, ok := av.(*types.AttributeValueMemberS); ok {
				out = append(out, []byte(sv.Value))
			}
		}
	}
	return out, nil
}

// adminRead reads items (at most 100: a sliding window's 11 slots, a pool's shards, the two
// shared items) with one consistent BatchGetItem, counted as op "admin" so that the decisions'
// own batch_get counts stay theirs. Keys left unprocessed (throttling) are an error: the
// console's next read, a second later, tries again.
func (s *Store) adminRead(ctx context.Context, pks []string) (map[string]map[string]types.AttributeValue, error) {
	keys := make([]map[string]types.AttributeValue, len(pks))
	for i, pk := range pks {
		keys[i] = map[string]types.AttributeValue{attrPK: &types.AttributeValueMemberS{Value: pk}}
	}
	s.m.requests.WithLabelValues(opAdmin).Inc()
	res, err := s.api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
		s.table: {Keys: keys, ConsistentRead: aws.Bool(true)}}})
	if err != nil {
		s.m.errors.WithLabelValues(opAdmin).Inc()
		return nil, err
	}
	if len(res.UnprocessedKeys) > 0 {
		return nil, errors.New("some items were not read (throttled)")
	}
	out := make(map[string]map[string]types.AttributeValue, len(pks))
	for _, item := range res.Responses[s.table] {
		if pk, ok := item[attrPK].(*types.AttributeValueMemberS); ok {
			out[pk.Value] = item
		}
	}
	return out, nil
}

// parseKey parses a bucket key from its hex form.
func parseKey(h string) (bucket.Key, bool) {
	var k bucket.Key
	if len(h) != 2*len(k) {
		return k, false
	}
	for i := range k {
		v, err := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		if err != nil {
			return k, false
		}
		k[i] = byte(v)
	}
	return k, true
}
