package main

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/faultnet"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/redislocal"
)

// The faults of the Redis run, on the TCP relay in front of redis-server (internal/testkit/
// faultnet): a connection reset before the command is forwarded (it never runs), an answer lost
// after the command ran (the write landed, the replica hears nothing), and a delay of every
// command. A duplicated write has no counterpart here: a copy of a command on one connection
// would shift every later answer by one, which RESP cannot survive (the client would resync
// by closing the connection); the client never re-sends a script. The kill is redis-server's
// own: SIGKILL, then a restart with nothing of its counts.
const (
	redisFaultReset ddbrelay.FaultKind = "redis_reset"
	redisFaultLost  ddbrelay.FaultKind = "redis_lost_answer"
	redisFaultDelay ddbrelay.FaultKind = "redis_delay"
)

var redisFaultKinds = []ddbrelay.FaultKind{redisFaultReset, redisFaultLost, redisFaultDelay}

// redisSlice is how long one choice of fault holds on a relay: every command that arrives within
// it meets that fault.
const redisSlice = 20 * time.Millisecond

// redisFaults is one redis-server and the fault relays the replicas reach it through, one each.
type redisFaults struct {
	inst    *redislocal.Instance
	proxies []*faultnet.Proxy
	urls    []string
	stop    chan struct{}
	done    sync.WaitGroup

	mu     sync.Mutex
	counts map[ddbrelay.FaultKind]int64
}

// startRedisFaults starts redis-server in dir and a relay per replica, and switches faults on them
// until close: in each slice, with probability 10 x o.faultRate (at most 1/2) one of the kinds.
func startRedisFaults(ctx context.Context, o options, seed uint64, dir string, replicas int) (*redisFaults, error) {
	sctx, cancel := context.WithTimeout(ctx, redislocal.StartTimeout)
	defer cancel()
	inst, err := redislocal.Start(sctx, dir, redislocal.Single)
	if err != nil {
		_ = inst.Stop()
		return nil, fmt.Errorf("redis: %w", err)
	}
	rf := &redisFaults{inst: inst, stop: make(chan struct{}), counts: map[ddbrelay.FaultKind]int64{}}
	for range replicas {
		p, err := faultnet.New(inst.Addrs()[0])
		if err != nil {
			rf.close()
			return nil, err
		}
		rf.proxies = append(rf.proxies, p)
		rf.urls = append(rf.urls, "redis://"+p.Addr())
	}
	rate := min(10*o.faultRate, 0.5)
	rng := mrand.New(mrand.NewPCG(seed, 7))
	rf.done.Add(1)
	go func() {
		defer rf.done.Done()
		t := time.NewTicker(redisSlice)
		defer t.Stop()
		for {
			select {
			case <-rf.stop:
				return
			case <-t.C:
			}
			for _, p := range rf.proxies {
				f, kind := faultnet.Fault{}, ddbrelay.FaultKind("")
				if rng.Float64() < rate {
					switch rng.IntN(3) {
					case 0:
						f, kind = faultnet.Fault{Mode: faultnet.Reset}, redisFaultReset
					case 1:
						f, kind = faultnet.Fault{Mode: faultnet.ResetAfter, After: 0}, redisFaultLost
					default:
						f, kind = faultnet.Fault{Delay: o.faultDelay}, redisFaultDelay
					}
					rf.mu.Lock()
					rf.counts[kind]++
					rf.mu.Unlock()
				}
				p.Set(f)
			}
		}
	}()
	return rf, nil
}

// restart kills redis-server (SIGKILL) and starts it again, empty, on its port.
func (rf *redisFaults) restart(ctx context.Context) error {
	if err := rf.inst.Kill("node0"); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return rf.inst.Restart(rctx, "node0")
}

// stats are the faults injected, by kind (slices of a relay that held one).
func (rf *redisFaults) stats() map[ddbrelay.FaultKind]int64 {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	out := make(map[ddbrelay.FaultKind]int64, len(rf.counts))
	for k, n := range rf.counts {
		out[k] = n
	}
	return out
}

func (rf *redisFaults) close() {
	select {
	case <-rf.stop:
	default:
		close(rf.stop)
	}
	rf.done.Wait()
	for _, p := range rf.proxies {
		_ = p.Close()
	}
	_ = rf.inst.Stop()
}
