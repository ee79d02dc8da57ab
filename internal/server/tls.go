package server

import (
	"crypto/tls"
	"errors"
	"sync/atomic"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// tlsConfigs hands every TLS handshake on the proxy listener the configuration of the policy set
// in force, so that a certificate rotated on disk (which the reloader picks up with the files the
// config references) is served to new connections without a restart, and a broken one (which
// fails the reload) never replaces the running one. Connections already open keep theirs.
type tlsConfigs struct {
	material func() *policy.TLSMaterial
	last     atomic.Pointer[builtTLS] // the config built for the last material seen
}

type builtTLS struct {
	m   *policy.TLSMaterial
	cfg *tls.Config
}

// serverTLS is the listener's base configuration: every handshake is answered by
// GetConfigForClient with the current material.
func (t *tlsConfigs) serverTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: t.forClient}
}

func (t *tlsConfigs) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	m := t.material()
	if m == nil {
		// Only when the running set has no tls block, which a restart-only change prevents.
		return nil, errors.New("no TLS certificate loaded")
	}
	if b := t.last.Load(); b != nil && b.m == m {
		return b.cfg, nil
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{m.Certificate},
		// h2 first: clients that speak both (gRPC's, browsers) get HTTP/2.
		NextProtos: []string{"h2", "http/1.1"},
	}
	if m.ClientCAs != nil {
		cfg.ClientCAs = m.ClientCAs
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	t.last.Store(&builtTLS{m: m, cfg: cfg})
	return cfg, nil
}
