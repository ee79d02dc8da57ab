// Package simddb is a simulated DynamoDB table in memory, for the simulator and tests.
//
// DB answers the calls the DynamoDB store makes (UpdateItem, BatchGetItem, TransactWriteItems)
// and a few more (GetItem, PutItem, DeleteItem) as DynamoDB does: condition and update
// expressions of the subset in expr.go, ReturnValues, a failed condition's
// ConditionalCheckFailedException with the item (ReturnValuesOnConditionCheckFailure),
// transactions cancelled with one reason per item, and the ValidationExceptions of unused or
// undefined names and values, overlapping paths and missing operands. Items are keyed by their
// partition key alone (the store's tables have no sort key). TTL is applied only when Sweep is
// called, as DynamoDB deletes expired items at a time of its own choosing, and reads return an
// expired item until then. A DB is synchronous and deterministic: faults (lost answers, delays,
// throttling) are the simulator's (package sim), not the store's. The differential test holds it
// to DynamoDB Local.
package simddb

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// DB is a set of simulated tables, each keyed by the string attribute KeyAttr. It is safe for
// concurrent use; every call is applied atomically.
type DB struct {
	// KeyAttr is every table's partition key (default "pk").
	KeyAttr string
	// TTLAttr is the attribute Sweep reads, in Unix seconds (default "ttl").
	TTLAttr string

	mu     sync.Mutex
	tables map[string]map[string]Item
	// OnWrite, when set, is called (under the DB's lock) with each item a call changed: the
	// table, the key and the new item (nil: deleted). The simulator's history records them.
	OnWrite func(table, key string, item Item)

	// parsed caches the expressions parsed so far: a store sends the same few over and over,
	// and parsing them was a tenth of a simulator run.
	parseMu sync.Mutex
	parsed  map[[2]string]*parsedExpr
}

// parsedExpr is a pair of expressions parsed: what parse derives from the strings alone.
type parsedExpr struct {
	acts         []action
	cond         *cond
	usedN, usedV map[string]bool
}

// New returns an empty DB.
func New() *DB { return &DB{KeyAttr: "pk", TTLAttr: "ttl", tables: map[string]map[string]Item{}} }

func validation(msg string) error {
	return &smithy.GenericAPIError{Code: "ValidationException", Message: msg, Fault: smithy.FaultClient}
}

func (db *DB) table(name *string) map[string]Item {
	n := aws.ToString(name)
	t, ok := db.tables[n]
	if !ok {
		t = map[string]Item{}
		db.tables[n] = t
	}
	return t
}

func (db *DB) keyOf(key Item) (string, error) {
	if len(key) != 1 {
		return "", validation("The provided key element does not match the schema")
	}
	s, ok := key[db.KeyAttr].(*types.AttributeValueMemberS)
	if !ok || s.Value == "" {
		return "", validation("The provided key element does not match the schema")
	}
	return s.Value, nil
}

func (db *DB) write(table, key string, it Item) {
	t := db.tables[table]
	if it == nil {
		delete(t, key)
	} else {
		t[key] = it
	}
	if db.OnWrite != nil {
		db.OnWrite(table, key, it)
	}
}

// expr is one call's parsed expressions.
type expr struct {
	env  env
	cond *cond
	acts []action
}

// parse parses a call's expressions and checks its names and values are each used and defined.
func (db *DB) parse(update, condition *string, names map[string]string, values map[string]types.AttributeValue) (*expr, error) {
	k := [2]string{"\x00", "\x00"} // nil, told from ""
	if update != nil {
		k[0] = *update
	}
	if condition != nil {
		k[1] = *condition
	}
	db.parseMu.Lock()
	p, ok := db.parsed[k]
	db.parseMu.Unlock()
	if !ok {
		var err error
		if p, err = parseExprs(update, condition); err != nil {
			return nil, err
		}
		db.parseMu.Lock()
		if db.parsed == nil {
			db.parsed = map[[2]string]*parsedExpr{}
		}
		db.parsed[k] = p
		db.parseMu.Unlock()
	}
	e := &expr{env: env{names: names, values: values}, acts: p.acts, cond: p.cond}
	if !allIn(p.usedN, names) {
		for _, n := range slices.Sorted(maps.Keys(p.usedN)) {
			if _, ok := names[n]; !ok {
				return nil, validation("An expression attribute name used in the document path is not defined; attribute name: " + n)
			}
		}
	}
	if !allIn(p.usedV, values) {
		for _, v := range slices.Sorted(maps.Keys(p.usedV)) {
			if _, ok := values[v]; !ok {
				return nil, validation("An expression attribute value used in expression is not defined; attribute value: " + v)
			}
		}
	}
	if _, err := e.env.paths(e.acts); err != nil {
		return nil, err
	}
	// Every used one is defined (above): as many defined as used means none unused.
	if len(names) != len(p.usedN) {
		if unused := unusedKeys(names, p.usedN); unused != "" {
			return nil, validation("Value provided in ExpressionAttributeNames unused in expressions: keys: {" + unused + "}")
		}
	}
	if len(values) != len(p.usedV) {
		if unused := unusedKeys(values, p.usedV); unused != "" {
			return nil, validation("Value provided in ExpressionAttributeValues unused in expressions: keys: {" + unused + "}")
		}
	}
	return e, nil
}

// allIn reports whether every key of used is one of m's.
func allIn[V any](used map[string]bool, m map[string]V) bool {
	for k := range used {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// parseExprs parses an update and a condition expression (either nil).
func parseExprs(update, condition *string) (*parsedExpr, error) {
	p := &parsedExpr{usedN: map[string]bool{}, usedV: map[string]bool{}}
	var err error
	if update != nil {
		if p.acts, err = parseUpdate(*update, p.usedN, p.usedV); err != nil {
			return nil, validation("Invalid UpdateExpression: " + err.Error())
		}
	}
	if condition != nil {
		if *condition == "" {
			return nil, validation("Invalid ConditionExpression: The expression can not be empty;")
		}
		if p.cond, err = parseCond(*condition, p.usedN, p.usedV); err != nil {
			return nil, validation("Invalid ConditionExpression: " + err.Error())
		}
	}
	return p, nil
}

func unusedKeys[V any](m map[string]V, used map[string]bool) string {
	var out []string
	for k := range m {
		if !used[k] {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// check evaluates the condition on old (nil: no item).
func (e *expr) check(old Item) (bool, error) {
	if e.cond == nil {
		return true, nil
	}
	return e.env.eval(old, e.cond)
}

var errCCF = "The conditional request failed"

func ccf(old Item, rv types.ReturnValuesOnConditionCheckFailure) error {
	err := &types.ConditionalCheckFailedException{Message: aws.String(errCCF)}
	if rv == types.ReturnValuesOnConditionCheckFailureAllOld && old != nil {
		err.Item = CopyItem(old)
	}
	return err
}

// update evaluates one update on old: the new item and the paths it updated, or a failed
// condition (ok false).
func (db *DB) update(key string, old Item, e *expr) (Item, []resolved, bool, error) {
	ok, err := e.check(old)
	if err != nil || !ok {
		return nil, nil, false, err
	}
	for _, a := range e.acts {
		if r, err := e.env.resolve(a.path); err == nil && r[0].name == db.KeyAttr {
			return nil, nil, false, validation("One or more parameter values were invalid: Cannot update attribute " + db.KeyAttr + ". This attribute is part of the key")
		}
	}
	it, paths, err := e.env.apply(old, e.acts)
	if err != nil {
		return nil, nil, false, err
	}
	it[db.KeyAttr] = &types.AttributeValueMemberS{Value: key}
	return it, paths, true, nil
}

// UpdateItem implements the call.
func (db *DB) UpdateItem(_ context.Context, in *dynamodb.UpdateItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if in.UpdateExpression == nil {
		return nil, validation("simddb: UpdateItem without an UpdateExpression is not supported")
	}
	e, err := db.parse(in.UpdateExpression, in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return nil, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	key, err := db.keyOf(in.Key)
	if err != nil {
		return nil, err
	}
	t := db.table(in.TableName)
	old := t[key]
	it, paths, ok, err := db.update(key, old, e)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ccf(old, in.ReturnValuesOnConditionCheckFailure)
	}
	db.write(aws.ToString(in.TableName), key, it)
	out := &dynamodb.UpdateItemOutput{}
	switch in.ReturnValues {
	case types.ReturnValueAllOld:
		out.Attributes = CopyItem(old)
	case types.ReturnValueAllNew:
		out.Attributes = CopyItem(it)
	case types.ReturnValueUpdatedOld:
		out.Attributes = project(old, paths)
	case types.ReturnValueUpdatedNew:
		out.Attributes = project(it, paths)
	case types.ReturnValueNone, "":
	default:
		return nil, validation("simddb: ReturnValues " + string(in.ReturnValues))
	}
	return out, nil
}

// PutItem implements the call.
func (db *DB) PutItem(_ context.Context, in *dynamodb.PutItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	e, err := db.parse(nil, in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return nil, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	key, err := db.keyOf(Item{db.KeyAttr: in.Item[db.KeyAttr]})
	if err != nil {
		return nil, err
	}
	t := db.table(in.TableName)
	old := t[key]
	if ok, err := e.check(old); err != nil || !ok {
		if err != nil {
			return nil, err
		}
		return nil, ccf(old, in.ReturnValuesOnConditionCheckFailure)
	}
	db.write(aws.ToString(in.TableName), key, CopyItem(in.Item))
	out := &dynamodb.PutItemOutput{}
	if in.ReturnValues == types.ReturnValueAllOld {
		out.Attributes = CopyItem(old)
	}
	return out, nil
}

// DeleteItem implements the call.
func (db *DB) DeleteItem(_ context.Context, in *dynamodb.DeleteItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	e, err := db.parse(nil, in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return nil, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	key, err := db.keyOf(in.Key)
	if err != nil {
		return nil, err
	}
	t := db.table(in.TableName)
	old := t[key]
	if ok, err := e.check(old); err != nil || !ok {
		if err != nil {
			return nil, err
		}
		return nil, ccf(old, in.ReturnValuesOnConditionCheckFailure)
	}
	if old != nil {
		db.write(aws.ToString(in.TableName), key, nil)
	}
	out := &dynamodb.DeleteItemOutput{}
	if in.ReturnValues == types.ReturnValueAllOld {
		out.Attributes = CopyItem(old)
	}
	return out, nil
}

// GetItem implements the call (every read is consistent).
func (db *DB) GetItem(_ context.Context, in *dynamodb.GetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	key, err := db.keyOf(in.Key)
	if err != nil {
		return nil, err
	}
	return &dynamodb.GetItemOutput{Item: CopyItem(db.table(in.TableName)[key])}, nil
}

// BatchGetItem implements the call (every read is consistent; nothing is left unprocessed).
func (db *DB) BatchGetItem(_ context.Context, in *dynamodb.BatchGetItemInput, _ ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	out := &dynamodb.BatchGetItemOutput{Responses: map[string][]Item{}, UnprocessedKeys: map[string]types.KeysAndAttributes{}}
	total := 0
	for _, name := range slices.Sorted(maps.Keys(in.RequestItems)) {
		req := in.RequestItems[name]
		t := db.table(aws.String(name))
		seen := map[string]bool{}
		list := []Item{}
		for _, k := range req.Keys {
			key, err := db.keyOf(k)
			if err != nil {
				return nil, err
			}
			if seen[key] {
				return nil, validation("Provided list of item keys contains duplicates")
			}
			seen[key] = true
			total++
			if it := t[key]; it != nil {
				list = append(list, CopyItem(it))
			}
		}
		out.Responses[name] = list
	}
	if total == 0 || total > 100 {
		return nil, validation("Too many items requested for the BatchGetItem call")
	}
	return out, nil
}

// TransactWriteItems implements the call: every condition is checked before anything is
// written; a failed one cancels the whole transaction with one reason per item.
func (db *DB) TransactWriteItems(_ context.Context, in *dynamodb.TransactWriteItemsInput, _ ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	n := len(in.TransactItems)
	if n == 0 || n > 100 {
		return nil, validation("Member must have length less than or equal to 100")
	}
	type step struct {
		table, key string
		e          *expr
		kind       byte // 'u' update, 'c' condition check, 'p' put, 'd' delete
		put        Item
		rv         types.ReturnValuesOnConditionCheckFailure
	}
	steps := make([]step, n)
	db.mu.Lock()
	defer db.mu.Unlock()
	seen := map[string]bool{}
	for i, ti := range in.TransactItems {
		var s step
		var err error
		var tbl *string
		var key Item
		switch {
		case ti.Update != nil:
			u := ti.Update
			s.kind, tbl, key, s.rv = 'u', u.TableName, u.Key, u.ReturnValuesOnConditionCheckFailure
			s.e, err = db.parse(u.UpdateExpression, u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues)
		case ti.ConditionCheck != nil:
			c := ti.ConditionCheck
			s.kind, tbl, key, s.rv = 'c', c.TableName, c.Key, c.ReturnValuesOnConditionCheckFailure
			s.e, err = db.parse(nil, c.ConditionExpression, c.ExpressionAttributeNames, c.ExpressionAttributeValues)
		case ti.Put != nil:
			p := ti.Put
			s.kind, tbl, key, s.rv, s.put = 'p', p.TableName, Item{db.KeyAttr: p.Item[db.KeyAttr]}, p.ReturnValuesOnConditionCheckFailure, p.Item
			s.e, err = db.parse(nil, p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues)
		case ti.Delete != nil:
			d := ti.Delete
			s.kind, tbl, key, s.rv = 'd', d.TableName, d.Key, d.ReturnValuesOnConditionCheckFailure
			s.e, err = db.parse(nil, d.ConditionExpression, d.ExpressionAttributeNames, d.ExpressionAttributeValues)
		default:
			return nil, validation("TransactItems can only contain one of Check, Put, Update or Delete")
		}
		if err != nil {
			return nil, err
		}
		if s.key, err = db.keyOf(key); err != nil {
			return nil, err
		}
		s.table = aws.ToString(tbl)
		if id := s.table + "\x00" + s.key; seen[id] {
			return nil, validation("Transaction request cannot include multiple operations on one item")
		} else {
			seen[id] = true
		}
		steps[i] = s
	}
	reasons := make([]types.CancellationReason, n)
	news := make([]Item, n)
	cancelled := false
	for i, s := range steps {
		old := db.table(&s.table)[s.key]
		reasons[i] = types.CancellationReason{Code: aws.String("None")}
		var ok bool
		var err error
		if s.kind == 'u' {
			news[i], _, ok, err = db.update(s.key, old, s.e)
		} else {
			ok, err = s.e.check(old)
			if s.kind == 'p' {
				news[i] = CopyItem(s.put)
			}
		}
		switch {
		case err != nil:
			// DynamoDB refuses the whole call for an item its update cannot apply to, whatever
			// the other items' conditions.
			return nil, err
		case !ok:
			reasons[i] = types.CancellationReason{Code: aws.String("ConditionalCheckFailed"), Message: aws.String(errCCF)}
			if s.rv == types.ReturnValuesOnConditionCheckFailureAllOld && old != nil {
				reasons[i].Item = CopyItem(old)
			}
			cancelled = true
		}
	}
	if cancelled {
		codes := make([]string, n)
		for i, r := range reasons {
			codes[i] = aws.ToString(r.Code)
		}
		return nil, &types.TransactionCanceledException{
			Message:             aws.String("Transaction cancelled, please refer cancellation reasons for specific reasons [" + strings.Join(codes, ", ") + "]"),
			CancellationReasons: reasons,
		}
	}
	for i, s := range steps {
		switch s.kind {
		case 'u', 'p':
			db.write(s.table, s.key, news[i])
		case 'd':
			if db.table(&s.table)[s.key] != nil {
				db.write(s.table, s.key, nil)
			}
		}
	}
	return &dynamodb.TransactWriteItemsOutput{}, nil
}

// Sweep deletes the items whose TTL attribute (Unix seconds) is before now, as DynamoDB's TTL
// process does some time after an item expires, and returns how many it deleted.
func (db *DB) Sweep(now time.Time) int {
	db.mu.Lock()
	defer db.mu.Unlock()
	deleted := 0
	for _, name := range slices.Sorted(maps.Keys(db.tables)) {
		t := db.tables[name]
		for _, key := range slices.Sorted(maps.Keys(t)) {
			nv, ok := t[key][db.TTLAttr].(*types.AttributeValueMemberN)
			if !ok {
				continue
			}
			sec, err := strconv.ParseInt(nv.Value, 10, 64)
			if err == nil && sec < now.Unix() {
				db.write(name, key, nil)
				deleted++
			}
		}
	}
	return deleted
}

// Item returns a copy of one item (nil when absent).
func (db *DB) Item(table, key string) Item {
	db.mu.Lock()
	defer db.mu.Unlock()
	return CopyItem(db.tables[table][key])
}

// Keys returns the keys of a table's items, sorted.
func (db *DB) Keys(table string) []string {
	db.mu.Lock()
	defer db.mu.Unlock()
	return slices.Sorted(maps.Keys(db.tables[table]))
}

// Format writes an item in a stable form: attributes sorted, sets sorted (for histories and
// failure messages).
func Format(it Item) string {
	if it == nil {
		return "<none>"
	}
	var b strings.Builder
	formatMap(&b, it)
	return b.String()
}

// FormatAttr writes one attribute as Format writes an item of it alone.
func FormatAttr(b *strings.Builder, k string, v types.AttributeValue) {
	b.WriteByte('{')
	b.WriteString(strconv.Quote(k))
	b.WriteByte(':')
	formatValue(b, v)
	b.WriteByte('}')
}

func formatMap(b *strings.Builder, m map[string]types.AttributeValue) {
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(k) + ":")
		formatValue(b, m[k])
	}
	b.WriteByte('}')
}

func formatValue(b *strings.Builder, v types.AttributeValue) {
	switch x := v.(type) {
	case *types.AttributeValueMemberN:
		b.WriteString(normNum(x.Value))
	case *types.AttributeValueMemberS:
		b.WriteString(strconv.Quote(x.Value))
	case *types.AttributeValueMemberB:
		fmt.Fprintf(b, "b%x", x.Value)
	case *types.AttributeValueMemberBOOL:
		fmt.Fprint(b, x.Value)
	case *types.AttributeValueMemberNULL:
		b.WriteString("null")
	case *types.AttributeValueMemberSS:
		b.WriteString("SS" + fmt.Sprint(slices.Sorted(slices.Values(x.Value))))
	case *types.AttributeValueMemberNS:
		ns := make([]string, len(x.Value))
		for i, s := range x.Value {
			ns[i] = normNum(s)
		}
		slices.Sort(ns)
		b.WriteString("NS" + fmt.Sprint(ns))
	case *types.AttributeValueMemberBS:
		b.WriteString("BS" + fmt.Sprint(len(x.Value)))
	case *types.AttributeValueMemberL:
		b.WriteByte('[')
		for i, w := range x.Value {
			if i > 0 {
				b.WriteByte(',')
			}
			formatValue(b, w)
		}
		b.WriteByte(']')
	case *types.AttributeValueMemberM:
		formatMap(b, x.Value)
	default:
		fmt.Fprintf(b, "%T", v)
	}
}

// Restore puts an item back as it was (nil: absent), bypassing every condition: the
// simulator's lease-granted-twice mutant undoes a grant's write with it.
func (db *DB) Restore(table, key string, it Item) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.table(&table)
	db.write(table, key, CopyItem(it))
}
