package sim

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simddb"
)

// The history masks what the Go scheduler may order differently between two runs of a seed: a
// decision's concurrent writes draw their random markers and slot ids from the replica's seeded
// source in the order its goroutines run, so the values (never their equalities, which is all
// the store uses them for) may swap between runs. A number of 13 digits or more that is not an
// instant of the run (nanoseconds since the fake clock's start, give or take hours) is a marker
// and becomes M; a slot attribute's hex id becomes l#.
var (
	longNumber = regexp.MustCompile(`[0-9]{13,}`)
	slotID     = regexp.MustCompile(`\bl[0-9a-f]{6,16}\b`)
	// epoch is the fake clock's start (synctest's bubbles start at midnight UTC, 2000-01-01).
	epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
)

func mask(s string) string {
	s = longNumber.ReplaceAllStringFunc(s, func(n string) string {
		v, err := strconv.ParseInt(n, 10, 64)
		if err == nil && v >= epoch-int64(time.Hour) && v <= epoch+int64(6*time.Hour) {
			return n
		}
		return "M"
	})
	return slotID.ReplaceAllString(s, "l#")
}

func newPCG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x51a)) }

// maskItem formats an item with each attribute masked, in the order of the masked forms (a
// sort by the real names would follow the random ids).
func maskItem(it map[string]types.AttributeValue) string {
	if it == nil {
		return "<none>"
	}
	parts := make([]string, 0, len(it))
	for k, v := range it {
		parts = append(parts, mask(simddb.Format(map[string]types.AttributeValue{k: v})))
	}
	slices.Sort(parts)
	return strings.Join(parts, "")
}

// jitter is a duration in (0, most] drawn from what a call is (its masked description) and the
// seed: the same for the same call whichever goroutine makes it first.
func jitter(seed uint64, desc string, attempt int, most time.Duration) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d %d %s", seed, attempt, desc)
	return time.Duration(h.Sum64()%uint64(most)) + 1
}
