// Package exactmutant holds the self-test's broken stores.
//
// It holds the mutants of `make check-exact`'s self-test: broken stores that
// the checker must catch, so that its "0 over-admits" proves something. Only the test gateway
// (internal/testkit/gateway) links it, through server.Hooks; the shipped binary never does
// (TestLayering).
//
// The test gateway reads the mutant to become from RATELIMIT_EXACT_MUTANT (unset: none, the
// gateway behaves as shipped):
//
//   - admit-everything: a store that admits every request and keeps no state;
//   - apply-each-give-back-twice: every give-back is applied one more time (a group rejected in
//     refund mode is given back again, and every Release is sent twice);
//   - re-send-a-lost-write-without-its-marker: a give-back whose answer is lost is sent again
//     without its marker (the same change, the marker's condition and attribute left out), so
//     that nothing tells the re-sent write from a new one;
//   - reset-leaves-slots: a console reset of a concurrency key empties its count and leaves
//     its slots, which later release into the emptied count;
//   - reset-reads-then-writes-unconditionally: a console reset of a concurrency key is
//     written without the condition the store put on it, removing what it read while other
//     replicas take slots;
//   - exemption-outlives-its-expiry: an exemption is stored with an expiry an hour past the
//     one it was given, so every replica keeps applying it.
//
// The fourth mutant of the self-test, a replica whose clock is 2 s ahead with clock correction
// off, is a configuration, not code (scripts/check/exact).
package exactmutant

// Env is the environment variable that names the mutant.
const Env = "RATELIMIT_EXACT_MUTANT"

// The mutants' names (RATELIMIT_EXACT_MUTANT values, and selftest.json's keys).
const (
	AdmitEverything       = "admit-everything"
	GiveBackTwice         = "apply-each-give-back-twice"
	ResendWithoutMarker   = "re-send-a-lost-write-without-its-marker"
	ClockAheadUncorrected = "clock-2s-ahead-uncorrected"

	ResetLeavesSlots        = "reset-leaves-slots"
	ResetUnconditional      = "reset-reads-then-writes-unconditionally"
	ExemptionOutlivesExpiry = "exemption-outlives-its-expiry"
)
