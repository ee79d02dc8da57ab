package redislocal

import (
	"bufio"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// ping sends PING to addr over a raw socket and returns the first line of the answer.
func ping(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		t.Fatalf("write: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return strings.TrimSpace(line)
}

func TestStartStop(t *testing.T) {
	for _, mode := range []Mode{Single, Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
			defer cancel()
			inst, err := Start(ctx, t.TempDir(), mode)
			if err != nil {
				_ = inst.Stop()
				t.Fatal(err)
			}
			want := map[Mode]int{Single: 1, Cluster: 3}[mode]
			if len(inst.URLs) != want {
				t.Fatalf("got URLs %v, want %d", inst.URLs, want)
			}
			for _, a := range inst.Addrs() {
				if got := ping(t, a); got != "+PONG" {
					t.Errorf("PING %s: got %q, want +PONG", a, got)
				}
			}
			addr := inst.Addrs()[0]
			if err := inst.Stop(); err != nil {
				t.Fatal(err)
			}
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("%s still answers after Stop", addr)
			}
		})
	}
}
