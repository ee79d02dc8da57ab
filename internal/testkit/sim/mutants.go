package sim

import (
	"context"
	"regexp"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

// The mutants: broken stores every one of which the default seeds must catch. The first seven
// are make check-exact's self-test's (package exactmutant); the last two are the simulator's own.
const (
	clockAhead = exactmutant.ClockAheadUncorrected
	// giveBackUnmarked sends every give-back without its marker: a copy that lands twice (a
	// lost answer, a write applied after its client gave up) gives back twice.
	giveBackUnmarked = "give-back-without-its-marker"
	// leaseTwice grants each lease's units without taking them from the table: the next lease
	// write, on any replica, is granted the same units again.
	leaseTwice = "lease-granted-twice"
)

// clockAheadBy is how far clockAhead's replica's clock runs ahead, uncorrected.
const clockAheadBy = 2_000_000_000 // 2 s

// Mutants lists every mutant the simulator must catch.
var Mutants = []string{
	exactmutant.AdmitEverything,
	exactmutant.GiveBackTwice,
	exactmutant.ResendWithoutMarker,
	exactmutant.ClockAheadUncorrected,
	exactmutant.ResetLeavesSlots,
	exactmutant.ResetUnconditional,
	exactmutant.ExemptionOutlivesExpiry,
	giveBackUnmarked,
	leaseTwice,
}

// mutantClient wraps a replica's client for the simulator's own client-side mutants.
func mutantClient(a dynamo.API, name string) dynamo.API {
	if name == giveBackUnmarked {
		return unmarkedGiveBacks{a}
	}
	return a
}

type unmarkedGiveBacks struct{ dynamo.API }

func (u unmarkedGiveBacks) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if exactmutant.Marked(in) {
		in = exactmutant.Unmarked(in)
	}
	return u.API.UpdateItem(ctx, in, optFns...)
}

// leaseShardItem matches a lease pool's shard items (internal/dynamo/lease: "#l" and the shard).
var leaseShardItem = regexp.MustCompile(`#l[0-9]+$`)

// isLeaseGrant reports whether c is a lease write that takes units (not a give-back).
func isLeaseGrant(c *call) bool {
	in, ok := c.in.(*dynamodb.UpdateItemInput)
	if !ok {
		return false
	}
	pk, ok := in.Key["pk"].(*types.AttributeValueMemberS)
	if !ok || !leaseShardItem.MatchString(pk.Value) {
		return false
	}
	_, gid := in.ExpressionAttributeValues[":gid"]
	return !gid
}
