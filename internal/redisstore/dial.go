package redisstore

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/rueidis"
)

// The deployment modes of store.redis.mode.
const (
	ModeSingle   = "single"
	ModeSentinel = "sentinel"
	ModeCluster  = "cluster"
)

// DialOptions are the store.redis block, resolved (the password read from its variable).
type DialOptions struct {
	// URL is redis://[user:password@]host:port[/db], or rediss:// for TLS. With mode cluster or
	// sentinel it supplies the credentials, the database and TLS, and is the seed when Addrs is
	// empty.
	URL string
	// Mode is single, sentinel or cluster.
	Mode string
	// Addrs are the cluster's seed nodes or the Sentinels (host:port).
	Addrs []string
	// SentinelMaster is the name the Sentinels monitor (mode sentinel).
	SentinelMaster string
	// Username and Password override the URL's when not empty.
	Username, Password string
	// DialTimeout bounds opening one connection (0: 1s).
	DialTimeout time.Duration
}

// ClientOption turns the options into rueidis's. Retries are off (a script sent twice would
// charge twice), and so is client-side caching (no key is read twice the same way).
func ClientOption(o DialOptions) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	if o.URL != "" {
		var err error
		opt, err = rueidis.ParseURL(o.URL)
		if err != nil {
			return opt, fmt.Errorf("store.redis.url: %w", err)
		}
	}
	switch o.Mode {
	case "", ModeSingle:
		if o.URL == "" {
			return opt, errors.New("store.redis.url: required with mode single")
		}
		opt.ForceSingleClient = true
	case ModeCluster:
		if len(o.Addrs) > 0 {
			opt.InitAddress = append([]string(nil), o.Addrs...)
		}
		if len(opt.InitAddress) == 0 {
			return opt, errors.New("store.redis.addrs: a cluster needs seed addresses (or store.redis.url)")
		}
		opt.ShuffleInit = true
	case ModeSentinel:
		if len(o.Addrs) == 0 || o.SentinelMaster == "" {
			return opt, errors.New("store.redis: mode sentinel needs addrs (the Sentinels) and sentinel_master")
		}
		opt.InitAddress = append([]string(nil), o.Addrs...)
		opt.Sentinel.MasterSet = o.SentinelMaster
		opt.Sentinel.TLSConfig = opt.TLSConfig
		opt.Sentinel.TopologyRefreshInterval = 5 * time.Second
	default:
		return opt, fmt.Errorf("store.redis.mode %q: must be single, sentinel or cluster", o.Mode)
	}
	if o.Username != "" {
		opt.Username = o.Username
	}
	if o.Password != "" {
		opt.Password = o.Password
	}
	opt.DisableRetry = true
	opt.DisableCache = true
	opt.Dialer = net.Dialer{Timeout: o.DialTimeout, KeepAlive: time.Second}
	if opt.Dialer.Timeout <= 0 {
		opt.Dialer.Timeout = time.Second
	}
	// A connection that stops answering is closed (and its commands fail) within this, so a
	// dead primary is noticed even while requests keep the connection busy.
	opt.ConnWriteTimeout = 2 * time.Second
	return opt, nil
}

// Dial returns a function that connects per the options: the Store calls it until it succeeds,
// so a gateway starts while Redis is out.
func Dial(o DialOptions) (func() (rueidis.Client, error), error) {
	opt, err := ClientOption(o)
	if err != nil {
		return nil, err
	}
	return func() (rueidis.Client, error) { return rueidis.NewClient(opt) }, nil
}
