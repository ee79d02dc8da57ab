package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/clockref"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/policy"
)

// storeClock is the DynamoDB store's view of time: the Monitor that measures this host's clock
// against the Date header of DynamoDB's answers (fed by the client's Dates hook) and the clock
// decisions use.
type storeClock struct {
	est     *clockref.Estimator
	monitor *clockref.Monitor
	// decide is the clock decisions use: the corrected one with store.dynamodb.clock.correct,
	// else local (nil: time.Now).
	decide func() time.Time
	local  func() time.Time // the host's clock (Options.Now); never nil
	stop   func()           // stops Run and waits for it; set by start
}

// newStoreClock builds the clock of store.dynamodb.clock on the host's clock local (nil:
// time.Now). Its Monitor does not run until start.
func newStoreClock(c policy.ClockConfig, local func() time.Time, log *zap.Logger, reg prometheus.Registerer) (*storeClock, error) {
	sc := &storeClock{est: clockref.New(clockref.Options{}), local: local, decide: local}
	if sc.local == nil {
		sc.local = time.Now
	}
	m, err := clockref.NewMonitor(clockref.MonitorOptions{
		Estimator: sc.est, Now: sc.local,
		Correct: c.Correct, MaxCorrection: c.MaxCorrection, WarnOffset: c.WarnOffset, MaxOffset: c.MaxOffset,
		Log: log.Named("clock"), Registerer: reg, Subject: "DynamoDB",
	})
	if err != nil {
		return nil, err
	}
	sc.monitor = m
	if c.Correct {
		sc.decide = m.Now
	}
	sc.stop = func() {}
	return sc, nil
}

// start brings the Monitor up to date with what the exchanges so far say (the store's warm-up
// reads), so that the first decisions are corrected, then runs it with probe as its own
// exchange until stop.
func (sc *storeClock) start(probe func(context.Context) error) {
	sc.monitor.Update(sc.local())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc.monitor.Run(ctx, probe)
	}()
	sc.stop = func() { cancel(); <-done } // idempotent
}
