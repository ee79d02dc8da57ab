// Package schema is the part of the DynamoDB table's layout that the store and its lease pools
// share: attribute names, how values are encoded, and the items' keys.
package schema

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute names. count and ttl are DynamoDB reserved words, so expressions name every
// attribute through ExpressionAttributeNames.
const (
	Tat   = "tat"
	Count = "count"
	TTL   = "ttl"
	// LeaseWrite is the marker of the last write to a leased token bucket's shard: a random
	// id per lease write, and a give-back's own id.
	LeaseWrite = "lv"
)

// TTLMargin is how long an item is kept after it can no longer affect a decision.
const TTLMargin = time.Hour

// TTLAt is the ttl attribute for an item that can affect decisions until instant ns.
func TTLAt(ns int64) types.AttributeValue {
	sec := (ns + int64(time.Second) - 1) / int64(time.Second)
	return Num(sec + int64(TTLMargin/time.Second))
}

// Num is a number's attribute value.
func Num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// Unum is a marker's attribute value.
func Unum(v uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(v, 10)}
}

// Number returns the numeric attribute name of item, and whether it is there.
func Number(item map[string]types.AttributeValue, name string) (int64, bool, error) {
	av, ok := item[name]
	if !ok {
		return 0, false, nil
	}
	nv, ok := av.(*types.AttributeValueMemberN)
	if !ok {
		return 0, false, fmt.Errorf("attribute %s is %T, want a number", name, av)
	}
	v, err := strconv.ParseInt(nv.Value, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("attribute %s: %w", name, err)
	}
	return v, true, nil
}

// NewMarker draws the marker of a write: never zero (Result.Token's "none"), top two bits clear
// (the fallback store marks its own tokens with the top bit).
func NewMarker() uint64 { return rand.Uint64()>>2 | 1 }

// BucketKey is the item of a token or leaky bucket whose key is key (the charge's bucket.Key in
// hex).
func BucketKey(key string) string { return key + "#g" }

// WindowKey is the item of key's fixed window that starts at start (Unix ns).
func WindowKey(key string, start int64) string {
	return key + "#w" + strconv.FormatInt(start, 10)
}
