package exactcheck

import "math"

// segTree holds values over leaves 0..n-1 with range add and range maximum (and where it is).
type segTree struct {
	n    int
	mx   []float64
	at   []int
	lazy []float64
}

func newSegTree(base []float64) *segTree {
	n := len(base)
	t := &segTree{n: n, mx: make([]float64, 4*n), at: make([]int, 4*n), lazy: make([]float64, 4*n)}
	if n > 0 {
		t.build(1, 0, n, base)
	}
	return t
}

func (t *segTree) build(node, lo, hi int, base []float64) {
	if hi-lo == 1 {
		t.mx[node], t.at[node] = base[lo], lo
		return
	}
	mid := (lo + hi) / 2
	t.build(2*node, lo, mid, base)
	t.build(2*node+1, mid, hi, base)
	t.pull(node)
}

func (t *segTree) pull(node int) {
	l, r := 2*node, 2*node+1
	if t.mx[l] >= t.mx[r] {
		t.mx[node], t.at[node] = t.mx[l]+t.lazy[node], t.at[l]
	} else {
		t.mx[node], t.at[node] = t.mx[r]+t.lazy[node], t.at[r]
	}
}

// add adds v to leaves [from, to).
func (t *segTree) add(from, to int, v float64) {
	if from < to {
		t.addRec(1, 0, t.n, from, to, v)
	}
}

func (t *segTree) addRec(node, lo, hi, from, to int, v float64) {
	if to <= lo || hi <= from {
		return
	}
	if from <= lo && hi <= to {
		t.mx[node] += v
		t.lazy[node] += v
		return
	}
	mid := (lo + hi) / 2
	t.addRec(2*node, lo, mid, from, to, v)
	t.addRec(2*node+1, mid, hi, from, to, v)
	t.pull(node)
}

// max returns the maximum over leaves [from, to) and its leaf, or -1 when the range is empty.
func (t *segTree) max(from, to int) (float64, int) {
	if from >= to {
		return math.Inf(-1), -1
	}
	return t.maxRec(1, 0, t.n, from, to)
}

func (t *segTree) maxRec(node, lo, hi, from, to int) (float64, int) {
	if to <= lo || hi <= from {
		return math.Inf(-1), -1
	}
	if from <= lo && hi <= to {
		return t.mx[node], t.at[node]
	}
	mid := (lo + hi) / 2
	a, ai := t.maxRec(2*node, lo, mid, from, to)
	b, bi := t.maxRec(2*node+1, mid, hi, from, to)
	if bi >= 0 && (ai < 0 || b > a) {
		a, ai = b, bi
	}
	return a + t.lazy[node], ai
}
