package proxy

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// storeErrLogEvery is how often a store that keeps failing is logged again.
const storeErrLogEvery = time.Minute

// storeErrLog lets the first store error through, then at most one a minute, with how many it
// left out since: a store that stays out (a missing table, an unreachable Redis) fails every
// request, and a line for each would bury everything else. The metrics count every one.
type storeErrLog struct {
	next    atomic.Int64 // Unix ns from which the next line may be written
	leftOut atomic.Int64 // errors not logged since the last line
}

// allow reports whether an error at now is logged, and how many were left out before it.
func (l *storeErrLog) allow(now time.Time) (bool, int64) {
	n := now.UnixNano()
	next := l.next.Load()
	if n < next || !l.next.CompareAndSwap(next, n+int64(storeErrLogEvery)) {
		l.leftOut.Add(1)
		return false, 0
	}
	return true, l.leftOut.Swap(0)
}

// logStoreError writes the "rate-limit store error" line, when storeErrLog allows it.
func (h *Handler) logStoreError(fields ...zap.Field) {
	ok, left := h.storeLog.allow(h.now())
	if !ok {
		return
	}
	if ce := h.log.Check(zap.WarnLevel, "rate-limit store error"); ce != nil {
		ce.Write(append(fields, zap.Int64("left_out", left))...)
	}
}
