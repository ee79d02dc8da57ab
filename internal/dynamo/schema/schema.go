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
func NewMarker() uint64 { return Rand(nil).Marker() }

// Rand is the random source of a store's markers, ids, jitter and shard choices: nil draws from
// math/rand/v2's global source (what the gateway uses). The simulator gives each replica a
// seeded one, so that a seed repeats its run.
type Rand func() uint64

// Uint64 draws 64 random bits.
func (r Rand) Uint64() uint64 {
	if r == nil {
		return rand.Uint64()
	}
	return r()
}

// Marker draws a write's marker (see NewMarker).
func (r Rand) Marker() uint64 { return r.Uint64()>>2 | 1 }

// Int64N draws from [0, n); n > 0.
func (r Rand) Int64N(n int64) int64 {
	if r == nil {
		return rand.Int64N(n)
	}
	return int64(r() % uint64(n))
}

// IntN draws from [0, n); n > 0.
func (r Rand) IntN(n int) int { return int(r.Int64N(int64(n))) }

// Shuffle shuffles n elements with swap.
func (r Rand) Shuffle(n int, swap func(i, j int)) {
	if r == nil {
		rand.Shuffle(n, swap)
		return
	}
	for i := n - 1; i > 0; i-- {
		swap(i, r.IntN(i+1))
	}
}

// BucketKey is the item of a token or leaky bucket whose key is key (the charge's bucket.Key in
// hex).
func BucketKey(key string) string { return key + "#g" }

// WindowKey is the item of key's fixed window that starts at start (Unix ns).
func WindowKey(key string, start int64) string {
	return key + "#w" + strconv.FormatInt(start, 10)
}
