package sim

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
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
// epoch is the fake clock's start (synctest's bubbles start at midnight UTC, 2000-01-01).
var epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isHex(c byte) bool   { return isDigit(c) || c >= 'a' && c <= 'f' }
func isWord(c byte) bool  { return isHex(c) || c >= 'A' && c <= 'Z' || c >= 'g' && c <= 'z' || c == '_' }

// mask replaces the markers and slot ids in s (see above); a scanner, as regular expressions
// were a fifth of a run's time.
func mask(s string) string {
	var b []byte // nil until something is replaced
	last := 0
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case isDigit(c) && (i == 0 || !isWord(s[i-1])):
			j := i
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			if j-i >= 13 {
				v, err := strconv.ParseInt(s[i:j], 10, 64)
				if err != nil || v < epoch-int64(time.Hour) || v > epoch+int64(6*time.Hour) {
					b = append(append(b, s[last:i]...), 'M')
					last = j
				}
			}
			i = j
		case c == 'l' && (i == 0 || !isWord(s[i-1])):
			j := i + 1
			for j < len(s) && isHex(s[j]) {
				j++
			}
			if n := j - i - 1; n >= 6 && n <= 16 && (j == len(s) || !isWord(s[j])) {
				b = append(append(b, s[last:i]...), "l#"...)
				last = j
			}
			i = j
		default:
			i++
		}
	}
	if b == nil {
		return s
	}
	return string(append(b, s[last:]...))
}

// maskItem formats an item with each attribute masked, in the order of the masked forms (a
// sort by the real names would follow the random ids).
func maskItem(it map[string]types.AttributeValue) string {
	if it == nil {
		return "<none>"
	}
	parts := make([]string, 0, len(it))
	var b strings.Builder
	for k, v := range it {
		b.Reset()
		simddb.FormatAttr(&b, k, v)
		parts = append(parts, mask(b.String()))
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

func newPCG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x51a)) }
