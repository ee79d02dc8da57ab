package dynamo

import "time"

// SetLiveness sets how long s's store may leave a call unanswered before it counts as down, and
// the clock that measures it, for tests that cannot wait a second of wall-clock time.
func SetLiveness(s *Store, grace time.Duration, now func() time.Time) {
	s.live.grace, s.live.now = grace, now
}

// SetLeaseShift makes every token-bucket renewal of s place its first unit d past its instant,
// whatever the store's wall-clock round trip, for tests on simulated time.
func SetLeaseShift(s *Store, d time.Duration) { s.ls.SetShift(d) }

// SetLeaseSlow makes every pool of s take rtt and dev as its store's round trip and its mean
// deviation, whatever it measures, and treat the store as slow (several renewals in flight,
// renewals placed ahead, edge drains): the slow-store paths on simulated time.
func SetLeaseSlow(s *Store, rtt, dev time.Duration) { s.ls.SetSlow(rtt, dev) }

// Settle waits until none of s's pools has a renewal in flight: a test that counts the store's
// writes, or needs a pool's units to stay as they are, must not race the background renewal a
// spent unit may have started (prefetch).
func Settle(s *Store) {
	for {
		done := s.ls.InFlight()
		if len(done) == 0 {
			return
		}
		for _, d := range done {
			<-d
		}
	}
}

// LeaseRenewals is the renewals of s's pools in flight now, as the pools count them: a test
// that watches their calls at a gated store waits until every one of them has reached it.
func LeaseRenewals(s *Store) int { return len(s.ls.InFlight()) }
