package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The operators' console (package admin) on Redis: Peek reads a key's state without writing,
// Reset deletes it, and exemptions live in two keys of their own slot ({admin}), shared by
// every replica. No replica caches a key's state, so a reset holds everywhere at once.

// MaxExemptionData bounds one exemption's JSON.
const MaxExemptionData = 16 << 10

// Peek returns the state of c's key at now without charging it, as bucket.Memory.Peek
// describes.
func (s *Store) Peek(ctx context.Context, now time.Time, c bucket.Charge) (bucket.Result, error) {
	c.Cost = 1
	n := now.UnixNano()
	l := c.Limit
	key := s.key(&c)
	var (
		r   bucket.Result
		tat int64
	)
	switch l.Algorithm {
	case bucket.TokenBucket, bucket.LeakyBucket:
		v, err := s.hmget(ctx, key, "t")
		if err != nil {
			return r, err
		}
		tat = v[0]
		_, r = bucket.GCRAN(tat, n, l, 1)
	case bucket.FixedWindow, bucket.Quota:
		v, err := s.hmget(ctx, key, "e", "c")
		if err != nil {
			return r, err
		}
		st := bucket.FixedState{End: v[0], Count: v[1]}
		if l.Algorithm == bucket.Quota {
			_, r = bucket.QuotaN(st, n, l, 1)
		} else {
			_, r = bucket.FixedN(st, n, l, 1)
		}
	case bucket.SlidingWindow:
		fields := []string{"w", "s"}
		for i := range bucket.SlidingSlots + 1 {
			fields = append(fields, strconv.Itoa(i))
		}
		v, err := s.hmget(ctx, key, fields...)
		if err != nil {
			return r, err
		}
		var st bucket.SlidingState
		if v[0] == bucket.SlidingWidth(l) {
			st = bucket.SlidingState{Width: v[0], Slot: v[1]}
			for i := range st.Counts {
				st.Counts[i] = uint32(max(v[2+i], 0))
			}
		}
		_, r = bucket.SlidingN(st, n, l, 1)
	case bucket.Concurrency:
		c, err := s.client()
		if err != nil {
			return r, err
		}
		live, err := c.Do(ctx, c.B().Zcount().Key(key).Min(strconv.FormatInt(floorDiv(n, 1e6), 10)).Max("+inf").Build()).AsInt64()
		if err != nil {
			return r, fmt.Errorf("redisstore: peek: %w", err)
		}
		_, r = bucket.Concurrent(live, l)
	default:
		return r, fmt.Errorf("redisstore: peek: unknown algorithm %d", l.Algorithm)
	}
	r.Token, r.Wait = 0, 0
	if r.Allowed {
		r.Remaining++
		r.RetryAfter = 0
	}
	if l.Algorithm == bucket.TokenBucket || l.Algorithm == bucket.LeakyBucket {
		r.Reset = time.Duration(max(tat-n, 0))
	}
	return r, nil
}

// hmget reads integer fields of a hash; a missing field (or key) reads 0.
func (s *Store) hmget(ctx context.Context, key string, fields ...string) ([]int64, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	msgs, err := c.Do(ctx, c.B().Hmget().Key(key).Field(fields...).Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("redisstore: peek: %w", err)
	}
	out := make([]int64, len(fields))
	for i := range msgs {
		if i >= len(out) {
			break
		}
		v, err := msgs[i].AsInt64()
		if err != nil && !rueidis.IsRedisNil(err) {
			return nil, fmt.Errorf("redisstore: peek: field %s: %w", fields[i], err)
		}
		out[i] = v
	}
	return out, nil
}

// Reset deletes c's key, so that its next request finds it full. Give-backs of charges taken
// before it find no marker, or another generation, and give nothing; slots in flight at the
// reset give theirs back to nothing (the key may have up to Count more in flight until they
// end).
func (s *Store) Reset(ctx context.Context, _ time.Time, c bucket.Charge) error {
	cl, err := s.client()
	if err != nil {
		return fmt.Errorf("redisstore: reset %s: %w", c.Key, err)
	}
	if err := cl.Do(ctx, cl.B().Del().Key(s.key(&c)).Build()).Error(); err != nil {
		return fmt.Errorf("redisstore: reset %s: %w", c.Key, err)
	}
	return nil
}

func (s *Store) adminKeys() []string {
	return []string{s.prefix + "{admin}:exemptions", s.prefix + "{admin}:expiry"}
}

// PutExemption stores an exemption until its expiry, unless most live ones are stored.
func (s *Store) PutExemption(ctx context.Context, id string, data []byte, expires time.Time, most int) (bool, error) {
	if len(data) > MaxExemptionData {
		return false, fmt.Errorf("redisstore: exemption %s: %d bytes, at most %d", id, len(data), MaxExemptionData)
	}
	n, err := s.admin(ctx, s.adminKeys(), []string{"put", strconv.FormatInt(s.now().UnixMilli(), 10),
		id, string(data), strconv.FormatInt(expires.UnixMilli(), 10), strconv.Itoa(most)}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("redisstore: exemption %s: %w", id, err)
	}
	return n == 1, nil
}

// DeleteExemption removes an exemption; found is false when no live one has that id.
func (s *Store) DeleteExemption(ctx context.Context, id string) (bool, error) {
	n, err := s.admin(ctx, s.adminKeys(), []string{"del", strconv.FormatInt(s.now().UnixMilli(), 10), id}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("redisstore: delete exemption %s: %w", id, err)
	}
	return n == 1, nil
}

// Exemptions returns every live exemption's JSON.
func (s *Store) Exemptions(ctx context.Context) ([][]byte, error) {
	msgs, err := s.admin(ctx, s.adminKeys(), []string{"list", strconv.FormatInt(s.now().UnixMilli(), 10)}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("redisstore: exemptions: %w", err)
	}
	out := make([][]byte, 0, len(msgs))
	for i := range msgs {
		if v, err := msgs[i].ToString(); err == nil {
			out = append(out, []byte(v))
		}
	}
	return out, nil
}

// admin runs the exemptions' script.
func (s *Store) admin(ctx context.Context, keys, args []string) rueidis.RedisResult {
	c, err := s.client()
	if err != nil {
		return rueidis.NewErrorResult(err)
	}
	return adminScript.Exec(ctx, c, keys, args)
}
