package configyaml

import "strings"

// Suggest returns the name of known that word most resembles, as a "did you mean": the one
// fewest single-letter edits away (insertions, deletions, substitutions, swaps of neighbours),
// when that is at most 2 and less than half the word. "" when none is that close.
func Suggest(word string, known []string) string {
	w := strings.ToLower(word)
	best, bestD := "", 3
	for _, k := range known {
		if d := distance(w, strings.ToLower(k)); d < bestD && 2*d < len(w)+1 {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the optimal string alignment distance of a and b (bytes).
func distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30 // no name is that long; never worth the quadratic work
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
