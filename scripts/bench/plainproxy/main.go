// Command plainproxy is configuration (b) of `make bench`: a plain httputil.ReverseProxy, tuned
// as a careful Go developer would tune it and no further, so it is the floor a Go gateway is
// measured against. Tuned means: a keep-alive pool sized for the benchmark's concurrency (the
// default Transport keeps 2 idle connections per host, so most requests would dial), HTTP/1.1 to
// the upstream, no proxy from the environment, and a pooled 32 KiB copy buffer. It rate-limits
// nothing. With -h2c it is the HTTP/2 rows' baseline instead: h2c accepted beside HTTP/1.1 and
// h2c (prior knowledge) to the upstream, as the gateway does with upstream_protocol: h2c.
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:18081", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:18000", "upstream base URL")
	conns := flag.Int("conns", 512, "idle keep-alive connections kept per upstream host")
	h2c := flag.Bool("h2c", false, "accept h2c and speak h2c to the upstream")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("upstream: %v", err)
	}
	protos := new(http.Protocols)
	if *h2c {
		protos.SetUnencryptedHTTP2(true)
	} else {
		protos.SetHTTP1(true)
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2 * *conns,
		MaxIdleConnsPerHost: *conns,
		IdleConnTimeout:     90 * time.Second,
		Protocols:           protos,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.SetXForwarded()
		},
		Transport:  tr,
		BufferPool: pool{},
	}
	srv := &http.Server{Addr: *addr, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	if *h2c {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	log.Fatal(srv.ListenAndServe())
}

const bufSize = 32 << 10

var bufs = sync.Pool{New: func() any { return new([bufSize]byte) }}

// pool implements httputil.BufferPool without allocating on Put.
type pool struct{}

func (pool) Get() []byte { return bufs.Get().(*[bufSize]byte)[:] }

func (pool) Put(b []byte) {
	if len(b) == bufSize {
		bufs.Put((*[bufSize]byte)(b))
	}
}
