package dynamo

import "time"

// SetLiveness sets how long s's store may leave a call unanswered before it counts as down, and
// the clock that measures it, for tests that cannot wait a second of wall-clock time.
func SetLiveness(s *Store, grace time.Duration, now func() time.Time) {
	s.live.grace, s.live.now = grace, now
}

// SetLeaseShift makes every token-bucket renewal of s place its first unit d past its instant,
// whatever the store's wall-clock round trip, for tests on simulated time.
func SetLeaseShift(s *Store, d time.Duration) { s.ls.forceShift, s.ls.forced = int64(d), true }
