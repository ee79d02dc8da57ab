package redisstore

import (
	"testing"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/bucket"
)

// The gateway's store has no Gate: each place one of its goroutines blocks or starts costs a
// nil check and allocates nothing.
func TestNoGateCostsNothing(t *testing.T) {
	s := &Store{}
	if allocs := testing.AllocsPerRun(1000, func() { s.turns.Resume(s.turns.Park()) }); allocs != 0 {
		t.Errorf("park and resume without a Gate allocate %.1f times, want 0", allocs)
	}
	g := &countGate{}
	s.turns = bucket.Turns{G: g}
	s.turns.Resume(s.turns.Park())
	if g.parks != 1 || g.resumes != 1 {
		t.Errorf("with a Gate: %d parks, %d resumes; want one each", g.parks, g.resumes)
	}
}

type countGate struct{ parks, resumes int }

func (g *countGate) Park() uint64  { g.parks++; return uint64(g.parks) }
func (g *countGate) Resume(uint64) { g.resumes++ }
