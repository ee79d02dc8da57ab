package main

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// redisStats are redis-server's counters that show pipelining: the commands it ran and the read
// events it processed (one read of a client's socket, whatever it held). Commands per read above
// one is several commands, so several decisions, in one read.
type redisStats struct {
	commands, reads, scripts float64
}

// readStats reads INFO stats and commandstats (the bench's own INFO is one command and one
// read: noise). commands counts what scripts call too; scripts counts EVALSHA and EVAL alone.
func readStats(ctx context.Context, c rueidis.Client) (redisStats, error) {
	var s redisStats
	for _, section := range []string{"stats", "commandstats"} {
		info, err := c.Do(ctx, c.B().Info().Section(section).Build()).ToString()
		if err != nil {
			return redisStats{}, err
		}
		for _, l := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
			if !ok {
				continue
			}
			switch k {
			case "total_commands_processed":
				s.commands, _ = strconv.ParseFloat(v, 64)
			case "total_reads_processed":
				s.reads, _ = strconv.ParseFloat(v, 64)
			case "cmdstat_evalsha", "cmdstat_eval":
				// calls=N,usec=...
				calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
				f, _ := strconv.ParseFloat(calls, 64)
				s.scripts += f
			}
		}
	}
	return s, nil
}

func (s redisStats) sub(o redisStats) redisStats {
	return redisStats{commands: s.commands - o.commands, reads: s.reads - o.reads, scripts: s.scripts - o.scripts}
}

// countingConn counts the writes the client makes on its connections: one write is one flush of
// whatever commands rueidis had queued, so decisions per write is how many decisions share a
// round trip, seen from the client's side.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// countWrites sets opt's dialer to one whose connections count their writes in n.
func countWrites(opt *rueidis.ClientOption, n *atomic.Int64) {
	opt.DialCtxFn = func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		var conn net.Conn
		var err error
		if cfg != nil {
			conn, err = (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", dst)
		} else {
			conn, err = d.DialContext(ctx, "tcp", dst)
		}
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: conn, writes: n}, nil
	}
}
