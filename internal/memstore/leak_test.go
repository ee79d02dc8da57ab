package memstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when any goroutine outlives them: a leak of a handler,
// a timer or a connection shows up here even when every test passes on its own.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
