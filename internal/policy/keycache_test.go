package policy

import (
	"fmt"
	"sync"
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// checkCharges checks the charges planConfig's per-ip and per-key policies give a request: the
// documented bucket key, and the limit of its override.
func checkCharges(set *Set, remote, apiKey string) error {
	var p Plan
	r := newRequest("GET", "/", remote, "X-Api-Key", apiKey)
	if err := set.Plan(r, &p); err != nil {
		return err
	}
	got := map[string]bucket.Charge{}
	for i, pol := range p.Policies {
		got[pol.Name] = p.Charges[i]
	}
	ip := remote[:len(remote)-len(":1")]
	if c := got["per-ip"]; c.Key != keyOf("per-ip", "token_bucket", "ip", ip) {
		return fmt.Errorf("per-ip key of %s: %s, want the recipe's", ip, c.Key)
	}
	c, ok := got["per-key"]
	switch apiKey {
	case "internal": // unlimited: no charge
		if ok {
			return fmt.Errorf("the unlimited key was charged")
		}
		return nil
	case "premium":
		if c.Limit.Count != 1000 {
			return fmt.Errorf("premium: limit %d, want its override's 1000", c.Limit.Count)
		}
	default:
		if c.Limit.Count != 100 {
			return fmt.Errorf("%s: limit %d, want the policy's 100", apiKey, c.Limit.Count)
		}
	}
	if c.Key != keyOf("per-key", "fixed_window", "api_key", apiKey) {
		return fmt.Errorf("per-key key of %q: %s, want the recipe's", apiKey, c.Key)
	}
	return nil
}

// A value planned again is charged exactly as the first time: the same bucket key and its
// override (limited and unlimited alike), also after more values than the cache has slots went
// through it, and a CIDR override still wins over the cache.
func TestKeyCacheChargesAsTheRecipe(t *testing.T) {
	set := mustCompile(t, planConfig)
	values := []string{"premium", "internal", "plain"}
	for i := range 3 * keyCacheSlots {
		values = append(values, fmt.Sprintf("key-%d", i))
	}
	for round := range 3 {
		for i, v := range values {
			remote := fmt.Sprintf("192.0.2.%d:1", i%7)
			if err := checkCharges(set, remote, v); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			// The hot values again, between every other: mostly answered by the cache.
			for _, hot := range values[:3] {
				if err := checkCharges(set, "192.0.2.1:1", hot); err != nil {
					t.Fatalf("round %d, after %q: %v", round, v, err)
				}
			}
		}
	}
	// 198.51.100.200 has its own CIDR override (burst 7) whatever the cache holds for its text.
	for range 3 {
		c := plan(t, set, newRequest("GET", "/", "198.51.100.200:1"))["per-ip"]
		if c.Limit.Burst != 7 || c.Key != keyOf("per-ip", "token_bucket", "ip", "198.51.100.200") {
			t.Fatalf("CIDR override: burst %d key %s", c.Limit.Burst, c.Key)
		}
	}
}

// The cache serves concurrent plans of many values (run with -race: its slots are seqlocked
// with atomics, so a torn slot is a miss, never a wrong key).
func TestKeyCacheConcurrent(t *testing.T) {
	set := mustCompile(t, planConfig)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				// Few values shared by every goroutine: the same slots written and read at once.
				v := fmt.Sprintf("key-%d", (i*(g+1))%(keyCacheSlots+3))
				if i%3 == 0 {
					v = "premium"
				}
				if err := checkCharges(set, fmt.Sprintf("192.0.2.%d:1", i%5), v); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A slot answers only the fingerprint it holds: another fingerprint of the same slot, or one
// that differs in its second half, misses; a slot being written misses.
func TestKeyCacheSlot(t *testing.T) {
	c := newKeyCache()
	fp := fingerprint(c, "premium")
	if _, _, ok := c.get(fp); ok {
		t.Fatal("an empty cache answered")
	}
	o := &override{}
	key := bucket.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	c.put(fp, key, o)
	if k, got, ok := c.get(fp); !ok || k != key || got != o {
		t.Fatalf("get = %v %p %v, want %v %p true", k, got, ok, key, o)
	}
	if _, _, ok := c.get([2]uint64{fp[0], fp[1] ^ 1}); ok {
		t.Fatal("a fingerprint differing in its second half was answered")
	}
	if _, _, ok := c.get([2]uint64{fp[0] + keyCacheSlots, fp[1]}); ok {
		t.Fatal("another fingerprint of the same slot was answered")
	}
	s := &c.slots[fp[0]%keyCacheSlots]
	s.seq.Add(1) // a writer holds the slot
	if _, _, ok := c.get(fp); ok {
		t.Fatal("a slot being written was answered")
	}
	c.put(fp, bucket.Key{}, nil) // skipped: the slot is held
	s.seq.Add(1)
	if k, _, ok := c.get(fp); !ok || k != key {
		t.Fatal("a write into a held slot was not skipped")
	}
	if fingerprint(c, "premium") != fingerprint(c, []byte("premium")) {
		t.Fatal("a value's fingerprint depends on its type")
	}
}
