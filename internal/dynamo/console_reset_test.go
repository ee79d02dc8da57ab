package dynamo_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// hookAPI is a dynamo.API that runs afterRead once a BatchGetItem naming an item whose key
// ends with suffix has been answered, before the answer reaches the caller: a write of another
// replica landing between the console's read and its write, without sleeps.
type hookAPI struct {
	dynamo.API
	suffix    string
	once      sync.Once
	afterRead func()
}

func (h *hookAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	out, err := h.API.BatchGetItem(ctx, in, optFns...)
	for _, ka := range in.RequestItems {
		for _, k := range ka.Keys {
			if pk, ok := k["pk"].(*types.AttributeValueMemberS); ok && strings.HasSuffix(pk.Value, h.suffix) {
				h.once.Do(h.afterRead)
			}
		}
	}
	return out, err
}

// fillSlots takes slots of c on s at now until one is refused, and returns what it took.
func fillSlots(t *testing.T, s *dynamo.Store, now time.Time, c bucket.Charge, most int) []bucket.Taken {
	t.Helper()
	var taken []bucket.Taken
	for range most {
		ok, r := takeSlot(t, s, now, c)
		if !ok {
			break
		}
		taken = append(taken, bucket.Taken{Charge: c, At: now, Token: r.Token})
	}
	return taken
}

func release(t *testing.T, s *dynamo.Store, now time.Time, taken []bucket.Taken) {
	t.Helper()
	if err := s.Release(context.Background(), now, taken); err != nil {
		t.Fatal(err)
	}
}

// A reset with more slots in flight than one write can name (120 at limit 150) removes them all:
// their releases afterwards change nothing, and the key then admits exactly its limit at once,
// its count never below zero (on 85d8db7 the reset removed 100 slots and the whole count, the 20
// left released into nothing, and 170 ran at once).
func TestAdminResetRemovesEverySlot(t *testing.T) {
	api, table := adminTable(t)
	s := dynamo.New(api, dynamo.Options{Table: table})
	t.Cleanup(func() { _ = s.Close() })
	c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 150}}
	before := fillSlots(t, s, t0, c, 120)
	if len(before) != 120 {
		t.Fatalf("took %d slots before the reset, want 120", len(before))
	}
	if err := s.Reset(context.Background(), t0, c); err != nil {
		t.Fatal(err)
	}
	if p, err := s.Peek(context.Background(), t0, c); err != nil || p.Remaining != 150 {
		t.Fatalf("peek after the reset: %+v %v, want remaining 150", p, err)
	}
	release(t, s, t0, before) // the requests in flight at the reset end
	if p, err := s.Peek(context.Background(), t0, c); err != nil || p.Remaining != 150 {
		t.Fatalf("peek after the old slots' releases: %+v %v, want remaining 150 (count 0, not below)", p, err)
	}
	after := fillSlots(t, s, t0, c, 200)
	if len(after) != 150 {
		t.Fatalf("after the reset and the releases: %d in flight at once, want 150", len(after))
	}
	release(t, s, t0, after)
	if p, _ := s.Peek(context.Background(), t0, c); p.Remaining != 150 {
		t.Fatalf("peek at the end: remaining %d, want 150", p.Remaining)
	}
}

// A take by another replica that lands between the reset's read and its write keeps its slot and
// its unit of count: when it is released, the key admits its limit and no more (on 85d8db7 the
// reset removed the count but not the new slot, whose release took the count to -1: limit 3, 4
// at once).
func TestAdminResetRacesTake(t *testing.T) {
	api, table := adminTable(t)
	b := dynamo.New(api, dynamo.Options{Table: table})
	t.Cleanup(func() { _ = b.Close() })
	c := bucket.Charge{Key: newKey(t), Limit: bucket.Limit{Algorithm: bucket.Concurrency, Count: 3}}
	var raced []bucket.Taken
	h := &hookAPI{API: api, suffix: "#c", afterRead: func() { raced = fillSlots(t, b, t0, c, 1) }}
	a := dynamo.New(h, dynamo.Options{Table: table})
	t.Cleanup(func() { _ = a.Close() })
	before := fillSlots(t, a, t0, c, 1)
	if err := a.Reset(context.Background(), t0, c); err != nil {
		t.Fatal(err)
	}
	if len(raced) != 1 {
		t.Fatalf("the take between the reset's read and write: %d admitted, want 1", len(raced))
	}
	if p, _ := b.Peek(context.Background(), t0, c); p.Remaining != 2 {
		t.Fatalf("after the reset: remaining %d, want 2 (the raced take's slot is still held)", p.Remaining)
	}
	release(t, b, t0, append(raced, before...))
	if got := fillSlots(t, b, t0, c, 10); len(got) != 3 {
		t.Fatalf("after the releases: %d in flight at once, want 3", len(got))
	}
}
