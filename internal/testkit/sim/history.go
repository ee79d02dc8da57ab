package sim

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"time"
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
