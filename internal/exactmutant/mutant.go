//go:build exactmutant

package exactmutant

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
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

// Client returns api as the mutant name makes it: ResendWithoutMarker wraps it, any other name
// leaves it as it is.
func Client(api dynamo.API, name string) dynamo.API {
	if name == ResendWithoutMarker {
		return resend{api}
	}
	return api
}

// resend sends a give-back (an update carrying a marker value) once, and when its answer is
// lost sends it again with fresh marker values: the write cannot be told from a new one.
type resend struct{ dynamo.API }

// markerValues are the placeholders of the give-backs' markers (internal/dynamo giveback.go).
var markerValues = []string{":gid", ":gs", ":seq"}

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
	return r.API.UpdateItem(ctx, fresh(in), optFns...)
}

func marked(in *dynamodb.UpdateItemInput) bool {
	for _, k := range markerValues {
		if _, ok := in.ExpressionAttributeValues[k]; ok {
			return true
		}
	}
	return false
}

// fresh is in with new marker values: a new give-back id, a sequence number one higher.
func fresh(in *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	c := *in
	c.ExpressionAttributeValues = make(map[string]types.AttributeValue, len(in.ExpressionAttributeValues))
	for k, v := range in.ExpressionAttributeValues {
		c.ExpressionAttributeValues[k] = v
	}
	gid := strconv.FormatUint(rand.Uint64()>>2|1, 10)
	if _, ok := c.ExpressionAttributeValues[":gid"]; ok {
		c.ExpressionAttributeValues[":gid"] = &types.AttributeValueMemberN{Value: gid}
	}
	if _, ok := c.ExpressionAttributeValues[":gs"]; ok {
		c.ExpressionAttributeValues[":gs"] = &types.AttributeValueMemberNS{Value: []string{gid}}
	}
	if v, ok := c.ExpressionAttributeValues[":seq"].(*types.AttributeValueMemberN); ok {
		if n, err := strconv.ParseInt(v.Value, 10, 64); err == nil {
			c.ExpressionAttributeValues[":seq"] = &types.AttributeValueMemberN{Value: strconv.FormatInt(n+1, 10)}
		}
	}
	return &c
}
