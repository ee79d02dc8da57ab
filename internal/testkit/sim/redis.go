package sim

import (
	"context"
	"crypto/sha1" //nolint:gosec // the digest Redis names scripts by, not a security measure
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/exactmutant"
)

// The Redis backend: replicas of the real Redis store (redisstore.Store) on one simulated Redis
// (package simredis: miniredis on the run's clock). Each replica's client is redisClient: every
// pipeline the store sends (a script, a renewal, a reset's DEL, a peek) is one call on the
// simulated network, delivered, lost or held by the driver as DynamoDB's calls are. What Redis
// has of DynamoDB's faults: a lost answer (the script ran, the client sees a broken
// connection), a lost request, a command that lands after its client gave up, a connection
// reset (every call in flight on it fails; some have run). What it has not: throttling and
// transaction conflicts (no such answers), re-sent copies (the client never retries: a copy of
// a script would charge twice; only a script Redis has forgotten is sent again, as EVAL, after
// NOSCRIPT). Its own fault: a restart without persistence, which loses every key and every
// script, and every connection's calls in flight.

const backendRedis backend = "redis"

// redisCmds are one pipeline's commands, each its arguments.
type redisCmds [][]string

// redisClient is replica r's Redis client (the part of rueidis.Client the store calls).
type redisClient struct {
	rueidis.Client // nil: what the store never calls panics
	w              *world
	rep            *replica
	inc            int
}

// B is the builder of the simulated server's own client (a single node's).
func (c *redisClient) B() rueidis.Builder { return c.w.rdb.Client().B() }

// Do sends one command.
func (c *redisClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return c.DoMulti(ctx, cmd)[0]
}

// DoMulti sends a pipeline as one call: it lands whole or not at all (what a connection reset
// between two of its commands could split is left out: the store pipelines only renewals,
// whose parts are independent).
func (c *redisClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	cmds := make(redisCmds, len(multi))
	for i := range multi {
		cmds[i] = slices.Clone(multi[i].Commands())
	}
	out := make([]rueidis.RedisResult, len(multi))
	if ans, ok := c.w.redisMutant(c.rep, cmds); ok {
		return ans
	}
	res, err := c.w.roundTrip(ctx, &call{rep: c.rep, inc: c.inc, op: "redis", in: cmds})
	if err == nil {
		if rs, ok := res.([]rueidis.RedisResult); ok && len(rs) == len(out) {
			return rs
		}
		err = fmt.Errorf("sim: redis: %T answer to %d commands", res, len(out))
	}
	for i := range out {
		out[i] = rueidis.NewErrorResult(err)
	}
	return out
}

// Close closes nothing: the server's connection is the simulator's.
func (c *redisClient) Close() {}

// redisErr is a broken connection as the client reports it.
func redisErr(err error) error { return fmt.Errorf("redis: %w", err) }

// broken is the error c's client sees when its connection breaks.
func (c *call) broken() error {
	if _, ok := c.in.(redisCmds); ok {
		return redisErr(errTransport)
	}
	return transportErr(c.op)
}

// roundTrip puts c on the network and waits for its answer or for ctx to end (the call stays,
// an orphan that may still land).
func (w *world) roundTrip(ctx context.Context, c *call) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, redisErr(err)
	}
	c.reply, c.sent = make(chan answer, 1), time.Now()
	c.desc = w.describe(c)
	c.pk = callKeys(c.in)
	if q, ok := ctx.Value(quietKey{}).(int); ok {
		c.quiet = q
	}
	if !w.enqueue(c) {
		return nil, redisErr(errTransport)
	}
	k := w.turns.Park()
	select {
	case r := <-c.reply:
		w.turns.Resume(k)
		return r.out, r.err
	case <-ctx.Done():
		w.turns.Resume(k)
		w.mu.Lock()
		c.orphan = true
		w.mu.Unlock()
		return nil, redisErr(ctx.Err())
	}
}

// scriptKeys returns an EVAL's or EVALSHA's keys and arguments (nil for other commands).
func scriptKeys(cmd []string) (keys, args []string, ok bool) {
	if len(cmd) < 3 || (cmd[0] != "EVALSHA" && cmd[0] != "EVAL") {
		return nil, nil, false
	}
	n, err := strconv.Atoi(cmd[2])
	if err != nil || 3+n > len(cmd) {
		return nil, nil, false
	}
	return cmd[3 : 3+n], cmd[3+n:], true
}

// cmdKeys lists the keys of a pipeline (the calls' first sort key).
func (cmds redisCmds) keys() []string {
	var out []string
	for _, cmd := range cmds {
		if ks, _, ok := scriptKeys(cmd); ok {
			out = append(out, ks...)
			continue
		}
		if len(cmd) > 1 && cmd[0] != "PING" {
			out = append(out, cmd[1])
		}
	}
	return out
}

// describeRedis is a pipeline's description: its commands, a script's source as its digest.
func describeRedis(cmds redisCmds) string {
	var b strings.Builder
	b.WriteString("redis")
	for _, cmd := range cmds {
		b.WriteString(" [")
		for i, a := range cmd {
			if i > 0 {
				b.WriteByte(' ')
			}
			if i == 1 && cmd[0] == "EVAL" {
				sum := sha1.Sum([]byte(a)) //nolint:gosec // a script's name
				a = "source:" + hex.EncodeToString(sum[:4])
			}
			b.WriteString(a)
		}
		b.WriteByte(']')
	}
	return mask(b.String())
}

// execRedis runs a delivered call on the simulated Redis at the call's landing instant, and
// checks the keys it wrote.
func (w *world) execRedis(c *call) (any, error) {
	cmds := c.in.(redisCmds)
	if w.cfg.Mutant == giveBackUnmarked {
		cmds = w.unmarkGiveBacks(cmds)
	}
	res := w.rdb.Do(time.Now(), cmds...)
	for _, k := range cmds.keys() {
		w.checkRedisKey(k)
	}
	return res, nil
}

// checkRedisKey is the invariant of a Redis key after a write: no negative count (a window's,
// a quota's, a sliding window's slot counters) and no negative instant. Unlike DynamoDB's, a
// give-back landing after a reset of its key finds another generation and gives nothing: no
// count goes below zero, ever.
func (w *world) checkRedisKey(key string) {
	if !strings.HasSuffix(key, ":f") && !strings.HasSuffix(key, ":s") && !strings.HasSuffix(key, ":b") {
		return
	}
	h := w.rdb.Hash(key)
	for f, v := range h {
		counter := f == "c" || f == "t" || (strings.HasSuffix(key, ":s") && f != "g" && f != "w" && f != "s")
		if counter && strings.HasPrefix(v, "-") {
			w.judge.violate("redis key %s: %s = %s is negative", mask(key), f, v)
		}
	}
}

// unmarkGiveBacks is the give-back-without-its-marker mutant on Redis: each give-back is sent
// with the marker (a bucket's) or generation (a window's) its key holds when it lands instead of
// its own charge's, so it gives back whatever wrote since (a reset, another replica's charge).
func (w *world) unmarkGiveBacks(cmds redisCmds) redisCmds {
	out := make(redisCmds, len(cmds))
	for i, cmd := range cmds {
		out[i] = cmd
		keys, args, ok := scriptKeys(cmd)
		if !ok || len(args) < 1 {
			continue
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || len(args) != 1+5*n || len(keys) != n {
			continue // not the give script
		}
		cmd = slices.Clone(cmd)
		base := len(cmd) - len(args)
		for e := range n {
			a := base + 1 + 5*e // the entry's algorithm
			h := w.rdb.Hash(keys[e])
			switch cmd[a] {
			case "1", "2":
				if m, ok := h["m"]; ok {
					cmd[a+3] = m
				}
			case "3", "6":
				if g, ok := h["g"]; ok {
					cmd[a+3] = g
				}
			case "4":
				if g, ok := h["g"]; ok {
					cmd[a+4] = g
				}
			}
		}
		out[i] = cmd
	}
	return out
}

// redisMutant answers the commands a client-side mutant never sends (a reset's DEL that
// reset-leaves-slots or reset-keeps-its-count drop), and rewrites the exemptions that
// exemption-outlives-its-expiry stores. ok: answered here.
func (w *world) redisMutant(r *replica, cmds redisCmds) ([]rueidis.RedisResult, bool) {
	switch w.cfg.Mutant {
	case exactmutant.ResetLeavesSlots, resetKeepsCount:
		if len(cmds) != 1 || len(cmds[0]) != 2 || cmds[0][0] != "DEL" {
			return nil, false
		}
		slots := strings.HasSuffix(cmds[0][1], ":c")
		if slots != (w.cfg.Mutant == exactmutant.ResetLeavesSlots) {
			return nil, false
		}
		w.record("mutant r%d: %s not sent", r.id, mask(strings.Join(cmds[0], " ")))
		return []rueidis.RedisResult{rueidis.NewResult(rueidis.RedisMessage{}, nil)}, true
	case exactmutant.ExemptionOutlivesExpiry:
		for i, cmd := range cmds {
			keys, args, ok := scriptKeys(cmd)
			if !ok || len(keys) != 2 || !strings.HasSuffix(keys[0], "{admin}:exemptions") || len(args) != 6 || args[0] != "put" {
				continue
			}
			data, ok := exactmutant.OutliveJSON(args[3])
			ms, err := strconv.ParseInt(args[4], 10, 64)
			if !ok || err != nil {
				continue
			}
			cmd = slices.Clone(cmd)
			base := len(cmd) - len(args)
			cmd[base+3], cmd[base+4] = data, strconv.FormatInt(ms+exactmutant.OutlivedBy.Milliseconds(), 10)
			cmds[i] = cmd
		}
	}
	return nil, false
}

// redisRestart is the simulated Redis restarting without persistence: every key and script is
// gone, every connection breaks (the calls in flight fail, none lands later).
func (w *world) redisRestart() {
	w.mu.Lock()
	var broken []*call
	kept := w.pending[:0]
	for _, c := range w.pending {
		if _, ok := c.in.(redisCmds); !ok {
			kept = append(kept, c)
			continue
		}
		if !c.orphan {
			broken = append(broken, c)
		}
	}
	w.pending = kept
	w.mu.Unlock()
	w.rdb.Restart()
	for _, c := range broken {
		c.reply <- answer{err: redisErr(errTransport)}
	}
	w.judge.redisRestarted(time.Now())
	w.record("redis restart: every key and script lost, %d calls broken", len(broken))
}

// resetConnection breaks replica r's connection: its calls in flight fail at once; each may
// have run before the reset, or lands later (a command the server had read), or never.
func (w *world) resetConnection(r *replica) {
	n := w.breakCalls(r, func(c *call) bool { _, ok := c.in.(redisCmds); return ok })
	w.record("connection reset r%d: %d calls broken", r.id, n)
}

// redisOutcome is a pipeline's answers for the history.
func redisOutcome(rs []rueidis.RedisResult) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(' ')
		}
		if err := r.Error(); err != nil {
			b.WriteString("err " + err.Error())
			continue
		}
		m, _ := r.ToMessage()
		writeMessage(&b, &m)
	}
	return mask(b.String())
}

// writeMessage writes a compact form of an answer: integers, strings, nil, arrays of them.
func writeMessage(b *strings.Builder, m *rueidis.RedisMessage) {
	if m.IsNil() {
		b.WriteString("nil")
		return
	}
	if v, err := m.AsInt64(); err == nil && m.IsInt64() {
		b.WriteString(strconv.FormatInt(v, 10))
		return
	}
	if arr, err := m.ToArray(); err == nil {
		b.WriteByte('[')
		for i := range arr {
			if i > 0 {
				b.WriteByte(' ')
			}
			writeMessage(b, &arr[i])
		}
		b.WriteByte(']')
		return
	}
	if s, err := m.ToString(); err == nil {
		b.WriteString(strconv.Quote(s))
		return
	}
	b.WriteString(m.String())
}
