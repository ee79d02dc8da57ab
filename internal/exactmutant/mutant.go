//go:build exactmutant

package exactmutant

import (
	"context"
	"errors"
	"maps"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

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

// Client returns api as the mutant name makes it: ResendWithoutMarker wraps it, any other name
// leaves it as it is.
func Client(api dynamo.API, name string) dynamo.API {
	if name == ResendWithoutMarker {
		return resend{api}
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

// The marker parts of the give-backs' updates (internal/dynamo giveback.go): a count's
// sequence number (#b, :seq), a token bucket's give-back id (#g, :gid, :gs).
var (
	markerParts = []string{
		" AND (attribute_not_exists(#b) OR #b < :seq)", " SET #b = :seq",
		" AND NOT contains(#g, :gid)", " ADD #g :gs",
	}
	markerValues = []string{":seq", ":gid", ":gs"}
	markerNames  = []string{"#b", "#g"}
)

func marked(in *dynamodb.UpdateItemInput) bool {
	for _, k := range markerValues {
		if _, ok := in.ExpressionAttributeValues[k]; ok {
			return true
		}
	}
	return false
}

// unmarked is in without its marker parts.
func unmarked(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	c := *in
	strip := func(s *string) *string {
		if s == nil {
			return nil
		}
		v := *s
		for _, p := range markerParts {
			v = strings.ReplaceAll(v, p, "")
		}
		return &v
	}
	c.UpdateExpression, c.ConditionExpression = strip(in.UpdateExpression), strip(in.ConditionExpression)
	c.ExpressionAttributeValues = maps.Clone(in.ExpressionAttributeValues)
	for _, k := range markerValues {
		delete(c.ExpressionAttributeValues, k)
	}
	c.ExpressionAttributeNames = maps.Clone(in.ExpressionAttributeNames)
	for _, k := range markerNames {
		delete(c.ExpressionAttributeNames, k)
	}
	return &c
}
