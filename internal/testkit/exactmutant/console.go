package exactmutant

import (
	"context"
	"encoding/json"
	"maps"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// The console's mutants (issue 32 item 15), each a rewrite of the console's writes on their way
// to DynamoDB, so that they break the store whatever shape its fixed writes take:
//   - a reset of a concurrency item that empties its count and leaves its slots, which
//     release later into the emptied count (item 1, all slots instead of those past 100);
//   - a reset of a concurrency item written unconditionally, whatever the store conditioned
//     it on: what it read is removed, and a slot taken meanwhile by another replica stays
//     while its count is cleared (item 2);
//   - an exemption stored with an expiry an hour past the one it was given, so that every
//     replica keeps applying it after it should have ended.

// consoleMutant rewrites the console's writes as its mutant says.
type consoleMutant struct {
	dynamo.API
	name string
	// seen are the expiries of the exemptions written lately: a write that stores one's expiry
	// apart from its JSON (an index entry) is rewritten too.
	seen *expiries
}

type expiries struct {
	mu sync.Mutex
	ts []time.Time
}

// add remembers ts (the last 64) and returns every expiry remembered.
func (e *expiries) add(ts ...time.Time) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ts = append(e.ts, ts...)
	if len(e.ts) > 64 {
		e.ts = e.ts[len(e.ts)-64:]
	}
	return append([]time.Time(nil), e.ts...)
}

func (m consoleMutant) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	switch {
	case m.name == ResetLeavesSlots && slotReset(in):
		in = leaveSlots(in)
	case m.name == ResetUnconditional && slotReset(in):
		c := *in
		c.ConditionExpression = nil
		in = prune(&c)
	case m.name == ExemptionOutlivesExpiry && exemptionItem(in):
		in = m.outlive(in)
	}
	return m.API.UpdateItem(ctx, in, optFns...)
}

// slotReset reports whether in is a reset's write of a concurrency item (internal/dynamo: the
// item's key ends in #c). A reset either removes the count with the slots (which no take or
// release does), or takes its slots' units off the count and removes them while they all
// exist: its slots' names are #l0, #l1, ... and it conditions on their existence, where a
// release names its one slot #l and a reap conditions on the slots' expiries.
func slotReset(in *dynamodb.UpdateItemInput) bool {
	pk, ok := in.Key["pk"].(*types.AttributeValueMemberS)
	if !ok || !strings.HasSuffix(pk.Value, "#c") || in.UpdateExpression == nil {
		return false
	}
	cs := clauses(*in.UpdateExpression)
	for _, n := range cs["REMOVE"] {
		if in.ExpressionAttributeNames[strings.TrimSpace(n)] == "count" {
			return true
		}
	}
	cond := aws.ToString(in.ConditionExpression)
	for _, n := range cs["REMOVE"] {
		n = strings.TrimSpace(n)
		if numbered.MatchString(n) && strings.Contains(cond, "attribute_exists("+n+")") && slotName.MatchString(in.ExpressionAttributeNames[n]) {
			return true
		}
	}
	return false
}

// numbered matches the names a reset gives its slots (#l0, #l1, ...).
var numbered = regexp.MustCompile(`^#l[0-9]+$`)

// slotName matches a concurrency slot's attribute (internal/dynamo: "l" and the slot id in hex).
var slotName = regexp.MustCompile(`^l[0-9a-f]+$`)

// leaveSlots is in removing no slot attribute (the rest of its change as it was).
func leaveSlots(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	cs := clauses(*in.UpdateExpression)
	var keep []string
	for _, n := range cs["REMOVE"] {
		if !slotName.MatchString(in.ExpressionAttributeNames[strings.TrimSpace(n)]) {
			keep = append(keep, strings.TrimSpace(n))
		}
	}
	cs["REMOVE"] = keep
	c := *in
	expr := join(cs)
	c.UpdateExpression = &expr
	// A condition on the slots removed would now name what the change does not touch; the
	// mutant keeps the condition on the rest (e.g. a count read) and drops what names a slot.
	if in.ConditionExpression != nil {
		var kept []string
		for _, part := range strings.Split(*in.ConditionExpression, " AND ") {
			if !namesSlot(part, in.ExpressionAttributeNames) {
				kept = append(kept, part)
			}
		}
		c.ConditionExpression = nil
		if len(kept) > 0 {
			cond := strings.Join(kept, " AND ")
			c.ConditionExpression = &cond
		}
	}
	return prune(&c)
}

func namesSlot(s string, names map[string]string) bool {
	for k, v := range names {
		if slotName.MatchString(v) && regexp.MustCompile(regexp.QuoteMeta(k)+`\b`).MatchString(s) {
			return true
		}
	}
	return false
}

// clauseWord matches the keywords of an update expression's clauses.
var clauseWord = regexp.MustCompile(`\b(SET|REMOVE|ADD|DELETE)\b`)

// clauses splits an update expression into its clauses' comma-separated parts. (The console's
// writes hold no function call with commas outside SET, which is kept whole.)
func clauses(expr string) map[string][]string {
	out := map[string][]string{}
	idx := clauseWord.FindAllStringIndex(expr, -1)
	for i, loc := range idx {
		end := len(expr)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		word, body := expr[loc[0]:loc[1]], strings.TrimSpace(expr[loc[1]:end])
		if word == "SET" {
			out[word] = append(out[word], body)
			continue
		}
		out[word] = append(out[word], strings.Split(body, ",")...)
	}
	return out
}

func join(cs map[string][]string) string {
	var parts []string
	for _, w := range []string{"SET", "REMOVE", "ADD", "DELETE"} {
		var items []string
		for _, it := range cs[w] {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		if len(items) > 0 {
			parts = append(parts, w+" "+strings.Join(items, ", "))
		}
	}
	return strings.Join(parts, " ")
}

// prune drops the names and values no expression of in uses (DynamoDB refuses an unused one).
func prune(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	var text string
	for _, s := range []*string{in.UpdateExpression, in.ConditionExpression} {
		if s != nil {
			text += " " + *s
		}
	}
	used := func(k string) bool { return regexp.MustCompile(regexp.QuoteMeta(k) + `\b`).MatchString(text) }
	in.ExpressionAttributeNames = maps.Clone(in.ExpressionAttributeNames)
	maps.DeleteFunc(in.ExpressionAttributeNames, func(k, _ string) bool { return !used(k) })
	in.ExpressionAttributeValues = maps.Clone(in.ExpressionAttributeValues)
	maps.DeleteFunc(in.ExpressionAttributeValues, func(k string, _ types.AttributeValue) bool { return !used(k) })
	if len(in.ExpressionAttributeValues) == 0 {
		in.ExpressionAttributeValues = nil
	}
	return in
}

// outlivedBy is how much longer the mutant's exemptions live.
const outlivedBy = time.Hour

// OutlivedBy is how much longer exemption-outlives-its-expiry makes an exemption live.
const OutlivedBy = outlivedBy

// OutliveJSON is an exemption's JSON (an object with expires_at and bucket_key) expiring
// OutlivedBy later, for the mutant on another store (the simulator's Redis); ok: data was one.
func OutliveJSON(data string) (string, bool) {
	var e map[string]any
	if json.Unmarshal([]byte(data), &e) != nil || e["bucket_key"] == nil {
		return data, false
	}
	s, _ := e["expires_at"].(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return data, false
	}
	e["expires_at"] = at.Add(outlivedBy).Format(time.RFC3339Nano)
	b, _ := json.Marshal(e)
	return string(b), true
}

// exemptionItem reports whether in writes an item of the exemptions (internal/dynamo: the
// shared exemptions item, its index, or an exemption's own item), and no other console item
// (the resets item holds instants too).
func exemptionItem(in *dynamodb.UpdateItemInput) bool {
	pk, ok := in.Key["pk"].(*types.AttributeValueMemberS)
	return ok && strings.HasPrefix(pk.Value, "ratelimit-proxy#exemption")
}

// outlive is in with every exemption it stores living outlivedBy longer.
func (m consoleMutant) outlive(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	vs, ok := outliveValues(in.ExpressionAttributeValues, m.seen)
	if !ok {
		return in
	}
	c := *in
	c.ExpressionAttributeValues = vs
	return &c
}

// outliveValues rewrites the exemptions among vs (an exemption's JSON: an object with
// expires_at and bucket_key, alone or in a map) to expire outlivedBy later, and every number
// beside them that is that expiry (in seconds, milliseconds or nanoseconds, give or take the
// store's own margin of up to an hour: a TTL, a per-entry expiry) likewise. ok: some was.
func outliveValues(vs map[string]types.AttributeValue, seen *expiries) (map[string]types.AttributeValue, bool) {
	var expiries []time.Time
	var walk func(av types.AttributeValue) types.AttributeValue
	walk = func(av types.AttributeValue) types.AttributeValue {
		switch v := av.(type) {
		case *types.AttributeValueMemberS:
			var e map[string]any
			if json.Unmarshal([]byte(v.Value), &e) != nil || e["bucket_key"] == nil {
				return av
			}
			s, _ := e["expires_at"].(string)
			at, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return av
			}
			expiries = append(expiries, at)
			e["expires_at"] = at.Add(outlivedBy).Format(time.RFC3339Nano)
			b, _ := json.Marshal(e)
			return &types.AttributeValueMemberS{Value: string(b)}
		case *types.AttributeValueMemberM:
			m := make(map[string]types.AttributeValue, len(v.Value))
			for k, x := range v.Value {
				m[k] = walk(x)
			}
			return &types.AttributeValueMemberM{Value: m}
		}
		return av
	}
	out := make(map[string]types.AttributeValue, len(vs))
	for k, v := range vs {
		out[k] = walk(v)
	}
	known := seen.add(expiries...)
	changed := len(expiries) > 0
	var shift func(av types.AttributeValue) types.AttributeValue
	shift = func(av types.AttributeValue) types.AttributeValue {
		switch v := av.(type) {
		case *types.AttributeValueMemberN:
			x, err := strconv.ParseInt(v.Value, 10, 64)
			if err != nil {
				return av
			}
			for _, unit := range []time.Duration{time.Second, time.Millisecond, time.Nanosecond} {
				if near(time.Unix(0, x*int64(unit)), known) {
					changed = true
					return &types.AttributeValueMemberN{Value: strconv.FormatInt(x+int64(outlivedBy/unit), 10)}
				}
			}
		case *types.AttributeValueMemberM:
			m := make(map[string]types.AttributeValue, len(v.Value))
			for k, x := range v.Value {
				m[k] = shift(x)
			}
			return &types.AttributeValueMemberM{Value: m}
		}
		return av
	}
	for k, v := range out {
		out[k] = shift(v)
	}
	return out, changed
}

func near(at time.Time, ts []time.Time) bool {
	for _, t := range ts {
		if d := at.Sub(t); d > -time.Minute && d <= time.Hour {
			return true
		}
	}
	return false
}
