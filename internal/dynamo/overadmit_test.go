package dynamo_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"go.uber.org/goleak"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// memAPI is an in-memory table that evaluates every conditional write form the Store sends
// (GCRA forms (a) and (b), counter ADDs, seals, refunds) atomically, yielding the processor a
// random number of times before each call so that writes of concurrent requests interleave.
type memAPI struct {
	fakeAPI
	mu    sync.Mutex
	items map[string]map[string]int64
	calls int
}

// writes is how many UpdateItem calls reached the table.
func (f *memAPI) writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// has reports whether item pk exists.
func (f *memAPI) has(pk string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.items[pk]
	return ok
}

func newMemAPI() *memAPI { return &memAPI{items: map[string]map[string]int64{}} }

func (f *memAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (_ *dynamodb.UpdateItemOutput, err error) {
	var out map[string]types.AttributeValue
	res := &dynamodb.UpdateItemOutput{}
	defer func() {
		if err == nil {
			res.Attributes = out
		}
	}()
	for range rand.IntN(4) {
		runtime.Gosched()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	val := func(name string) int64 {
		av, ok := in.ExpressionAttributeValues[name]
		if !ok {
			panic("missing value " + name)
		}
		n, err := strconv.ParseInt(av.(*types.AttributeValueMemberN).Value, 10, 64)
		if err != nil {
			panic(err)
		}
		return n
	}
	pk := in.Key["pk"].(*types.AttributeValueMemberS).Value
	expr, cond := aws.ToString(in.UpdateExpression), aws.ToString(in.ConditionExpression)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	item := f.items[pk]
	// A write to a leased token bucket's shard leaves its marker in lv (see lease/giveback.go).
	if e, found := strings.CutSuffix(expr, ", #lv = :lv"); found {
		expr = e
		defer func() {
			if err == nil {
				f.items[pk]["lv"] = val(":lv")
			}
		}()
	}
	tat, hasTat := item["tat"]
	cnt, hasCnt := item["count"]
	// A sliding window's slot takes a write only while it is not sealed.
	_, sealed := item["sealed"]
	ok := true
	if c, found := strings.CutSuffix(cond, " AND attribute_not_exists(#sealed)"); found {
		cond, ok = strings.TrimSuffix(strings.TrimPrefix(c, "("), ")"), !sealed
	}
	holds := true
	if strings.HasPrefix(cond, "#wp = :w") { // a charge's give-back (gcraRefund)
		w, hasW := item[in.ExpressionAttributeNames["#wp"]]
		holds = hasW && w == val(":w")
		for _, term := range strings.Split(cond, " AND ")[1:] {
			name, _, _ := strings.Cut(term, " >= ")
			c, hasC := item[in.ExpressionAttributeNames[name]]
			holds = holds && hasC && c >= val(":t")
		}
		cond = ""
	}
	if user, rest, found := strings.Cut(cond, ") AND #e = :e AND "); found || strings.Contains(cond, ") AND attribute_not_exists(#e) AND ") { // a counter's give-back (countRefund)
		if !found {
			user, rest, _ = strings.Cut(cond, ") AND attribute_not_exists(#e) AND ")
		}
		e, hasE := item["e"]
		if found {
			holds = hasE && e == val(":e")
		} else {
			holds = !hasE
		}
		ids, given := 0, false
		for k := range item {
			if strings.HasPrefix(k, "g:") {
				ids++
				given = given || k == "g:"+strconv.FormatInt(val(":gid"), 10)
			}
		}
		switch rest {
		case "(attribute_not_exists(#g) OR (size(#g) < :k AND NOT contains(#g, :gid)))":
			holds = holds && (ids == 0 || ids < int(val(":k")) && !given)
		case "size(#g) >= :k AND NOT contains(#g, :gid)":
			holds = holds && ids >= int(val(":k")) && !given
		default:
			panic("unknown give-back condition " + rest)
		}
		switch strings.TrimPrefix(user, "(") {
		case "#count >= :n":
			holds = holds && hasCnt && cnt >= val(":n")
		case "attribute_exists(#count)":
			holds = holds && hasCnt
		default:
			panic("unknown give-back condition " + user)
		}
		cond = ""
	}
	switch cond {
	case "": // unconditional (a seal)
	case "attribute_not_exists(#tat) OR #tat < :now":
		holds = !hasTat || tat < val(":now")
	case "#tat >= :now AND #tat <= :last":
		holds = hasTat && tat >= val(":now") && tat <= val(":last")
	case "attribute_not_exists(#count) OR #count <= :last":
		holds = !hasCnt || cnt <= val(":last")
	case "#count <= :last":
		holds = hasCnt && cnt <= val(":last")
	case "attribute_exists(#count)":
		holds = hasCnt
	case "attribute_not_exists(#tat) OR #tat < :floor": // a lease from a bucket idle at its floor
		holds = !hasTat || tat < val(":floor")
	case "#tat >= :floor AND #tat <= :last": // a lease from a bucket past its floor
		holds = hasTat && tat >= val(":floor") && tat <= val(":last")
	case "#tat >= :fewest AND #tat <= :most": // a lease draining a bucket to its edge, capped
		holds = hasTat && tat >= val(":fewest") && tat <= val(":most")
	case "attribute_not_exists(#tat) OR #tat <= :most": // a lease draining a bucket to its edge
		holds = !hasTat || tat <= val(":most")
	case "#tat >= :floor AND #tat <= :most AND #tat >= :fewest": // a lease draining a bucket
		holds = hasTat && tat >= val(":floor") && tat <= val(":most") && tat >= val(":fewest")
	case "#count <= :most AND #count >= :fewest": // a lease draining a window
		holds = hasCnt && cnt <= val(":most") && cnt >= val(":fewest")
	case "#tat = :end AND #lv = :lv": // a lease's units given back
		lv, hasLV := item["lv"]
		holds = hasTat && tat == val(":end") && hasLV && lv == val(":lv")
	default:
		panic("unknown condition " + cond)
	}
	ok = ok && holds
	if !ok {
		var old map[string]types.AttributeValue
		if item != nil {
			old = memAttrs(item)
		}
		return nil, &types.ConditionalCheckFailedException{Message: aws.String("cond"), Item: old}
	}
	if item == nil {
		item = map[string]int64{}
		f.items[pk] = item
	}
	if in.ReturnValues == types.ReturnValueAllOld {
		old := memAttrs(item)
		defer func() { out = old }()
	}
	out = map[string]types.AttributeValue{}
	const chain = 8
	switch {
	case strings.HasPrefix(expr, "SET #tat = :next, #ttl = :ttl, #w1 = :w"): // form (a), chain reset
		item["tat"], item["w1"], item["c1"] = val(":next"), val(":w"), val(":idle")
		for i := 2; i <= chain; i++ {
			delete(item, "w"+strconv.Itoa(i))
			delete(item, "c"+strconv.Itoa(i))
		}
		out["tat"] = memNum(item["tat"])
		return res, nil
	case strings.HasPrefix(expr, "SET #tat = #tat + :t, #ttl = :ttl, #w"): // form (b), chain pushed
		for i := chain; i >= 2; i-- {
			prev := strconv.Itoa(i - 1)
			if w, ok := item["w"+prev]; ok {
				item["w"+strconv.Itoa(i)] = w
			} else {
				item["w"+strconv.Itoa(i)] = 0
			}
			if c, ok := item["c"+prev]; ok {
				item["c"+strconv.Itoa(i)] = c
			} else {
				item["c"+strconv.Itoa(i)] = val(":idle")
			}
		}
		item["w1"], item["c1"] = val(":w"), item["tat"]-val(":now")
		item["tat"] += val(":t")
		out["tat"] = memNum(item["tat"])
		return res, nil
	case strings.HasPrefix(expr, "SET #tat = #tat - :t, #wp = :gid"): // a give-back (gcraRefund)
		item["tat"] -= val(":t")
		item[in.ExpressionAttributeNames["#wp"]] = val(":gid")
		sets := strings.TrimPrefix(expr, "SET #tat = #tat - :t, #wp = :gid")
		for _, a := range strings.Split(strings.TrimPrefix(sets, ", "), ", ") {
			if name, _, ok := strings.Cut(a, " = "); ok {
				item[in.ExpressionAttributeNames[name]] -= val(":d")
			}
		}
		return res, nil
	case expr == "ADD #count :minus, #g :gs": // a counter's give-back
		item["count"] += val(":minus")
		item["g:"+strconv.FormatInt(val(":gid"), 10)] = 1
		return res, nil
	case expr == "ADD #count :minus SET #g = :gs, #e = :next": // a counter's give-back, new epoch
		memClearGiven(item)
		item["count"] += val(":minus")
		item["g:"+strconv.FormatInt(val(":gid"), 10)] = 1
		item["e"] = val(":next")
		return res, nil
	}
	switch expr {
	case "SET #tat = :next, #ttl = :ttl":
		item["tat"] = val(":next")
		out["tat"] = memNum(item["tat"])
	case "SET #tat = #tat + :t, #ttl = :ttl":
		item["tat"] += val(":t")
		out["tat"] = memNum(item["tat"])
	case "SET #tat = :next, #ttl = :ttl, #w = :w":
		item["tat"], item["w"] = val(":next"), val(":w")
		out["tat"], out["w"] = memNum(item["tat"]), memNum(item["w"])
	case "SET #tat = #tat + :t, #ttl = :ttl, #w = :w":
		item["tat"] += val(":t")
		item["w"] = val(":w")
		out["tat"], out["w"] = memNum(item["tat"]), memNum(item["w"])
	case "ADD #count :m SET #ttl = :ttl":
		item["count"] += val(":m")
		out["count"] = memNum(item["count"])
	case "SET #tat = #tat - :t":
		item["tat"] -= val(":t")
	case "SET #tat = :to, #lv = :gid":
		item["tat"] = val(":to")
		item["lv"] = val(":gid")
	case "SET #tat = :target, #ttl = :ttl":
		item["tat"] = val(":target")
		out["tat"] = memNum(item["tat"])
	case "SET #count = :target, #ttl = :ttl":
		item["count"] = val(":target")
		out["count"] = memNum(item["count"])
	case "ADD #count :minus":
		item["count"] += val(":minus")
	case "SET #sealed = :true, #ttl = if_not_exists(#ttl, :ttl)":
		item["sealed"] = 1
		out["sealed"] = &types.AttributeValueMemberBOOL{Value: true}
		if c, ok := item["count"]; ok {
			out["count"] = memNum(c)
		}
	default:
		panic("unknown update " + expr)
	}
	return res, nil
}

// BatchGetItem reads the items asked for, consistently.
func (f *memAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]map[string]types.AttributeValue{}
	for table, ka := range in.RequestItems {
		for _, k := range ka.Keys {
			pk := k["pk"].(*types.AttributeValueMemberS).Value
			item, ok := f.items[pk]
			if !ok {
				continue
			}
			av := memAttrs(item)
			av["pk"] = &types.AttributeValueMemberS{Value: pk}
			out[table] = append(out[table], av)
		}
	}
	return &dynamodb.BatchGetItemOutput{Responses: out}, nil
}

// memAttrs is item as DynamoDB returns it: its "g:<id>" entries as the number set g.
func memAttrs(item map[string]int64) map[string]types.AttributeValue {
	out := map[string]types.AttributeValue{}
	var ids []string
	for k, v := range item {
		if id, ok := strings.CutPrefix(k, "g:"); ok {
			ids = append(ids, id)
			continue
		}
		out[k] = memNum(v)
	}
	if len(ids) > 0 {
		out["g"] = &types.AttributeValueMemberNS{Value: ids}
	}
	return out
}

// memClearGiven empties an item's set of give-backs (kept as one "g:<id>" entry per id).
func memClearGiven(item map[string]int64) {
	for k := range item {
		if strings.HasPrefix(k, "g:") {
			delete(item, k)
		}
	}
}

func memNum(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// TestCoalescedNeverOverAdmits hammers one hot key from two Stores sharing a table, with
// groups that a second (tiny) limit often rejects (so applied charges are refunded behind the
// writers' backs, making their tat hints stale), and requests that leave early. Whatever happens,
// the admitted groups must not exceed the hot limit, every Take must return, and no writer
// goroutine may outlive its queue.
func TestCoalescedNeverOverAdmits(t *testing.T) {
	defer goleak.VerifyNone(t, append(ignoreNow(), ignorePools...)...)
	for _, tc := range exactLimits {
		for _, cancelSome := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/cancel=%v", tc.name, cancelSome), func(t *testing.T) {
				api := newMemAPI()
				stores := []*dynamo.Store{dynamo.New(api, dynamo.Options{Table: "t"}), dynamo.New(api, dynamo.Options{Table: "t"})}
				hot := newKey(t)
				tiny := bucket.Limit{Algorithm: bucket.FixedWindow, Count: 1, Window: time.Hour}
				gates := []bucket.Key{newKey(t), newKey(t), newKey(t), newKey(t)}
				const requests = 600
				var mu sync.Mutex
				var admitted int64
				errs := make(chan error, requests)
				var wg sync.WaitGroup
				for g := range requests {
					wg.Go(func() {
						ctx := context.Background()
						if cancelSome && g%3 == 0 {
							c, cancel := context.WithCancel(ctx)
							ctx = c
							go func() {
								for range rand.IntN(50) {
									runtime.Gosched()
								}
								cancel()
							}()
						}
						charges := []bucket.Charge{{Key: hot, Limit: tc.limit}}
						if g%2 == 0 {
							charges = append(charges, bucket.Charge{Key: gates[g%len(gates)], Limit: tiny})
						}
						r := make([]bucket.Result, len(charges))
						done := make(chan struct{})
						var ok bool
						go func() {
							ok, _ = stores[g%2].Take(ctx, t0, charges, r)
							close(done)
						}()
						select {
						case <-done:
						case <-time.After(20 * time.Second):
							errs <- fmt.Errorf("Take %d did not return within 20s (lost wakeup?)", g)
							return
						}
						if ok {
							mu.Lock()
							admitted++
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				if admitted > tc.want {
					t.Fatalf("admitted groups: got %d, want at most %d (the hot limit)", admitted, tc.want)
				}
				t.Logf("admitted %d of limit %d", admitted, tc.want)
			})
		}
	}
}
