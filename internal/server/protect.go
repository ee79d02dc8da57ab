package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/protect"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/proxy"
)

// newProtection builds the upstream protection of the protect block, with its metrics on reg;
// nil without a block. The block is read at start only (restartOnly lists it): a reload must
// not reset an adaptive limit that has learnt the upstream.
func newProtection(p *policy.ProtectConfig, reg prometheus.Registerer) (*proxy.Protection, error) {
	if p == nil {
		return nil, nil
	}
	m, err := protect.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	l, c, err := protect.FromConfig(p, nil, m)
	if err != nil {
		return nil, err
	}
	return &proxy.Protection{Slots: l, Classify: c.Classify, Status: p.Status,
		MaxBufferedBody: p.MaxBufferedBody, StreamShare: p.StreamShare}, nil
}
