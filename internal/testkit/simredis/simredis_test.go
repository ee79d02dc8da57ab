package simredis_test

import (
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/simredis"
)

// A key's time to live runs on the instants Do is given, not on the wall clock; a restart loses
// every key and every cached script.
func TestServerClockAndRestart(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	s, err := simredis.Start(start)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const script = "return redis.call('GET', KEYS[1])"
	res := s.Do(start, []string{"SET", "k", "v", "PX", "1000"}, []string{"SCRIPT", "LOAD", script})
	sha, err := res[1].ToString()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Do(start.Add(999*time.Millisecond), []string{"EVALSHA", sha, "1", "k"})[0].ToString(); err != nil || v != "v" {
		t.Errorf("999 ms after a PX 1000 set: %q, %v; want the value", v, err)
	}
	if err := s.Do(start.Add(time.Second), []string{"GET", "k"})[0].Error(); !rueidis.IsRedisNil(err) {
		t.Errorf("1 s after a PX 1000 set: %v; want the key gone", err)
	}
	s.Do(start.Add(time.Second), []string{"SET", "k2", "v"})
	s.Restart()
	if keys := s.Keys(); len(keys) != 0 {
		t.Errorf("after a restart: keys %v, want none", keys)
	}
	err = s.Do(start.Add(time.Second), []string{"EVALSHA", sha, "1", "k"})[0].Error()
	if e, ok := rueidis.IsRedisErr(err); !ok || !e.IsNoScript() {
		t.Errorf("a script after a restart: %v; want NOSCRIPT", err)
	}
}
