package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/rueidis"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket/buckettest"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/redisstore"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/redislocal"
)

var (
	single  = redislocal.Lazy{Mode: redislocal.Single}
	cluster = redislocal.Lazy{Mode: redislocal.Cluster}
)

func TestMain(m *testing.M) {
	code := m.Run()
	single.Stop()
	cluster.Stop()
	os.Exit(code)
}

// newClient connects to the nodes of l; the test fails (never skips) when they cannot start.
func newClient(t testing.TB, l *redislocal.Lazy) (rueidis.Client, *redislocal.Instance) {
	t.Helper()
	inst, err := l.Get()
	if err != nil {
		t.Fatalf("redis: %v", err)
	}
	o := redisstore.DialOptions{URL: inst.URLs[0], Mode: redisstore.ModeSingle}
	if l.Mode == redislocal.Cluster {
		o = redisstore.DialOptions{Mode: redisstore.ModeCluster, Addrs: inst.Addrs()}
	}
	opt, err := redisstore.ClientOption(o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("redis client: %v", err)
	}
	return c, inst
}

// newStore returns a Store on the nodes of l with a prefix of its own, closed at the test's end.
func newStore(t testing.TB, l *redislocal.Lazy) *redisstore.Store {
	t.Helper()
	c, _ := newClient(t, l)
	s := redisstore.New(c, redisstore.Options{
		KeyPrefix: fmt.Sprintf("t%d:", buckettest.NewKey(t)[0]),
		Cluster:   l.Mode == redislocal.Cluster,
	})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	for _, l := range []*redislocal.Lazy{&single, &cluster} {
		t.Run(string(l.Mode), func(t *testing.T) {
			buckettest.Run(t, func(t *testing.T) bucket.Store { return newStore(t, l) })
			buckettest.RunRelease(t, func(t *testing.T) bucket.Releaser { return newStore(t, l) })
		})
	}
}

func TestGiveBackAdversary(t *testing.T) {
	buckettest.RunGiveBack(t, func(t *testing.T) bucket.Releaser { return newStore(t, &single) },
		buckettest.GiveBackOptions{Histories: 300})
}

func TestPing(t *testing.T) {
	s := newStore(t, &single)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
}
