package console

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// Exemption is a temporary replacement limit (or none at all) for one key of one policy. It ends
// by itself at ExpiresAt.
type Exemption struct {
	ID     string `json:"id"`
	Policy string `json:"policy"`
	// Key is the key as the access log shows it: an IP in clear, else its pseudonym.
	Key       string     `json:"key"`
	Limit     *LimitSpec `json:"limit,omitempty"`
	Unlimited bool       `json:"unlimited,omitempty"`
	ExpiresAt time.Time  `json:"expires_at"`
	Reason    string     `json:"reason,omitempty"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`

	// BucketKey is the charge's bucket key (a digest: no raw key) that the exemption applies to.
	BucketKey bucket.Key `json:"-"`
	// BucketLimit is the replacement limit compiled for the policy.
	BucketLimit bucket.Limit `json:"-"`

	lim     bucket.Limit
	expires int64 // Unix ns
}

// LimitSpec is a replacement limit, written as an override is: rate and burst for token and
// leaky buckets, limit (and window, default the policy's) for windows, quotas and concurrency.
type LimitSpec struct {
	Rate   string `json:"rate,omitempty"`
	Burst  int64  `json:"burst,omitempty"`
	Limit  int64  `json:"limit,omitempty"`
	Window string `json:"window,omitempty"`
}

type exKey struct {
	policy string
	key    bucket.Key
}

// exemptions holds this replica's view of the exemptions: a list under mu, and an index for
// the request path rebuilt on every change (swapped atomically, so Adjust takes no lock).
type exemptions struct {
	mu    sync.Mutex
	all   map[string]*Exemption // by id
	index atomic.Pointer[map[exKey]*Exemption]
}

// put adds or replaces exemptions (by id) and drops those that have expired.
func (x *exemptions) put(now time.Time, es ...*Exemption) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.all == nil {
		x.all = make(map[string]*Exemption)
	}
	for _, e := range es {
		e.lim, e.expires = e.BucketLimit, e.ExpiresAt.UnixNano()
		x.all[e.ID] = e
	}
	x.rebuild(now)
}

// add adds e unless most live exemptions are held already (those expired are dropped first),
// reporting whether it did: the bound of a replica that shares no store.
func (x *exemptions) add(now time.Time, e *Exemption, most int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.all == nil {
		x.all = make(map[string]*Exemption)
	}
	x.rebuild(now)
	if len(x.all) >= most {
		return false
	}
	e.lim, e.expires = e.BucketLimit, e.ExpiresAt.UnixNano()
	x.all[e.ID] = e
	x.rebuild(now)
	return true
}

// replace sets the whole list (as read from a shared store).
func (x *exemptions) replace(now time.Time, es []*Exemption) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.all = make(map[string]*Exemption, len(es))
	for _, e := range es {
		e.lim, e.expires = e.BucketLimit, e.ExpiresAt.UnixNano()
		x.all[e.ID] = e
	}
	x.rebuild(now)
}

// remove deletes the exemption id, reporting whether it existed (and had not expired).
func (x *exemptions) remove(now time.Time, id string) (*Exemption, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.all[id]
	if ok {
		delete(x.all, id)
		x.rebuild(now)
	}
	return e, ok && now.UnixNano() < e.expires
}

// list returns the active exemptions, soonest to expire first.
func (x *exemptions) list(now time.Time) []*Exemption {
	x.mu.Lock()
	x.rebuild(now)
	out := make([]*Exemption, 0, len(x.all))
	for _, e := range x.all {
		out = append(out, e)
	}
	x.mu.Unlock()
	slices.SortFunc(out, func(a, b *Exemption) int { return a.ExpiresAt.Compare(b.ExpiresAt) })
	return out
}

// find returns the active exemption of a policy's key, or nil.
func (x *exemptions) find(now time.Time, policy string, key bucket.Key) *Exemption {
	idx := x.index.Load()
	if idx == nil {
		return nil
	}
	if e := (*idx)[exKey{policy, key}]; e != nil && now.UnixNano() < e.expires {
		return e
	}
	return nil
}

// rebuild drops expired exemptions and swaps in a new index. The caller holds mu.
func (x *exemptions) rebuild(now time.Time) {
	ns := now.UnixNano()
	idx := make(map[exKey]*Exemption, len(x.all))
	for id, e := range x.all {
		if ns >= e.expires {
			delete(x.all, id)
			continue
		}
		k := exKey{e.Policy, e.BucketKey}
		// Two exemptions of one key: the one that ends last applies.
		if old := idx[k]; old == nil || old.expires < e.expires {
			idx[k] = e
		}
	}
	x.index.Store(&idx)
}

// newID returns a random exemption id.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	return "ex_" + hex.EncodeToString(b[:])
}

// ResetRecord is one reset, for the page's "last resets".
type ResetRecord struct {
	At     time.Time `json:"at"`
	Policy string    `json:"policy"`
	Key    string    `json:"key"`
	Who    string    `json:"who"`
	Reason string    `json:"reason,omitempty"`
}

// resetLog keeps the last resets made through this replica.
type resetLog struct {
	mu   sync.Mutex
	last []ResetRecord
}

const resetLogLen = 20

func (l *resetLog) add(r ResetRecord) {
	l.mu.Lock()
	l.last = append(l.last, r)
	if len(l.last) > resetLogLen {
		l.last = slices.Delete(l.last, 0, len(l.last)-resetLogLen)
	}
	l.mu.Unlock()
}

// list returns the last resets, newest first.
func (l *resetLog) list() []ResetRecord {
	l.mu.Lock()
	out := slices.Clone(l.last)
	l.mu.Unlock()
	slices.Reverse(out)
	return out
}
