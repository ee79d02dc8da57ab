package bucket

import (
	"sync"
	"testing"
)

// The gateway's store has no Gate: each place a goroutine blocks costs a nil check, nothing
// allocated.
func TestTurnsWithoutGateCostNothing(t *testing.T) {
	var turns Turns
	var wg sync.WaitGroup
	allocs := testing.AllocsPerRun(1000, func() {
		k := turns.Park()
		turns.Resume(k)
		turns.Wait(&wg)
	})
	if allocs != 0 {
		t.Errorf("Park, Resume and Wait without a Gate allocate %.1f times, want 0", allocs)
	}
	ran := false
	turns.GoWG(&wg, func() { ran = true })
	turns.Wait(&wg)
	if !ran {
		t.Error("GoWG without a Gate did not run its function")
	}
}

// recorder is a Gate that lets every goroutine go on at once, recording the tickets.
type recorder struct {
	mu              sync.Mutex
	next            uint64
	parked, resumed []uint64
}

func (r *recorder) Park() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.parked = append(r.parked, r.next)
	return r.next
}

func (r *recorder) Resume(k uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resumed = append(r.resumed, k)
}

// With a Gate, a goroutine that Go starts asks for its turn (its ticket taken by the goroutine
// that started it) before it runs; Wait parks around the WaitGroup.
func TestTurnsWithGateAskForTheirTurn(t *testing.T) {
	g := &recorder{}
	turns := Turns{G: g}
	var wg sync.WaitGroup
	seen := make(chan int, 1)
	turns.GoWG(&wg, func() {
		g.mu.Lock()
		seen <- len(g.resumed)
		g.mu.Unlock()
	})
	turns.Wait(&wg)
	if n := <-seen; n != 1 {
		t.Errorf("the goroutine ran after %d resumes, want 1 (its own)", n)
	}
	if len(g.parked) != 2 || len(g.resumed) != 2 || g.resumed[0] != 1 || g.resumed[1] != 2 {
		t.Errorf("parked %v, resumed %v; want tickets 1 (the goroutine) and 2 (the wait), each resumed", g.parked, g.resumed)
	}
}
