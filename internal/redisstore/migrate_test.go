package redisstore_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/redislocal"
)

// cli runs redis-cli against one node and returns its trimmed output.
func cli(t *testing.T, addr string, args ...string) string {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %s %v: %v\n%s", addr, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestSlotMigrationUnderLoad moves the hash slot of a key being charged from one primary to
// another (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) while 6 goroutines charge it: the client
// follows ASK during the move and MOVED after it, every decision is answered, and exactly the
// limit is admitted, with no retry of the caller's.
func TestSlotMigrationUnderLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), redislocal.StartTimeout)
	defer cancel()
	inst, err := redislocal.Start(ctx, t.TempDir(), redislocal.Cluster)
	t.Cleanup(func() { _ = inst.Stop() })
	if err != nil {
		t.Fatal(err)
	}
	o := redisstore.DialOptions{Mode: redisstore.ModeCluster, Addrs: inst.Addrs()}
	opt, err := redisstore.ClientOption(o)
	if err != nil {
		t.Fatal(err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatal(err)
	}
	s := redisstore.New(client, redisstore.Options{Cluster: true})
	defer s.Close()

	k := buckettest.NewKey(t)
	slot := redisstore.Slot(k.String())
	// Which node serves the slot, and which will.
	var src, dst string
	for _, a := range inst.Addrs() {
		nodes := cli(t, a, "CLUSTER", "NODES")
		for _, l := range strings.Split(nodes, "\n") {
			if strings.Contains(l, "myself") && servesSlot(l, slot) {
				src = a
			}
		}
	}
	for _, a := range inst.Addrs() {
		if a != src {
			dst = a
			break
		}
	}
	if src == "" {
		t.Fatal("no node serves the slot")
	}
	srcID, dstID := cli(t, src, "CLUSTER", "MYID"), cli(t, dst, "CLUSTER", "MYID")

	const limit = 200
	c := []bucket.Charge{{Key: k, Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Count: limit, Window: time.Hour}}}
	now := time.Now().Truncate(time.Hour).Add(time.Minute)
	var (
		next, admitted, refused, failed atomic.Int64
		wg                              sync.WaitGroup
		firstErr                        atomic.Value
		phase                           atomic.Int32    // 0 before the move, 1 during, 2 after
		byPhase                         [3]atomic.Int64 // decisions answered in each phase
	)
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		for next.Load() < 75 {
			time.Sleep(time.Millisecond) // waiting for the load to be under way, bounded by it
		}
		phase.Store(1)
		cli(t, dst, "CLUSTER", "SETSLOT", fmt.Sprint(slot), "IMPORTING", srcID)
		cli(t, src, "CLUSTER", "SETSLOT", fmt.Sprint(slot), "MIGRATING", dstID)
		keys := strings.Fields(cli(t, src, "CLUSTER", "GETKEYSINSLOT", fmt.Sprint(slot), "100"))
		host, port, _ := strings.Cut(dst, ":")
		if len(keys) > 0 {
			cli(t, src, append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, keys...)...)
		}
		for _, a := range inst.Addrs() {
			cli(t, a, "CLUSTER", "SETSLOT", fmt.Sprint(slot), "NODE", dstID)
		}
		phase.Store(2)
	}()
	for range 6 {
		wg.Go(func() {
			r := make([]bucket.Result, 1)
			// Until 60 decisions were answered after the move and 50 refused (or a cap): the load spans
			// the move and reaches the limit whatever the machine's speed.
			for next.Add(1) <= 5000 && (byPhase[2].Load() < 60 || refused.Load() < 50) {
				// No retry here: the client itself answers ASK, MOVED and TRYAGAIN.
				dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				ok, err := s.Take(dctx, now, c, r)
				cancel()
				if err == nil {
					byPhase[phase.Load()].Add(1)
				}
				switch {
				case err != nil:
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				case ok:
					admitted.Add(1)
				default:
					refused.Add(1)
				}
				time.Sleep(5 * time.Millisecond) // spreading the load over the move
			}
		})
	}
	wg.Wait()
	<-moved
	answered := admitted.Load() + refused.Load()
	t.Logf("slot %d moved %s -> %s under load: %d answered of %d (%d admitted, %d refused), %d failed (%v)",
		slot, src, dst, answered, answered+failed.Load(), admitted.Load(), refused.Load(), failed.Load(), firstErr.Load())
	if failed.Load() != 0 || admitted.Load() != limit {
		t.Errorf("got %d admitted, %d refused, %d failed; want exactly %d admitted and none failed", admitted.Load(), refused.Load(), failed.Load(), limit)
	}
	t.Logf("answered before the move %d, during it %d, after it %d", byPhase[0].Load(), byPhase[1].Load(), byPhase[2].Load())
	if byPhase[2].Load() == 0 {
		t.Errorf("no decision after the move: the load ended before it, and nothing followed MOVED")
	}
	if got := cli(t, dst, "CLUSTER", "COUNTKEYSINSLOT", fmt.Sprint(slot)); got != "1" {
		t.Errorf("the slot's keys on the new node: %s, want 1", got)
	}
}

// servesSlot reports whether a CLUSTER NODES line's slot ranges hold slot.
func servesSlot(line string, slot uint16) bool {
	f := strings.Fields(line)
	for _, r := range f[min(8, len(f)):] {
		lo, hi, found := strings.Cut(r, "-")
		if !found {
			hi = lo
		}
		var a, b int
		if _, err := fmt.Sscan(lo, &a); err != nil {
			continue
		}
		if _, err := fmt.Sscan(hi, &b); err != nil {
			continue
		}
		if int(slot) >= a && int(slot) <= b {
			return true
		}
	}
	return false
}
