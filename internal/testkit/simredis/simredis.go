// Package simredis is the simulator's Redis (internal/testkit/sim): an in-process Redis server
// (miniredis, which runs Lua scripts on gopher-lua) whose clock is the simulation's, reached by
// the simulated network's deliveries only. The store under test never talks to it directly: its
// client is the simulator's, which queues every command as a call the driver delivers, and the
// driver executes a delivered call here, synchronously, with the instant it lands at.
//
// The server listens on a loopback port and runs outside the simulator's testing/synctest
// bubble (its goroutines block on sockets, which the fake clock does not wait for); the driver
// alone calls it, from inside the bubble, while every other goroutine of the bubble is blocked.
// Its key expiries follow At: each call first moves the server's clock to the instant given.
//
// A differential test (diff_test.go) runs the Redis store's scripts with the same random
// sequences of charges, give-backs, resets and exemptions on a real redis-server and here, and
// compares every answer and every key.
package simredis

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// Server is one simulated Redis server.
type Server struct {
	m  *miniredis.Miniredis
	c  rueidis.Client
	at time.Time // the server's clock: expiries are counted down to it
}

// Start starts a server whose clock reads start.
func Start(start time.Time) (*Server, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("simredis: %w", err)
	}
	m.SetTime(start)
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{m.Addr()}, ForceSingleClient: true, DisableCache: true, DisableRetry: true,
	})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("simredis: client: %w", err)
	}
	// A first command starts the client's own goroutines here, outside any bubble of the
	// caller's (a bubble's goroutine blocked on a socket would never let its fake clock move).
	if err := c.Do(context.Background(), c.B().Ping().Build()).Error(); err != nil {
		c.Close()
		m.Close()
		return nil, fmt.Errorf("simredis: ping: %w", err)
	}
	return &Server{m: m, c: c, at: start}, nil
}

// Client is a client of the server, for tests that talk to it directly (not the simulator's
// replicas).
func (s *Server) Client() rueidis.Client { return s.c }

// Close stops the server.
func (s *Server) Close() {
	s.c.Close()
	s.m.Close()
}

// advance moves the server's clock to now (never back): keys whose time-to-live ends by then
// are gone.
func (s *Server) advance(now time.Time) {
	if d := now.Sub(s.at); d > 0 {
		s.m.FastForward(d)
		s.at = now
		s.m.SetTime(now)
	}
}

// Do runs cmds (each a command and its arguments) as one pipeline at instant now, and returns
// their answers. Nothing else runs on the server meanwhile.
func (s *Server) Do(now time.Time, cmds ...[]string) []rueidis.RedisResult {
	s.advance(now)
	built := make(rueidis.Commands, len(cmds))
	for i, c := range cmds {
		built[i] = s.c.B().Arbitrary(c...).Build()
	}
	return s.c.DoMulti(context.Background(), built...)
}

// Restart is a restart of a server without persistence: every key and every cached script is
// gone (a script is then answered NOSCRIPT, and sent again).
func (s *Server) Restart() {
	s.m.FlushAll()
	s.c.Do(context.Background(), s.c.B().ScriptFlush().Build())
}

// Hash returns the fields of the hash at key (none when it is missing or no hash), read in
// process, without a command: the simulator's invariants after each write.
func (s *Server) Hash(key string) map[string]string {
	fields, err := s.m.HKeys(key)
	if err != nil || len(fields) == 0 {
		return nil
	}
	out := make(map[string]string, len(fields))
	for _, f := range fields {
		out[f] = s.m.HGet(key, f)
	}
	return out
}

// Keys returns every key, sorted (the judge's and the differential test's view).
func (s *Server) Keys() []string { return s.m.Keys() }
