package server

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// connTracker counts proxy connections that close without a single request reaching the
// handler: clients cut off by server.read_header_timeout (slowloris), header blocks over
// server.max_header_bytes (answered 431 by net/http), malformed requests, and connections
// opened and dropped. net/http answers these itself, so without this they would be invisible.
// ConnState alone cannot tell them apart (a connection turns Active as soon as one byte is
// read), so the handler marks its connection as served through the connection's context.
type connTracker struct {
	conns    sync.Map // net.Conn -> *atomic.Bool (served)
	open     prometheus.Gauge
	unserved prometheus.Counter
}

type servedKey struct{}

func newConnTracker(reg prometheus.Registerer) (*connTracker, error) {
	t := &connTracker{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_proxy_connections",
			Help: "Client connections open on the proxy listener.",
		}),
		unserved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_proxy_connections_unserved_total",
			Help: "Client connections closed before any request reached the gateway (header timeouts, oversized or malformed headers, dropped connections).",
		}),
	}
	for _, c := range []prometheus.Collector{t.open, t.unserved} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// connContext is the http.Server's ConnContext hook.
func (t *connTracker) connContext(ctx context.Context, c net.Conn) context.Context {
	served := new(atomic.Bool)
	t.conns.Store(c, served)
	return context.WithValue(ctx, servedKey{}, served)
}

// connState is the http.Server's ConnState hook.
func (t *connTracker) connState(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		t.open.Inc()
	case http.StateClosed, http.StateHijacked:
		t.open.Dec()
		if v, ok := t.conns.LoadAndDelete(c); ok && s == http.StateClosed && !v.(*atomic.Bool).Load() {
			t.unserved.Inc()
		}
	}
}

// wrap marks the request's connection as served before handing the request on.
func (t *connTracker) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served, ok := r.Context().Value(servedKey{}).(*atomic.Bool); ok && !served.Load() {
			served.Store(true)
		}
		next.ServeHTTP(w, r)
	})
}
