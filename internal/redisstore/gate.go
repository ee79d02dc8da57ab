package redisstore

// Gate lets a test run the Store's goroutines one at a time, in an order of its choosing: the
// simulator (internal/testkit/sim) gives every replica's store the same Gate, so that a seed
// repeats its run byte for byte. It is the DynamoDB store's gate (internal/dynamo/schema.Gate),
// declared here so that this package imports no other store.
type Gate interface {
	// Park is called by a goroutine just before it blocks (on a channel, a timer, a
	// WaitGroup, or before a goroutine it starts runs) and returns a ticket.
	Park() uint64
	// Resume is called with Park's ticket as soon as the goroutine wakes; it returns when the
	// goroutine may go on.
	Resume(ticket uint64)
}

// park takes a ticket before blocking (0 without a Gate).
func (s *Store) park() uint64 {
	if s.gate == nil {
		return 0
	}
	return s.gate.Park()
}

// resume waits for the ticket's turn (at once without a Gate).
func (s *Store) resume(ticket uint64) {
	if s.gate != nil {
		s.gate.Resume(ticket)
	}
}
