//go:build race

package sim

// Under the race detector (make test) the runs are about ten times slower: a shorter budget.
func init() { raceBudget = true }
