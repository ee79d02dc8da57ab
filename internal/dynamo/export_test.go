package dynamo

import "time"

// SetLiveness sets how long s's store may leave a call unanswered before it counts as down, and
// the clock that measures it, for tests that cannot wait a second of wall-clock time.
func SetLiveness(s *Store, grace time.Duration, now func() time.Time) {
	s.live.grace, s.live.now = grace, now
}
