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
// are make check-exact's self-test's (package exactmutant); the last three are the simulator's own.
const (
	clockAhead = exactmutant.ClockAheadUncorrected
	// giveBackUnmarked sends every give-back without its marker: a copy that lands twice (a
	// lost answer, a write applied after its client gave up) gives back twice.
	giveBackUnmarked = "give-back-without-its-marker"
	// leaseTwice grants each lease's units without taking them from the table: the next lease
	// write, on any replica, is granted the same units again.
	leaseTwice = "lease-granted-twice"
	// resetKeepsCount answers a reset's write of a counter (a window's, a quota's, a slot's)
	// without sending it: the key is not full after its reset.
	resetKeepsCount = "reset-keeps-its-count"
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
	resetKeepsCount,
}

// RedisMutants lists the mutants that apply to the Redis store, which a Redis run must catch:
// the stores' own wrappers (admit-everything, give-back-twice), the clock, and the Redis forms
// of the give-back, reset and exemption mutants (redis.go). The others have no Redis
// counterpart: the client never re-sends (re-send-a-lost-write-without-its-marker), a reset is
// one DEL, not a read and a write (reset-reads-then-writes-unconditionally), and Redis has no
// leases (lease-granted-twice).
var RedisMutants = []string{
	exactmutant.AdmitEverything,
	exactmutant.GiveBackTwice,
	exactmutant.ClockAheadUncorrected,
	exactmutant.ResetLeavesSlots,
	exactmutant.ExemptionOutlivesExpiry,
	giveBackUnmarked,
	resetKeepsCount,
}

// MutantsOf lists the mutants a run on backend b must catch.
func MutantsOf(b string) []string {
	if backend(b) == backendRedis {
		return RedisMutants
	}
	return Mutants
}

// Backends are the shared stores a run may put its three shared replicas on.
var Backends = []string{string(backendDynamo), string(backendRedis)}

// The determinism mutants: a simulator that breaks its own promise that a seed repeats its
// history byte for byte. The same-seed check must fail with each (they are no store's bug, so
// the safety checks need not catch them).
const (
	// unseededRand gives the replicas' stores no seeded source: their markers, backoff jitter
	// and lease shard choices come from math/rand/v2's.
	unseededRand = "unseeded-rand"
	// noTurns runs the goroutines as the Go scheduler does, not one at a time (turns.go).
	noTurns = "no-turns"
)

// DeterminismMutants lists them.
var DeterminismMutants = []string{unseededRand, noTurns}

// DeterminismMutantsOf lists the determinism mutants that part some seed of backend b. On
// Redis, no-turns does not: with the Redis store's Gate (and its client's turns) removed, 16
// seeds of 2,000 decisions repeated, since its only goroutines of its own (the renewal loop,
// Close) wake on their own timers and what they send is ordered (the renewals by slot id:
// without that order 4 of 6 seeds part).
func DeterminismMutantsOf(b string) []string {
	if backend(b) == backendRedis {
		return []string{unseededRand}
	}
	return DeterminismMutants
}

// mutantClient wraps a replica's client for the simulator's own client-side mutants.
func mutantClient(a dynamo.API, name string) dynamo.API {
	switch name {
	case giveBackUnmarked:
		return unmarkedGiveBacks{a}
	case resetKeepsCount:
		return keptCounts{a}
	}
	return a
}

type keptCounts struct{ dynamo.API }

func (k keptCounts) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if in.UpdateExpression != nil && *in.UpdateExpression == "SET #count = :zero" {
		return &dynamodb.UpdateItemOutput{}, nil
	}
	return k.API.UpdateItem(ctx, in, optFns...)
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
