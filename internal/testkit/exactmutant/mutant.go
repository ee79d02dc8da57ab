package exactmutant

import (
	"context"
	"errors"
	"maps"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// Store returns s as the mutant name makes it: AdmitEverything and GiveBackTwice wrap it, any
// other name leaves it as it is.
func Store(s bucket.Store, name string) bucket.Store {
	switch name {
	case AdmitEverything:
		return admitAll{}
	case GiveBackTwice:
		if r, ok := s.(bucket.Releaser); ok {
			return twice{r}
		}
	}
	return s
}

// admitAll admits every charge and remembers nothing.
type admitAll struct{}

func (admitAll) Take(_ context.Context, _ time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	for i := range charges {
		results[i] = bucket.Result{Allowed: true, Limit: 1}
	}
	return true, nil
}

func (admitAll) Release(context.Context, time.Time, []bucket.Taken) error { return nil }

// twice applies every give-back one more time.
type twice struct{ bucket.Releaser }

// Take gives the charges of a rejected group back once more: in refund mode the store has
// written them and given them back already.
func (t twice) Take(ctx context.Context, now time.Time, charges []bucket.Charge, results []bucket.Result) (bool, error) {
	admitted, err := t.Releaser.Take(ctx, now, charges, results)
	if err != nil || admitted {
		return admitted, err
	}
	var again []bucket.Taken
	for i, c := range charges {
		if results[i].Allowed && !c.Shadow && c.Limit.Algorithm != bucket.Concurrency {
			again = append(again, bucket.Taken{Charge: c, At: now, Token: results[i].Token})
		}
	}
	if len(again) > 0 {
		_ = t.Releaser.Release(context.WithoutCancel(ctx), now, again)
	}
	return false, nil
}

func (t twice) Release(ctx context.Context, now time.Time, taken []bucket.Taken) error {
	return errors.Join(t.Releaser.Release(ctx, now, taken), t.Releaser.Release(ctx, now, taken))
}

// Client returns api as the mutant name makes it: ResendWithoutMarker and the console's
// mutants (console.go) wrap it, any other name
// leaves it as it is.
func Client(api dynamo.API, name string) dynamo.API {
	switch name {
	case ResendWithoutMarker:
		return resend{api}
	case ResetLeavesSlots, ResetUnconditional, ExemptionOutlivesExpiry:
		return consoleMutant{api, name, &expiries{}}
	}
	return api
}

// resend sends a give-back (an update carrying a marker) once, and when its answer is lost
// sends it again without its marker: the same change, conditioned on the rest of its condition
// only, and leaving no marker behind, so that nothing tells it from a new give-back (and the
// store's later give-backs, which the marker orders, are not disturbed).
type resend struct{ dynamo.API }

func (r resend) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if !marked(in) {
		return r.API.UpdateItem(ctx, in, optFns...)
	}
	once := append(append([]func(*dynamodb.Options){}, optFns...), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	out, err := r.API.UpdateItem(ctx, in, once...)
	var apiErr interface{ ErrorCode() string }
	if err == nil || errors.As(err, &apiErr) || ctx.Err() != nil {
		return out, err // answered (or given up): nothing was lost
	}
	return r.API.UpdateItem(ctx, unmarked(in), optFns...)
}

// markerEdits strip each give-back form's marker (internal/dynamo/giveback.go and
// internal/dynamo/lease/giveback.go), leaving the change and the rest of its condition:
//   - a counter's: its id in the epoch's set g (added, or starting the next epoch with it);
//   - a token bucket's: the charge's own marker in the chain, which the give-back replaces
//     with its id;
//   - a lease give-back's: the marker of the lease write it undoes, in lv.
//
// Without them a re-sent copy is a new give-back to DynamoDB: the same change applied again.
var markerEdits = []struct{ old, new string }{
	{" AND (attribute_not_exists(#g) OR (size(#g) < :k AND NOT contains(#g, :gid)))", ""},
	{" AND size(#g) >= :k AND NOT contains(#g, :gid)", ""},
	{"ADD #count :minus, #g :gs", "ADD #count :minus"},
	{" SET #g = :gs, #e = :next", ""},
	{", #wp = :gid", ""},
	{"#wp = :w AND ", ""},
	{"#wp = :w", ""},
	{", #lv = :gid", ""},
	{" AND #lv = :lv", ""},
}

// marked reports whether in is a give-back: every form carries its own id as :gid.
func marked(in *dynamodb.UpdateItemInput) bool {
	_, ok := in.ExpressionAttributeValues[":gid"]
	return ok
}

// unmarked is in without its marker parts, and without the names and values only they used
// (DynamoDB refuses an unused one).
func unmarked(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	c := *in
	strip := func(s *string) string {
		if s == nil {
			return ""
		}
		v := *s
		for _, e := range markerEdits {
			v = strings.ReplaceAll(v, e.old, e.new)
		}
		return v
	}
	upd, cond := strip(in.UpdateExpression), strip(in.ConditionExpression)
	c.UpdateExpression, c.ConditionExpression = &upd, nil
	if cond != "" {
		c.ConditionExpression = &cond
	}
	used := func(k string) bool {
		re := regexp.MustCompile(regexp.QuoteMeta(k) + `\b`)
		return re.MatchString(upd) || re.MatchString(cond)
	}
	c.ExpressionAttributeValues = maps.Clone(in.ExpressionAttributeValues)
	maps.DeleteFunc(c.ExpressionAttributeValues, func(k string, _ types.AttributeValue) bool { return !used(k) })
	c.ExpressionAttributeNames = maps.Clone(in.ExpressionAttributeNames)
	maps.DeleteFunc(c.ExpressionAttributeNames, func(k, _ string) bool { return !used(k) })
	return &c
}

// Unmarked is a give-back's write without its marker (see markerEdits), for the simulator's
// give-back-without-its-marker mutant (internal/testkit/sim).
func Unmarked(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput { return unmarked(in) }

// Marked reports whether in is a give-back (it carries its own id as :gid).
func Marked(in *dynamodb.UpdateItemInput) bool { return marked(in) }
