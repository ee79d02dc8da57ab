package dynamo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/lease"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// The operators' console on the shared store (package console): Peek reads a key's items without
// writing, Reset empties them, and both the resets and the exemptions reach every replica
// through two items that each replica reads once a second (Exemptions):
//
//	pk = ratelimit-proxy#resets      r (M: bucket key hex -> reset instant, Unix ns)
//	pk = ratelimit-proxy#exemptions  i (M: exemption id -> its expiry, Unix ns; see PutExemption)
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
	applied map[string]int64  // bucket key hex -> the newest reset applied here
	data    map[string][]byte // exemption id -> its JSON, as read from its item (never changes)
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
// items, as memstore.Store.Peek describes. For a leased pool, units leased to replicas count as
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
			tat, _, _ := schema.Number(items[pk], schema.Tat)
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
			used, _, _ := schema.Number(items[pk], schema.Count)
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
		tat, _, err := schema.Number(items[pks[0]], schema.Tat)
		if err != nil {
			return bucket.Result{}, fmt.Errorf("dynamo: peek: %w", err)
		}
		r = gcraResult(l, tat, n, 1)
		if r.Allowed {
			r.Remaining++
		}
		r.Reset = time.Duration(max(tat-n, 0))
	case bucket.FixedWindow, bucket.Quota:
		used, _, _ := schema.Number(items[pks[0]], schema.Count)
		r = fixedResult(l, used, n, 1)
		if r.Allowed {
			r.Remaining++
		}
	case bucket.SlidingWindow:
		var counts slotCounts
		for i, pk := range pks {
			counts[i], _, _ = schema.Number(items[pk], schema.Count)
		}
		r = slidingResult(l, slotOf(l, n), &counts, n, 1)
		if r.Allowed {
			r.Remaining++
		}
	case bucket.Concurrency:
		used, _, _ := schema.Number(items[pks[0]], schema.Count)
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
		return lease.Items(c, n)
	}
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		return []string{schema.BucketKey(key)}
	case bucket.FixedWindow:
		return []string{schema.WindowKey(key, fixedEnd(l, n)-int64(l.Window))}
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
// give-back finds its write gone from the chain and gives nothing; a concurrency slot's release
// finds its slot gone (emptySlots removes every slot held when the reset began) and changes
// nothing.
func (s *Store) Reset(ctx context.Context, now time.Time, c bucket.Charge) error {
	n := now.UnixNano()
	for _, pk := range peekItems(c, n) {
		if err := s.emptyItem(ctx, pk, c); err != nil {
			return fmt.Errorf("dynamo: reset %s: %w", c.Key, err)
		}
	}
	hexKey := c.Key.String()
	if err := s.putMapEntry(ctx, resetsItem, attrResets, hexKey, schema.Num(n), n); err != nil {
		return fmt.Errorf("dynamo: reset %s: %w", c.Key, err)
	}
	s.forgetKey(c.Key)
	st := s.admin()
	st.mu.Lock()
	st.applied[hexKey] = max(st.applied[hexKey], n)
	st.mu.Unlock()
	return nil
}

// emptyItem empties one item of c's key. A bucket's or a counter's write reads nothing first, so
// it needs no condition: it lands at one instant, before or after any take. A concurrency item's
// slots must be named to be removed, so its reset reads them first (emptySlots).
func (s *Store) emptyItem(ctx context.Context, pk string, c bucket.Charge) error {
	var u update
	switch {
	case strings.Contains(pk, "#g"):
		// lv too: a lease give-back lands only while lv holds its own lease write's marker, so
		// one in flight at the reset gives nothing to the emptied bucket.
		u = update{expr: "REMOVE #tat, #lv", names: map[string]string{"#tat": schema.Tat, "#lv": schema.LeaseWrite}}
		for i := 1; i <= chainLen; i++ {
			w, cc := "#w"+strconv.Itoa(i), "#c"+strconv.Itoa(i)
			u.expr += ", " + w + ", " + cc
			u.names[w], u.names[cc] = chainW(i), chainC(i)
		}
	case c.Limit.Algorithm == bucket.Concurrency:
		return s.emptySlots(ctx, pk)
	default: // a counter: fixed window, quota, sliding-window slot, leased window shard
		u = update{expr: "SET #count = :zero", names: map[string]string{"#count": schema.Count},
			values: map[string]types.AttributeValue{":zero": schema.Num(0)}}
	}
	_, err := s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	return err
}

// maxResetRounds bounds the reads of a concurrency reset (emptySlots): each round but the last
// is ended by a release or a reap of a slot it meant to remove, which removes that slot.
const maxResetRounds = 64

// emptySlots removes every slot that concurrency item pk holds when the reset reads it, in writes
// of at most maxReap slots. Each write takes exactly its own slots off the count and is
// conditioned on every one of them still being there, so the count stays the number of slot
// attributes whatever lands between the read and the write: a take meanwhile keeps its slot and
// its unit of count (it was admitted after the reset began, which is not forgotten), and a
// release or a reap meanwhile fails the write, which then reads the item again and removes what
// is left of the slots first read. A re-sent write that had landed fails its condition the same
// way. So no slot outlives a reset while its unit of count is gone, and no release can take the
// count below zero.
func (s *Store) emptySlots(ctx context.Context, pk string) error {
	var first map[string]bool // the slots held when the reset began
	for range maxResetRounds {
		items, err := s.adminRead(ctx, []string{pk})
		if err != nil {
			return err
		}
		var names []string
		for name := range items[pk] {
			if isSlotAttr(name) && (first == nil || first[name]) {
				names = append(names, name)
			}
		}
		if first == nil {
			first = make(map[string]bool, len(names))
			for _, name := range names {
				first[name] = true
			}
		}
		if len(names) == 0 {
			return nil
		}
		sort.Strings(names)
		raced := false
		for start := 0; start < len(names) && !raced; start += maxReap {
			part := names[start:min(start+maxReap, len(names))]
			_, err := s.updateItem(ctx, opAdmin, pk, removeSlots(part), types.ReturnValueNone)
			var ccf *types.ConditionalCheckFailedException
			switch {
			case errors.As(err, &ccf):
				raced = true // a slot of part left meanwhile: read again
			case err != nil:
				return err
			}
		}
		if !raced {
			return nil
		}
	}
	return fmt.Errorf("slots kept changing under %d reads: %w", maxResetRounds, ErrContention)
}

// removeSlots is the write that removes the slot attributes names and their units of count,
// while every one of them is still there.
func removeSlots(names []string) update {
	u := update{
		names:  map[string]string{"#count": schema.Count},
		values: map[string]types.AttributeValue{":minus": schema.Num(-int64(len(names)))},
	}
	remove, cond := make([]string, len(names)), make([]string, len(names))
	for i, name := range names {
		nk := "#l" + strconv.Itoa(i)
		u.names[nk] = name
		remove[i], cond[i] = nk, "attribute_exists("+nk+")"
	}
	u.expr = "ADD #count :minus REMOVE " + strings.Join(remove, ", ")
	u.cond = strings.Join(cond, " AND ")
	return u
}

// isSlotAttr reports whether attribute name of a concurrency item is a slot's (l and the slot
// id in hex).
func isSlotAttr(name string) bool {
	if len(name) < 2 || !strings.HasPrefix(name, attrLeasePrefix) {
		return false
	}
	_, err := strconv.ParseUint(name[len(attrLeasePrefix):], 16, 64)
	return err == nil
}

// maxPrune bounds the entries one prune write removes (the expression's size); the rest are
// pruned by the next reads.
const maxPrune = 50

// opAdmin labels the console's calls in the store metrics.
const opAdmin = "admin"

// putMapEntry sets entry name of map attribute attr of item pk to v, creating the map when the
// item has none.
func (s *Store) putMapEntry(ctx context.Context, pk, attr, name string, v types.AttributeValue, n int64) error {
	u := update{expr: "SET #m.#k = :v, #ttl = :ttl", cond: "attribute_exists(#m)",
		names:  map[string]string{"#m": attr, "#k": name, "#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":v": v, ":ttl": schema.TTLAt(n + int64(resetMemory))}}
	_, err := s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	var cf *types.ConditionalCheckFailedException
	if !errors.As(err, &cf) {
		return err
	}
	// No map yet: create it with the entry, unless another replica just did.
	u = update{expr: "SET #m = :m, #ttl = :ttl", cond: "attribute_not_exists(#m)",
		names: map[string]string{"#m": attr, "#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{name: v}},
			":ttl": schema.TTLAt(n + int64(resetMemory))}}
	_, err = s.updateItem(ctx, opAdmin, pk, u, types.ReturnValueNone)
	if errors.As(err, &cf) {
		return s.putMapEntry(ctx, pk, attr, name, v, n)
	}
	return err
}

// removeMapEntries removes the entries of map attribute attr of item pk that still hold the
// values read (a prune decided from a read): one write, conditioned on every entry being as it
// was read, so that an entry written again meanwhile (a newer reset of the key) is never lost.
// When the condition fails, nothing is removed: the next read prunes again.
func (s *Store) removeMapEntries(ctx context.Context, pk, attr string, read map[string]types.AttributeValue) error {
	if len(read) == 0 {
		return nil
	}
	u := update{names: map[string]string{"#m": attr}, values: map[string]types.AttributeValue{}}
	var remove, cond []string
	// In name order, not Go's map order: the same prune sends the same request (a replayed
	// simulator seed sends the same bytes); a prune is a few entries, on the console's path.
	for i, name := range slices.Sorted(maps.Keys(read)) {
		nk, vk := "#k"+strconv.Itoa(i), ":v"+strconv.Itoa(i)
		u.names[nk], u.values[vk] = name, read[name]
		remove = append(remove, "#m."+nk)
		cond = append(cond, "#m."+nk+" = "+vk)
	}
	u.expr, u.cond = "REMOVE "+strings.Join(remove, ", "), strings.Join(cond, " AND ")
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
	s.ls.Forget(key)
}

// Exemptions on the table. Each exemption is an item of its own, `ratelimit-proxy#exemption#<id>`
// (d: its JSON), whose ttl is its own expiry's: nothing written after it can end it early. The
// index item `ratelimit-proxy#exemptions` lists them (i: M id -> expiry, Unix ns, about 31 bytes
// an entry) and has no ttl: an entry leaves it when the exemption is deleted or, once expired,
// pruned. Every replica reads the index once a second and the items of the ids it has not read
// yet (an exemption never changes once written), so a steady set costs one small read a second.
// The index holds at most max entries (admin.max_exemptions): the write that adds an id is
// conditioned on the index's size, so no race of replicas can pass the bound, and a full index
// first prunes what has expired. Versions before the index kept every exemption's JSON in the
// index item's map x; those entries are still read, and pruned when they expire.
const (
	exemptionPrefix = "ratelimit-proxy#exemption#"
	attrIndex       = "i"
	attrData        = "d"
	// MaxExemptionData bounds one exemption's stored JSON (the console bounds its reason to
	// 1 KB, which JSON escaping may make 6 KB; the rest is ids, names and instants).
	MaxExemptionData = 8 << 10
	// MaxExemptions bounds admin.max_exemptions: the index item stays far under DynamoDB's
	// 400 KB item limit (about 155 KB).
	MaxExemptions = 5000
)

// PutExemption stores an exemption (its JSON) where every replica's Exemptions reads it, unless
// most exemptions are held already (those expired are pruned first): then stored is false.
func (s *Store) PutExemption(ctx context.Context, id string, data []byte, expires time.Time, most int) (stored bool, err error) {
	if len(data) > MaxExemptionData {
		return false, fmt.Errorf("dynamo: exemption %s: %d bytes, at most %d", id, len(data), MaxExemptionData)
	}
	exp := expires.UnixNano()
	// The exemption's own item first: an index entry always has its item, and an item whose
	// index entry was refused (full) costs nothing and goes at its ttl. Re-sending it is harmless.
	u := update{expr: "SET #d = :d, #ttl = :ttl", names: map[string]string{"#d": attrData, "#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":d": &types.AttributeValueMemberS{Value: string(data)}, ":ttl": schema.TTLAt(exp)}}
	if _, err := s.updateItem(ctx, opAdmin, exemptionPrefix+id, u, types.ReturnValueNone); err != nil {
		return false, fmt.Errorf("dynamo: exemption %s: %w", id, err)
	}
	names := map[string]string{"#i": attrIndex, "#k": id, "#ttl": schema.TTL}
	add := update{expr: "SET #i.#k = :x REMOVE #ttl", names: names,
		cond:   "attribute_exists(#i) AND size(#i) < :max AND attribute_not_exists(#i.#k)",
		values: map[string]types.AttributeValue{":x": schema.Num(exp), ":max": schema.Num(int64(most))}}
	create := update{expr: "SET #i = :m REMOVE #ttl", cond: "attribute_not_exists(#i)",
		names:  map[string]string{"#i": attrIndex, "#ttl": schema.TTL},
		values: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{id: schema.Num(exp)}}}}
	for range maxRounds {
		_, err := s.updateItem(ctx, opAdmin, exemptionsItem, add, types.ReturnValueNone)
		var ccf *types.ConditionalCheckFailedException
		if !errors.As(err, &ccf) {
			if err != nil {
				return false, fmt.Errorf("dynamo: exemption %s: %w", id, err)
			}
			return true, nil
		}
		idx, ok := ccf.Item[attrIndex].(*types.AttributeValueMemberM)
		switch {
		case !ok: // no index yet: create it with the entry, unless another replica just did
			_, err := s.updateItem(ctx, opAdmin, exemptionsItem, create, types.ReturnValueNone)
			if !errors.As(err, &ccf) {
				if err != nil {
					return false, fmt.Errorf("dynamo: exemption %s: %w", id, err)
				}
				return true, nil
			}
		case sameNumber(idx.Value[id], exp):
			return true, nil // a re-sent add whose first attempt landed
		case len(idx.Value) >= most:
			expired := expiredEntries(idx.Value, s.now().UnixNano())
			if len(expired) == 0 {
				return false, nil
			}
			if err := s.removeMapEntries(ctx, exemptionsItem, attrIndex, expired); err != nil {
				return false, fmt.Errorf("dynamo: exemption %s: prune: %w", id, err)
			}
		}
	}
	return false, fmt.Errorf("dynamo: exemption %s: %w", id, ErrContention)
}

// sameNumber reports whether av is the number v.
func sameNumber(av types.AttributeValue, v int64) bool {
	nv, ok := av.(*types.AttributeValueMemberN)
	return ok && nv.Value == strconv.FormatInt(v, 10)
}

// expiredEntries returns the entries of an index whose expiry is at or before now (at most
// maxPrune), with the values read, for removeMapEntries.
func expiredEntries(m map[string]types.AttributeValue, now int64) map[string]types.AttributeValue {
	out := map[string]types.AttributeValue{}
	for id, av := range m {
		nv, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			continue
		}
		if exp, err := strconv.ParseInt(nv.Value, 10, 64); err == nil && exp <= now && len(out) < maxPrune {
			out[id] = av
		}
	}
	return out
}

// DeleteExemption removes exemption id from the index; found is false when the index held no
// such exemption, or held it expired. Its own item goes at its ttl.
func (s *Store) DeleteExemption(ctx context.Context, id string) (found bool, err error) {
	for _, attr := range []string{attrIndex, attrExemptions} { // the index, then the older map
		u := update{expr: "REMOVE #m.#k", cond: "attribute_exists(#m.#k)", names: map[string]string{"#m": attr, "#k": id}}
		out, err := s.updateItem(ctx, opAdmin, exemptionsItem, u, types.ReturnValueUpdatedOld)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case errors.As(err, &ccf):
			continue
		case err != nil:
			return false, fmt.Errorf("dynamo: delete exemption %s: %w", id, err)
		}
		if attr == attrExemptions {
			return true, nil
		}
		m, _ := out.Attributes[attrIndex].(*types.AttributeValueMemberM)
		var exp int64
		if m != nil {
			exp, _, _ = schema.Number(m.Value, id)
		}
		return exp > s.now().UnixNano(), nil
	}
	return false, nil
}

// Exemptions reads the shared resets and the exemptions' index (one consistent read of both
// items), applies the resets this replica has not applied yet (see forgetKey), prunes resets
// older than resetMemory and expired exemptions, and returns the JSON of every exemption that
// has not expired. The console calls it once a second.
func (s *Store) Exemptions(ctx context.Context) ([][]byte, error) {
	items, err := s.adminRead(ctx, []string{resetsItem, exemptionsItem})
	if err != nil {
		return nil, fmt.Errorf("dynamo: admin read: %w", err)
	}
	n := s.now().UnixNano()
	stale := map[string]types.AttributeValue{}
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
				if len(stale) < maxPrune {
					stale[hexKey] = av
				}
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
	_ = s.removeMapEntries(ctx, resetsItem, attrResets, stale) // pruned again next time
	out, err := s.liveExemptions(ctx, items[exemptionsItem], n)
	if err != nil {
		return nil, fmt.Errorf("dynamo: admin read: %w", err)
	}
	return out, nil
}

// liveExemptions returns the JSON of the exemptions that index (the index item as read) lists
// unexpired at n, reading the items of the ids this Store has not read before, and prunes the
// expired entries from the index (each removal conditioned on the entry read).
func (s *Store) liveExemptions(ctx context.Context, index map[string]types.AttributeValue, n int64) ([][]byte, error) {
	var out [][]byte
	if m, ok := index[attrExemptions].(*types.AttributeValueMemberM); ok { // the older layout
		expired := map[string]types.AttributeValue{}
		for id, av := range m.Value {
			sv, ok := av.(*types.AttributeValueMemberS)
			if !ok {
				continue
			}
			var e struct {
				ExpiresAt time.Time `json:"expires_at"`
			}
			if json.Unmarshal([]byte(sv.Value), &e) == nil && !e.ExpiresAt.IsZero() && e.ExpiresAt.UnixNano() <= n {
				if len(expired) < maxPrune {
					expired[id] = av
				}
				continue
			}
			out = append(out, []byte(sv.Value))
		}
		_ = s.removeMapEntries(ctx, exemptionsItem, attrExemptions, expired) // pruned again next time
	}
	idx, _ := index[attrIndex].(*types.AttributeValueMemberM)
	if idx == nil {
		return out, nil
	}
	_ = s.removeMapEntries(ctx, exemptionsItem, attrIndex, expiredEntries(idx.Value, n)) // pruned again next time
	st := s.admin()
	st.mu.Lock()
	live := make(map[string][]byte, len(idx.Value))
	var missing []string
	for id, av := range idx.Value {
		nv, ok := av.(*types.AttributeValueMemberN)
		if !ok {
			continue
		}
		if exp, err := strconv.ParseInt(nv.Value, 10, 64); err != nil || exp <= n {
			continue
		}
		d, ok := st.data[id]
		live[id] = d
		if !ok {
			missing = append(missing, exemptionPrefix+id)
		}
	}
	st.mu.Unlock()
	for start := 0; start < len(missing); start += maxBatchGet {
		items, err := s.adminRead(ctx, missing[start:min(start+maxBatchGet, len(missing))])
		if err != nil {
			return nil, err
		}
		for pk, item := range items {
			if sv, ok := item[attrData].(*types.AttributeValueMemberS); ok {
				live[strings.TrimPrefix(pk, exemptionPrefix)] = []byte(sv.Value)
			}
		}
	}
	st.mu.Lock()
	st.data = make(map[string][]byte, len(live)) // forgets the ids that left the index
	for id, d := range live {
		if d != nil { // an item not read yet (throttled, or not yet visible) is read next time
			st.data[id] = d
			out = append(out, d)
		}
	}
	st.mu.Unlock()
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
