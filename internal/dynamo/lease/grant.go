package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo/schema"
)

// Grants: the conditional write that takes units from one shard, and the grant it yields.

// leaseShard leases from shard i: want units if the shard has that many, else all it has if that
// is at least least (see pool.least). nil, nil: the shard is empty until its emptyUntil.
func (p *pool) leaseShard(ctx context.Context, i int, n, want, least, shift int64) (*grant, error) {
	p.mu.Lock()
	sh := p.shards[i]
	slow := p.slow()
	p.mu.Unlock()
	// The floor of the lease's places: want units must still fit above it (n + tauL). When
	// they would not, the lease is cut rather than placed lower: units placed below the shift
	// would die before a lease that takes a round trip arrives (see shift), and fewer units
	// that arrive alive are worth more than many that do not.
	f := n
	if p.gcra {
		if room := (sh.tauL - shift) / sh.t; room >= 1 && want > room {
			want = room
		}
		f = n + max(0, min(shift, sh.tauL-want*sh.t))
	}
	pk := p.itemKey(i, n)
	// What the shard holds as far as we know picks the first form; a failed condition tells
	// what it holds, and the next form fits that.
	avail := sh.known(p, n)
	if sh.empty && !slow {
		// The shard was empty when last tried, and other replicas poll it too: a read, which
		// neither takes the item's write capacity nor costs a write, tells whether a write
		// would find least units, before one is sent. Not on a slow store (see slow): there a
		// read's round trip costs more places than the write it may save.
		sent := time.Now()
		item, err := p.ls.t.Read(ctx, pk)
		p.sampled(sent)
		if err != nil {
			return nil, err
		}
		a, err := p.learn(&sh, item, n, f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", pk, err)
		}
		if avail = a; avail < least {
			p.emptied(i, &sh, n, least)
			return nil, nil
		}
	}
	for round := 0; round < 3; round++ {
		fm := p.leaseForm(&sh, n, f, want, least, avail, slow)
		if p.gcra {
			// Every write to a token bucket's shard leaves its own marker: a give-back of
			// its units lands only while it is still there (see refundGrant).
			fm.mark = p.ls.rnd.Marker()
			fm.u.Expr += ", #lv = :lv"
			fm.u.Names["#lv"] = schema.LeaseWrite
			fm.u.Values[":lv"] = schema.Unum(fm.mark)
		}
		// Sent once (noRetry): a lease write is not idempotent (form (b) and a window's ADD take
		// again; form (a) and a drain fail their condition and the units are lost), so the
		// SDK must not re-send one whose answer was lost. A throttled write was not applied and
		// is retried (Table.Lease).
		sent := time.Now()
		out, err := p.ls.t.Lease(ctx, pk, fm.u, fm.rv)
		p.sampled(sent)
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return p.granted(i, pk, n, fm, out)
		case errors.As(err, &ccf):
			a, ferr := p.learn(&sh, ccf.Item, n, f)
			if ferr != nil {
				return nil, fmt.Errorf("update %s: %w", pk, ferr)
			}
			if avail = a; avail >= least {
				continue
			}
			p.emptied(i, &sh, n, least)
			return nil, nil
		default:
			if !answered(err) {
				// It may have been applied: up to what it asked for is held by no one until
				// its places pass or the window ends.
				p.ls.m.Units.WithLabelValues(unitsUnanswered).Add(float64(fm.most()))
			}
			return nil, fmt.Errorf("update %s: %w", pk, err)
		}
	}
	return nil, nil // raced three times: the next renewal tries again
}

// itemKey is shard i's item at n: leased items are apart from the unleased ones, so that
// switching a policy's lease mode never mixes the two arithmetics on one item.
func (p *pool) itemKey(i int, n int64) string {
	sfx := "#l" + strconv.Itoa(i)
	if p.gcra {
		return schema.BucketKey(p.base) + sfx
	}
	l := p.key.limit
	return schema.WindowKey(p.base, windowEnd(l, n)-int64(l.Window)) + sfx
}

// form is one lease write: its update, what it returns, and how to read the units it took.
type form struct {
	u     Update
	rv    types.ReturnValue
	drain bool  // took everything up to target: units = target - old (ALL_OLD)
	edge  bool  // a token bucket's drain from the higher of tat and floor, whatever tat was
	m     int64 // otherwise: exactly m units (ALL_NEW)
	floor int64 // an edge drain's lowest place but one (on the grid of T)
	// target is where a drain leaves tat (GCRA) or the count (window); want the most it takes.
	target, want int64
	mark         uint64 // GCRA: the marker the write leaves in lv
}

// most is the most units f can take.
func (f form) most() int64 {
	if f.drain {
		return f.want
	}
	return f.m
}

// onGrid is x on the grid of t (multiples of t since the epoch): the last point at or below it,
// or with up the first at or above it. A token bucket's edge drains place tat on this grid, so
// that the places of writes that find tat where another such write left it are whole units.
func onGrid(x, t int64, up bool) int64 {
	g := x - x%t
	if up && g < x {
		g += t
	}
	return g
}

// answered reports whether err is DynamoDB's own answer (the call was decided: a failed
// condition, throttling, a validation error), rather than a transport error or a deadline, after
// which the call may or may not have been applied.
func answered(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae)
}

// unknown marks a shard whose content is not known.
const unknown = -1

// known is how many units the shard holds at n as far as this Store knows, or unknown.
func (sh *shard) known(p *pool, n int64) int64 {
	if p.gcra {
		if sh.tat < n {
			return unknown // idle, or never seen: an idle write finds out
		}
		return max(0, (n+sh.tauL-sh.tat)/sh.t)
	}
	if start := windowEnd(p.key.limit, n); sh.usedIn != start {
		return unknown
	}
	return max(0, sh.count-sh.used)
}

// refilled is when the shard will hold u units again if nobody else leases from it: for a
// window, when it ends, or sooner if another replica gives units back, which a poll after a
// short wait finds (the wait then grows while the window stays full).
func (sh *shard) refilled(p *pool, n, u int64) int64 {
	if p.gcra {
		return max(n+1, sh.tat+u*sh.t-sh.tauL)
	}
	return min(windowEnd(p.key.limit, n), n+p.horizon/16)
}

// leaseForm picks the write for a shard holding avail units (or unknown). A token bucket's
// units must sit within n + tauL, so that each can be held ttl after the write and still conform
// when spent (see docs/dynamodb-internals.md, "Leases"); a window's within the shard's count.
//
//   - want fits, or nothing is known: exactly want units (GCRA form (a) when idle, (b) when
//     not; window ADD want);
//   - fewer than want but at least least: a drain, which takes every unit the shard holds
//     (GCRA SET tat = the last place that fits, on the grid of T; window SET count = the
//     shard's count) while that is from least to want units, in one write whatever others
//     took since we looked.
func (p *pool) leaseForm(sh *shard, n, f, want, least, avail int64, slow bool) form {
	drain := avail != unknown && avail < want
	if p.gcra {
		if edge := onGrid(n+sh.tauL, sh.t, false); want >= (edge-onGrid(f, sh.t, true))/sh.t || avail == unknown && slow {
			// The lease wants every place it may take, or, on a slow store, nothing is known
			// of the shard (not seen within a TTL: others may have leased from it since, or
			// nobody did), where a write of the wrong form would cost a second round trip: up
			// to the edge, from tat or the floor, whichever is higher, in one write whatever
			// others took since we looked, and whatever tat is (idle or not). It fails only
			// when fewer than least are left. Its floor is not f but the lowest place still
			// alive at n: the places between a lagging tat and f would otherwise be skipped
			// (lost to everyone), and taken they serve whatever requests come before they
			// die, however late the lease lands.
			floor := onGrid(n-p.ttl+sh.t, sh.t, true)
			return form{drain: true, edge: true, target: edge, floor: floor, want: (edge - floor) / sh.t, rv: types.ReturnValueAllOld, u: Update{
				Expr:   "SET #tat = :target, #ttl = :ttl",
				Cond:   "attribute_not_exists(#tat) OR #tat <= :most",
				Names:  map[string]string{"#tat": schema.Tat, "#ttl": schema.TTL},
				Values: map[string]types.AttributeValue{":target": schema.Num(edge), ":most": schema.Num(edge - least*sh.t), ":ttl": schema.TTLAt(n + sh.tau)},
			}}
		}
		if sh.tat < f || !drain && avail != unknown {
			return form{u: leaseGCRA(n, f, sh.t, sh.tauL, want, sh.tat >= f), rv: types.ReturnValueAllNew, m: want}
		}
		// Busy when last seen, but how much it holds now is not known (others lease from it
		// too) or is less than want: the places from tat to the edge, while they are from
		// least to want (a tat below the floor, lagging, fails and is learnt).
		target := onGrid(n+sh.tauL, sh.t, false)
		return form{drain: true, target: target, want: want, rv: types.ReturnValueAllOld, u: Update{
			Expr:   "SET #tat = :target, #ttl = :ttl",
			Cond:   "#tat >= :fewest AND #tat <= :most",
			Names:  map[string]string{"#tat": schema.Tat, "#ttl": schema.TTL},
			Values: map[string]types.AttributeValue{":target": schema.Num(target), ":most": schema.Num(target - least*sh.t), ":fewest": schema.Num(max(f, target-want*sh.t)), ":ttl": schema.TTLAt(n + sh.tau)},
		}}
	}
	ttl := schema.TTLAt(windowEnd(p.key.limit, n))
	if !drain {
		return form{u: windowAdd(sh.count, want, ttl), rv: types.ReturnValueAllNew, m: want}
	}
	return form{drain: true, target: sh.count, want: want, rv: types.ReturnValueAllOld, u: Update{
		Expr:   "SET #count = :target, #ttl = :ttl",
		Cond:   "#count <= :most AND #count >= :fewest",
		Names:  map[string]string{"#count": schema.Count, "#ttl": schema.TTL},
		Values: map[string]types.AttributeValue{":target": schema.Num(sh.count), ":most": schema.Num(sh.count - least), ":fewest": schema.Num(sh.count - want), ":ttl": ttl},
	}}
}

// leaseGCRA is a lease's token-bucket write at instant n: m units placed at or above the floor
// f (f >= n), the last of them at most n + tauL. Form (a) (formB false), for a bucket idle at the
// floor: tat = f + m*T. Form (b): tat += m*T while tat >= f. With f = n these are the store's
// GCRA forms (without its chain of writes). Exact for any f in [n, n + tauL - m*T]: a unit at
// place θ <= n + tauL spent at s >= n has θ <= s + tauL, and it is spent by θ - T + ttl; a
// higher floor only skips places (the bucket is left as if they had been taken) and moves each
// unit's deadline later with its place.
func leaseGCRA(n, f, t, tauL, m int64, formB bool) Update {
	ttl := schema.TTLAt(n + tauL) // tat never passes n + tauL
	if !formB {
		return Update{
			Expr:   "SET #tat = :next, #ttl = :ttl",
			Cond:   "attribute_not_exists(#tat) OR #tat < :floor",
			Names:  map[string]string{"#tat": schema.Tat, "#ttl": schema.TTL},
			Values: map[string]types.AttributeValue{":next": schema.Num(f + m*t), ":floor": schema.Num(f), ":ttl": ttl},
		}
	}
	return Update{
		Expr:   "SET #tat = #tat + :t, #ttl = :ttl",
		Cond:   "#tat >= :floor AND #tat <= :last",
		Names:  map[string]string{"#tat": schema.Tat, "#ttl": schema.TTL},
		Values: map[string]types.AttributeValue{":t": schema.Num(m * t), ":floor": schema.Num(f), ":last": schema.Num(n + tauL - m*t), ":ttl": ttl},
	}
}

// windowAdd is a lease's fixed-window write, the store's counter write (countWrite) of m at
// once: it adds m to the shard's count while that stays at most limit, the shard's part of the
// window's count. With limit < m (a shard whose part is 0) the condition always fails, so the
// write still reports the current count without changing it.
func windowAdd(limit, m int64, ttl types.AttributeValue) Update {
	u := Update{
		Expr:   "ADD #count :m SET #ttl = :ttl",
		Cond:   "attribute_not_exists(#count) OR #count <= :last",
		Names:  map[string]string{"#count": schema.Count, "#ttl": schema.TTL},
		Values: map[string]types.AttributeValue{":m": schema.Num(m), ":last": schema.Num(limit - m), ":ttl": ttl},
	}
	if limit < m {
		u.Cond = "#count <= :last"
	}
	return u
}

// learn reads a failed lease condition's item (as it was) into sh and returns how many units
// a lease at n can take from it above the floor f.
func (p *pool) learn(sh *shard, old map[string]types.AttributeValue, n, f int64) (int64, error) {
	if p.gcra {
		tat, ok, err := schema.Number(old, schema.Tat)
		if err != nil {
			return 0, err
		}
		if !ok || tat < n {
			sh.tat = 0
		} else {
			sh.tat = tat
		}
		return max(0, (n+sh.tauL-max(tat, f))/sh.t), nil
	}
	c, _, err := schema.Number(old, schema.Count)
	if err != nil {
		return 0, err
	}
	sh.used, sh.usedIn = c, windowEnd(p.key.limit, n)
	return max(sh.count-c, 0), nil
}

// chunkSpan is how much of a token bucket's schedule one chunk of a lease spans, in TTLs.
const chunkSpan = 4

// chunks cuts g, a lease write's grant, into the grants the pool spends from (the caller holds
// p.mu). A token bucket's unit j (place base + j*T) may be spent until its place - T + ttl: one
// grant for the whole write would have to die with its first unit, and on a slow store, whose
// leases arrive late in their first units' lives, its later units with it. So the write is cut
// into chunks spanning a quarter TTL of places each, and each chunk expires with its own first
// unit: a lease lives as long as its units, to within a quarter TTL. Within a chunk any unit
// may stand for any other (all live until the chunk expires), so spending and giving back
// count units. A window's units all live until its end: one grant.
func (p *pool) chunks(g grant) []grant {
	g.size, g.write, g.last = g.units, g.id, true
	if !p.gcra || g.units <= 1 {
		return []grant{g}
	}
	t := p.shards[g.shard].t
	c := max(1, p.ttl/(chunkSpan*t)) // units per chunk
	base := g.tail - g.units*t       // the place before the first unit
	out := make([]grant, 0, (g.units+c-1)/c)
	for off := int64(0); off < g.units; off += c {
		k := g
		if off > 0 {
			p.nextID++
			k.id = p.nextID
		}
		k.units = min(c, g.units-off)
		k.size = k.units
		k.tail = base + (off+k.units)*t
		k.expires = base + off*t + p.ttl
		k.last = off+k.units == g.units
		if !k.last {
			k.end = k.tail // a refund of this chunk needs the later ones back first
		}
		out = append(out, k)
	}
	return out
}

// granted builds the grant of lease write f, applied at n, from the item it returned.
func (p *pool) granted(i int, pk string, n int64, f form, item map[string]types.AttributeValue) (*grant, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sh := &p.shards[i]
	p.nextID++
	g := &grant{id: p.nextID, shard: i, at: n, pk: pk, mark: f.mark}
	if p.gcra {
		tat, ok, err := schema.Number(item, schema.Tat)
		if err != nil || !ok && !f.edge {
			return nil, fmt.Errorf("update %s: no tat in the write's answer (%v)", pk, err) //nolint:errorlint // err may be nil: the answer lacked the attribute
		}
		var base int64 // the place before the first unit: max(old tat, n)
		if f.edge {
			// item is the old one: units sit at base+T, ..., target, base the higher of the
			// old tat (none: the floor) and the floor; the places between an old tat below
			// the floor and the floor are skipped (see shift).
			if !ok || tat < f.floor {
				tat = f.floor
			}
			g.units = (f.target - tat) / sh.t
			base, g.end, g.tail = f.target-g.units*sh.t, f.target, f.target
		} else if f.drain {
			// item is the old one: units sit at tat+T, ..., tat+units*T <= target.
			g.units = (f.target - tat) / sh.t
			base, g.end = tat, f.target
			g.tail = tat + g.units*sh.t
		} else {
			g.units, base, g.end, g.tail = f.m, tat-f.m*sh.t, tat, tat
		}
		// Another of this pool's writes may have landed after this one and answered first.
		sh.tat = max(sh.tat, g.end)
		// Unit j sits at base + j*T and may be spent until its place - T + ttl, so all of
		// them until base + ttl.
		g.expires = base + p.ttl
		p.resetAt = max(p.resetAt, g.end)
	} else {
		end := windowEnd(p.key.limit, n)
		c, _, err := schema.Number(item, schema.Count)
		if err != nil {
			return nil, fmt.Errorf("update %s: %w", pk, err)
		}
		if f.drain {
			g.units, sh.used = f.target-c, f.target
		} else {
			g.units, sh.used = f.m, c
		}
		sh.usedIn = end
		g.expires = min(end-1, n+p.ttl)
		p.resetAt = max(p.resetAt, end)
	}
	sh.emptyUntil, sh.empty = 0, false
	return g, nil
}
