package simddb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// API is the part of DynamoDB's client that DB implements; *dynamodb.Client implements it too,
// which is how the differential test sends one operation to both.
type API interface {
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
}

var (
	_ API = (*DB)(nil)
	_ API = (*dynamodb.Client)(nil)
)

// Op is one generated operation: Run sends it to api and describes the answer in a form that
// is the same for DB and DynamoDB when they behave alike.
type Op struct {
	Desc string
	Run  func(ctx context.Context, api API) string
}

// Outcome describes a call's answer: the returned attributes, or the error's kind and the items
// it carries. Messages are left out (they are worded differently by each implementation).
func Outcome(attrs Item, err error) string {
	var ccf *types.ConditionalCheckFailedException
	var tce *types.TransactionCanceledException
	var ae smithy.APIError
	switch {
	case err == nil:
		return "ok " + Format(attrs)
	case errors.As(err, &ccf):
		return "ccf " + Format(ccf.Item)
	case errors.As(err, &tce):
		var b strings.Builder
		b.WriteString("cancelled")
		for _, r := range tce.CancellationReasons {
			b.WriteString(" " + aws.ToString(r.Code))
			if r.Item != nil {
				b.WriteString(Format(r.Item))
			}
		}
		return b.String()
	case errors.As(err, &ae):
		return "error " + ae.ErrorCode()
	}
	return "failed " + err.Error()
}

// Gen generates random operations of the forms the DynamoDB store sends (its conditional
// writes, give-backs, slot writes, the console's map writes, transactions, batch reads) with
// small random values, so that conditions hold about as often as not, plus forms DynamoDB
// refuses (unused values, overlapping paths, missing operands).
type Gen struct {
	R     *rand.Rand
	Table string
	// Keys is how many items the operations touch (k0..k{Keys-1}).
	Keys int
}

func (g *Gen) key() string { return "k" + strconv.Itoa(g.R.IntN(g.Keys)) }

func (g *Gen) num() types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.Itoa(g.R.IntN(12) - 2)}
}

func n(v int) types.AttributeValue { return &types.AttributeValueMemberN{Value: strconv.Itoa(v)} }

// tmpl is an update of the store's forms: expression, condition (may be empty), names, values.
type tmpl struct {
	expr, cond string
	names      map[string]string
	values     map[string]types.AttributeValue
}

func (g *Gen) update() tmpl {
	nm := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	switch g.R.IntN(22) {
	case 0:
		return tmpl{"SET #tat = :next, #ttl = :ttl", "attribute_not_exists(#tat) OR #tat < :now", nm("#tat", "tat", "#ttl", "ttl"),
			map[string]types.AttributeValue{":next": g.num(), ":ttl": g.num(), ":now": g.num()}}
	case 1:
		return tmpl{"SET #tat = #tat + :t, #ttl = :ttl", "#tat >= :now AND #tat <= :last", nm("#tat", "tat", "#ttl", "ttl"),
			map[string]types.AttributeValue{":t": g.num(), ":ttl": g.num(), ":now": g.num(), ":last": g.num()}}
	case 2: // a busy chain write: operands read the old item
		return tmpl{"SET #tat = #tat + :t, #w2 = if_not_exists(#w1, :none), #c2 = if_not_exists(#c1, :idle), #w1 = :w, #c1 = #tat - :now",
			"#tat >= :now", nm("#tat", "tat", "#w1", "w1", "#w2", "w2", "#c1", "c1", "#c2", "c2"),
			map[string]types.AttributeValue{":t": g.num(), ":none": n(0), ":idle": n(-1), ":w": g.num(), ":now": g.num()}}
	case 3: // an idle chain write
		return tmpl{"SET #tat = :next, #w1 = :w, #c1 = :idle REMOVE #w2, #c2", "attribute_not_exists(#tat) OR #tat < :now",
			nm("#tat", "tat", "#w1", "w1", "#w2", "w2", "#c1", "c1", "#c2", "c2"),
			map[string]types.AttributeValue{":next": g.num(), ":w": g.num(), ":idle": n(-1), ":now": g.num()}}
	case 4:
		u := tmpl{"ADD #count :m SET #ttl = :ttl", "attribute_not_exists(#count) OR #count <= :last", nm("#count", "count", "#ttl", "ttl"),
			map[string]types.AttributeValue{":m": g.num(), ":ttl": g.num(), ":last": g.num()}}
		if g.R.IntN(2) == 0 {
			u.cond = "(" + u.cond + ") AND attribute_not_exists(#sealed)"
			u.names["#sealed"] = "sealed"
		}
		return u
	case 5: // a counter's give-back into epoch e
		gid := strconv.Itoa(g.R.IntN(6))
		return tmpl{"ADD #count :minus, #g :gs", "(#count >= :n) AND attribute_not_exists(#e) AND (attribute_not_exists(#g) OR (size(#g) < :k AND NOT contains(#g, :gid)))",
			nm("#count", "count", "#g", "g", "#e", "e"),
			map[string]types.AttributeValue{":minus": n(-1 - g.R.IntN(2)), ":n": n(g.R.IntN(3)), ":k": n(2 + g.R.IntN(3)), ":gid": n(atoi(gid)),
				":gs": &types.AttributeValueMemberNS{Value: []string{gid}}}}
	case 6: // a counter's give-back starting the next epoch
		gid := strconv.Itoa(g.R.IntN(6))
		return tmpl{"ADD #count :minus SET #g = :gs, #e = :next", "(#count >= :n) AND attribute_not_exists(#e) AND size(#g) >= :k AND NOT contains(#g, :gid)",
			nm("#count", "count", "#g", "g", "#e", "e"),
			map[string]types.AttributeValue{":minus": n(-1), ":n": n(1), ":k": n(2), ":gid": n(atoi(gid)), ":next": n(1),
				":gs": &types.AttributeValueMemberNS{Value: []string{gid}}}}
	case 7: // a bucket's give-back
		return tmpl{"SET #tat = #tat - :t, #wp = :gid, #c1 = #c1 - :d", "#wp = :w AND #c1 >= :t", nm("#tat", "tat", "#wp", "w2", "#c1", "c1"),
			map[string]types.AttributeValue{":t": g.num(), ":gid": g.num(), ":d": g.num(), ":w": g.num()}}
	case 8:
		return tmpl{"SET #sealed = :true, #ttl = if_not_exists(#ttl, :ttl)", "", nm("#sealed", "sealed", "#ttl", "ttl"),
			map[string]types.AttributeValue{":true": &types.AttributeValueMemberBOOL{Value: true}, ":ttl": g.num()}}
	case 9: // a concurrency slot
		slot := "l" + strconv.Itoa(g.R.IntN(3))
		return tmpl{"ADD #count :one SET #l = :exp, #ttl = :ttl", "(attribute_not_exists(#count) OR #count < :limit) AND attribute_not_exists(#l)",
			nm("#count", "count", "#l", slot, "#ttl", "ttl"), map[string]types.AttributeValue{":one": n(1), ":exp": g.num(), ":ttl": g.num(), ":limit": n(g.R.IntN(4))}}
	case 10:
		slot := "l" + strconv.Itoa(g.R.IntN(3))
		return tmpl{"ADD #count :minus REMOVE #l", "attribute_exists(#l)", nm("#count", "count", "#l", slot), map[string]types.AttributeValue{":minus": n(-1)}}
	case 11: // a reap or a reset of two slots read
		return tmpl{"ADD #count :minus REMOVE #l0, #l1", "#l0 = :e0 AND #l1 = :e1", nm("#count", "count", "#l0", "l0", "#l1", "l1"),
			map[string]types.AttributeValue{":minus": n(-2), ":e0": g.num(), ":e1": g.num()}}
	case 12:
		return tmpl{"REMOVE #tat, #lv, #w1, #c1, #w2, #c2", "", nm("#tat", "tat", "#lv", "lv", "#w1", "w1", "#c1", "c1", "#w2", "w2", "#c2", "c2"), nil}
	case 13:
		return tmpl{"SET #count = :zero", "", nm("#count", "count"), map[string]types.AttributeValue{":zero": n(0)}}
	case 14: // the console's map entries
		return tmpl{"SET #m.#k = :v, #ttl = :ttl", "attribute_exists(#m)", nm("#m", "m", "#k", "e"+strconv.Itoa(g.R.IntN(3)), "#ttl", "ttl"),
			map[string]types.AttributeValue{":v": g.num(), ":ttl": g.num()}}
	case 15:
		return tmpl{"SET #m = :m, #ttl = :ttl", "attribute_not_exists(#m)", nm("#m", "m", "#ttl", "ttl"),
			map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{"e" + strconv.Itoa(g.R.IntN(3)): g.num()}}, ":ttl": g.num()}}
	case 16:
		return tmpl{"REMOVE #m.#k", "attribute_exists(#m.#k)", nm("#m", "m", "#k", "e"+strconv.Itoa(g.R.IntN(3))), nil}
	case 17:
		return tmpl{"REMOVE #m.#a, #m.#b", "#m.#a = :a AND #m.#b = :b", nm("#m", "m", "#a", "e0", "#b", "e1"),
			map[string]types.AttributeValue{":a": g.num(), ":b": g.num()}}
	case 18:
		return tmpl{"SET #m.#k = :x REMOVE #ttl", "attribute_exists(#m) AND size(#m) < :max AND attribute_not_exists(#m.#k)",
			nm("#m", "m", "#k", "e"+strconv.Itoa(g.R.IntN(3)), "#ttl", "ttl"), map[string]types.AttributeValue{":x": g.num(), ":max": n(g.R.IntN(4))}}
	case 19: // lease writes
		if g.R.IntN(2) == 0 {
			return tmpl{"SET #tat = :to, #lv = :gid", "#tat = :end AND #lv = :lv", nm("#tat", "tat", "#lv", "lv"),
				map[string]types.AttributeValue{":to": g.num(), ":gid": g.num(), ":end": g.num(), ":lv": g.num()}}
		}
		return tmpl{"SET #count = :target, #ttl = :ttl", "#count <= :most AND #count >= :fewest", nm("#count", "count", "#ttl", "ttl"),
			map[string]types.AttributeValue{":target": g.num(), ":ttl": g.num(), ":most": g.num(), ":fewest": g.num()}}
	case 20: // forms DynamoDB refuses, or that fail on some items only
		switch g.R.IntN(7) {
		case 0:
			return tmpl{"SET #tat = :v", "", nm("#tat", "tat"), map[string]types.AttributeValue{":v": g.num(), ":unused": g.num()}}
		case 1:
			return tmpl{"SET #tat = :v", "", nm("#tat", "tat", "#x", "x"), map[string]types.AttributeValue{":v": g.num()}}
		case 2:
			return tmpl{"SET #tat = :v REMOVE #tat", "", nm("#tat", "tat"), map[string]types.AttributeValue{":v": g.num()}}
		case 3:
			return tmpl{"SET #c1 = #w1 + :v", "", nm("#c1", "c1", "#w1", "w1"), map[string]types.AttributeValue{":v": g.num()}}
		case 4:
			return tmpl{"SET #m.#k = :v", "", nm("#m", "m", "#k", "e0"), map[string]types.AttributeValue{":v": g.num()}}
		case 5:
			return tmpl{"ADD #m :v", "", nm("#m", "m"), map[string]types.AttributeValue{":v": g.num()}}
		default:
			return tmpl{"SET #tat = :v", "#nope = :v", nm("#tat", "tat"), map[string]types.AttributeValue{":v": g.num()}}
		}
	default: // a set's element removed, a string written
		if g.R.IntN(2) == 0 {
			return tmpl{"DELETE #g :gs", "", nm("#g", "g"), map[string]types.AttributeValue{":gs": &types.AttributeValueMemberNS{Value: []string{strconv.Itoa(g.R.IntN(6))}}}}
		}
		return tmpl{"SET #d = :d, #ttl = :ttl", "", nm("#d", "d", "#ttl", "ttl"),
			map[string]types.AttributeValue{":d": &types.AttributeValueMemberS{Value: strings.Repeat("x", g.R.IntN(3))}, ":ttl": g.num()}}
	}
}

func atoi(s string) int { v, _ := strconv.Atoi(s); return v }

var returnValues = []types.ReturnValue{types.ReturnValueNone, types.ReturnValueAllOld, types.ReturnValueAllNew, types.ReturnValueUpdatedOld, types.ReturnValueUpdatedNew}

func (g *Gen) pk(k string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: k}}
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return aws.String(s)
}

// Next returns a random operation.
func (g *Gen) Next() Op {
	switch r := g.R.IntN(20); {
	case r < 13:
		k, u := g.key(), g.update()
		rv := returnValues[g.R.IntN(len(returnValues))]
		in := &dynamodb.UpdateItemInput{
			TableName: aws.String(g.Table), Key: g.pk(k), UpdateExpression: aws.String(u.expr), ConditionExpression: orNil(u.cond),
			ExpressionAttributeNames: u.names, ExpressionAttributeValues: u.values, ReturnValues: rv,
		}
		if u.cond != "" && g.R.IntN(4) != 0 {
			in.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
		}
		return Op{Desc: fmt.Sprintf("UpdateItem %s %q if %q %v %s", k, u.expr, u.cond, u.values, rv), Run: func(ctx context.Context, api API) string {
			out, err := api.UpdateItem(ctx, in)
			if out == nil {
				return Outcome(nil, err)
			}
			return Outcome(out.Attributes, err)
		}}
	case r < 16:
		size := 1 + g.R.IntN(min(3, g.Keys))
		items := make([]types.TransactWriteItem, size)
		var desc []string
		used := map[string]bool{}
		for i := range items {
			k := g.key()
			for used[k] { // the store never sends two writes of one item in a transaction
				k = g.key()
			}
			used[k] = true
			u := g.update()
			cond := u.cond
			if cond == "" {
				cond = "attribute_exists(#pkname) OR attribute_not_exists(#pkname)"
				if u.names == nil {
					u.names = map[string]string{}
				}
				u.names["#pkname"] = "pk"
			}
			items[i].Update = &types.Update{
				TableName: aws.String(g.Table), Key: g.pk(k), UpdateExpression: aws.String(u.expr), ConditionExpression: aws.String(cond),
				ExpressionAttributeNames: u.names, ExpressionAttributeValues: u.values,
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}
			desc = append(desc, fmt.Sprintf("%s %q if %q %v", k, u.expr, cond, u.values))
		}
		in := &dynamodb.TransactWriteItemsInput{TransactItems: items}
		return Op{Desc: "TransactWriteItems " + strings.Join(desc, "; "), Run: func(ctx context.Context, api API) string {
			_, err := api.TransactWriteItems(ctx, in)
			return Outcome(nil, err)
		}}
	case r < 17:
		k := g.key()
		in := &dynamodb.PutItemInput{TableName: aws.String(g.Table), Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: k}, "count": g.num()}}
		if g.R.IntN(2) == 0 {
			in.ConditionExpression = aws.String("attribute_not_exists(#count)")
			in.ExpressionAttributeNames = map[string]string{"#count": "count"}
		}
		return Op{Desc: "PutItem " + k, Run: func(ctx context.Context, api API) string {
			out, err := api.PutItem(ctx, in)
			if out == nil {
				return Outcome(nil, err)
			}
			return Outcome(out.Attributes, err)
		}}
	case r < 18:
		k := g.key()
		in := &dynamodb.DeleteItemInput{TableName: aws.String(g.Table), Key: g.pk(k), ReturnValues: types.ReturnValueAllOld}
		if g.R.IntN(2) == 0 {
			in.ConditionExpression = aws.String("#count > :z")
			in.ExpressionAttributeNames = map[string]string{"#count": "count"}
			in.ExpressionAttributeValues = map[string]types.AttributeValue{":z": n(3)}
		}
		return Op{Desc: "DeleteItem " + k, Run: func(ctx context.Context, api API) string {
			out, err := api.DeleteItem(ctx, in)
			if out == nil {
				return Outcome(nil, err)
			}
			return Outcome(out.Attributes, err)
		}}
	default:
		k := g.key()
		in := &dynamodb.GetItemInput{TableName: aws.String(g.Table), Key: g.pk(k), ConsistentRead: aws.Bool(true)}
		return Op{Desc: "GetItem " + k, Run: func(ctx context.Context, api API) string {
			out, err := api.GetItem(ctx, in)
			if out == nil {
				return Outcome(nil, err)
			}
			return Outcome(out.Item, err)
		}}
	}
}

// State reads every item the operations may touch with one consistent BatchGetItem and
// describes them in key order.
func (g *Gen) State(ctx context.Context, api API) string {
	keys := make([]map[string]types.AttributeValue, g.Keys)
	for i := range keys {
		keys[i] = g.pk("k" + strconv.Itoa(i))
	}
	out, err := api.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: map[string]types.KeysAndAttributes{
		g.Table: {Keys: keys, ConsistentRead: aws.Bool(true)},
	}})
	if err != nil {
		return Outcome(nil, err)
	}
	byKey := map[string]Item{}
	for _, it := range out.Responses[g.Table] {
		if s, ok := it["pk"].(*types.AttributeValueMemberS); ok {
			byKey[s.Value] = it
		}
	}
	var b strings.Builder
	for i := range g.Keys {
		k := "k" + strconv.Itoa(i)
		b.WriteString(k + "=" + Format(byKey[k]) + "\n")
	}
	if len(out.UnprocessedKeys) > 0 {
		b.WriteString("unprocessed\n")
	}
	return b.String()
}
