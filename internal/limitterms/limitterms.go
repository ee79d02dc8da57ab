// Package limitterms holds the terms of a limit that both formats of limits share.
//
// The terms (bounds, names, spellings, zones, the one check of what a limit means) are what the
// two formats that define limits share: ratelimit-proxy's own
// configuration (internal/policy) and envoyproxy/ratelimit's rule files (internal/envoyrules).
// Both bound counts alike, accept the same pool and namespace names, load quota time zones
// alike, write durations alike in their messages, and mark a pool's and a namespace's bucket
// keys alike, and spell the algorithms alike (in files and in the bucket keys), so that neither
// format can drift from the other. It imports internal/bucket only.
package limitterms

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	// Quotas name IANA zones: the binary carries the zone database (about 450 kB), so a
	// time_zone works in a distroless or scratch image without /usr/share/zoneinfo, and means the
	// same on every replica.
	_ "time/tzdata"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

const (
	// MaxCount bounds a limit's count and a bucket's burst. It keeps every derived duration
	// (burst/rate, a window) far inside time.Duration's range, so the bucket arithmetic cannot
	// overflow.
	MaxCount = 1_000_000_000
	// MaxNameLen bounds the names of policies, pools and namespaces: names end up in metric
	// labels and log lines.
	MaxNameLen = 64
)

// algorithmNames are the algorithms as configuration files spell them, indexed by
// bucket.Algorithm, in the order the docs list them. Bucket keys hash these names: never
// change one.
var algorithmNames = [...]string{
	bucket.TokenBucket:   "token_bucket",
	bucket.LeakyBucket:   "leaky_bucket",
	bucket.FixedWindow:   "fixed_window",
	bucket.SlidingWindow: "sliding_window",
	bucket.Concurrency:   "concurrency",
	bucket.Quota:         "quota",
}

// AlgorithmName is the configuration name of a (token_bucket, fixed_window, ...), "" for an
// algorithm that has none.
func AlgorithmName(a bucket.Algorithm) string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return ""
}

// AlgorithmNames returns every algorithm's configuration name, in the order the docs list them.
func AlgorithmNames() []string {
	names := make([]string, 0, len(algorithmNames))
	for _, n := range algorithmNames {
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}

// ValidName reports whether s holds only A-Z a-z 0-9 _ . - (callers check its length against
// MaxNameLen and whether it may be empty).
func ValidName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// LoadZone loads a quota's time zone: "" is UTC. Local is refused: it is whatever zone each
// replica's machine has, so replicas would disagree on when a period ends. The errors are
// worded to follow a field's path and value.
func LoadZone(name string) (*time.Location, error) {
	switch name {
	case "":
		return time.UTC, nil
	case "Local":
		return nil, errors.New("is this machine's zone, which may differ between replicas: name the zone, such as Europe/Berlin, or UTC")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, errors.New("unknown time zone: use an IANA name such as Europe/Berlin or America/New_York, or UTC")
	}
	return loc, nil
}

// ShortDuration drops the zero tails of time.Duration.String: 1m rather than 1m0s.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// StoreName is the name that a policy's or a rule's bucket keys are derived from: pool when it
// is set (shared on purpose by every policy and rule, of any gateway on the table, that names
// it), else name within namespace (store.dynamodb.namespace; "" for none). The marks keep the
// three apart, since a name never starts with a control byte, and leave the keys of a name
// without namespace or pool as they always were. Keys are the state in the store: changing a
// byte here starts every bucket afresh.
func StoreName(namespace, name, pool string) string {
	if pool != "" {
		return "\x02pool\x00" + pool
	}
	if namespace != "" {
		return "\x01ns\x00" + namespace + "\x00" + name
	}
	return name
}

// CheckLeaseShape checks a lease's shards and ttl as both formats give them (0 means the
// default): it returns the field (shards or ttl), the value as written and what is wrong, or
// field "" when both are in range.
func CheckLeaseShape(shards int, ttl time.Duration) (field, value, msg string) {
	if shards < 0 || shards > bucket.MaxLeaseShards {
		return "shards", strconv.Itoa(shards), fmt.Sprintf("must be from 1 to %d", bucket.MaxLeaseShards)
	}
	if ttl < 0 {
		return "ttl", ShortDuration(ttl), "must be positive"
	}
	return "", "", ""
}
