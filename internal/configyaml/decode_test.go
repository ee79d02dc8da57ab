package configyaml

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

type inner struct {
	N int64 `yaml:"n"`
}

type block struct {
	D time.Duration `yaml:"d"`
	S string        `yaml:"s"`
}

func (b *block) SetDefaults() { b.S = "default" }

type doc struct {
	Name   string            `yaml:"name"`
	Rate   float64           `yaml:"rate"`
	On     bool              `yaml:"on"`
	Inner  inner             `yaml:"inner"`
	Block  *block            `yaml:"block"`
	List   []block           `yaml:"list"`
	Words  []string          `yaml:"words"`
	Labels map[string]string `yaml:"labels"`
}

func texts(ps []Problem) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "%d:%d %s %q %s\n", p.Line, p.Col, p.Path, p.Value, p.Msg)
	}
	return b.String()
}

func TestDecodeReportsEveryProblemWithItsPlace(t *testing.T) {
	src := "nam: x\ninner: {n: 2.5}\nblock: {d: soon, s: ok}\nlist:\n  - {d: 1s}\n  - {dd: 1s}\non: yes\nrate: fast\nname: a\nname: b\nwords: w\n"
	var d doc
	_, ps, err := Decode([]byte(src), &d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `1:1 nam "" unknown field (did you mean "name"?)
2:12 inner.n "2.5" must be an integer
3:12 block.d "soon" must be a duration such as 500ms, 1m or 2h
6:6 list[1].dd "" unknown field (did you mean "d"?)
7:5 on "yes" must be true or false
8:7 rate "fast" must be a number
10:1 name "" written twice (first on line 9)
11:8 words "w" must be a list
`
	if got := texts(ps); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Entries and blocks the file creates start from their defaults; what decoded is kept.
	if d.Block == nil || d.Block.S != "ok" || d.List[0].S != "default" || d.List[0].D != time.Second || d.Name != "a" {
		t.Errorf("got %+v", d)
	}
}

func TestDecodeKeepsWhatTheFileLeavesOut(t *testing.T) {
	d := doc{Name: "kept", Rate: 1.5}
	got, ps, err := Decode([]byte("on: true\nlabels: {A: b}\nblock:\n"), &d, Options{})
	if err != nil || len(ps) != 0 {
		t.Fatalf("got %v %v", err, ps)
	}
	if d.Name != "kept" || d.Rate != 1.5 || !d.On || d.Labels["A"] != "b" || d.Block != nil {
		t.Errorf("got %+v: a null block must stay unset", d)
	}
	if !got.Has("on") || got.Has("name") || got.Has("block") {
		t.Errorf("Has: on %v name %v block %v, want true false false", got.Has("on"), got.Has("name"), got.Has("block"))
	}
	if p := got.Pos("labels.A.x"); p != (Pos{2, 13}) {
		t.Errorf("Pos of an unwritten field: got %v, want its nearest ancestor's 2:13", p)
	}
}

func TestDecodeFoldCase(t *testing.T) {
	var d doc
	if _, ps, _ := Decode([]byte("Name: a\n"), &d, Options{FoldCase: true}); len(ps) != 0 || d.Name != "a" {
		t.Errorf("FoldCase: got %v %+v", ps, d)
	}
	if _, ps, _ := Decode([]byte("Name: a\n"), &d, Options{}); len(ps) != 1 {
		t.Errorf("without FoldCase: got %v, want Name refused", ps)
	}
}

func TestDecodeBoundsAliasExpansion(t *testing.T) {
	// Each level doubles the last: 2^30 nodes if walked in full.
	var b strings.Builder
	b.WriteString("a0: &a0 [[], []]\n")
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d]\n", i, i, i-1, i-1)
	}
	b.WriteString("t: *a30\n")
	var d struct {
		T tree `yaml:"t"`
	}
	_, ps, err := Decode([]byte(b.String()), &d, Options{FoldCase: true})
	if len(ps) > maxProblems {
		t.Errorf("got %d problems, want at most %d", len(ps), maxProblems)
	}
	if err == nil {
		t.Error("got no error for a document of 2^30 nodes")
	}
}

// tree is a list of lists, as deep as the document.
type tree []tree

func TestSuggest(t *testing.T) {
	known := []string{"rate", "burst", "limit", "window", "algorithm"}
	for word, want := range map[string]string{
		"ratee": "rate", "brust": "burst", "widnow": "window", "algorithmm": "algorithm",
		"Limit": "limit", "zz": "", "x": "", "timeout": "",
	} {
		if got := Suggest(word, known); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", word, got, want)
		}
	}
}

// FuzzDecode: no document makes Decode panic, and every problem it reports is placed.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{"name: a\n", "list: [{d: 1s}, {dd: x}]\n", "block: &b {d: 1s}\nlist: [*b, *b]\n",
		"labels: {a: b, a: c}\n", "<<: {name: x}\n", "inner: {n: 1e400}\n", "rate: .inf\n", "words: [[a]]\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var d doc
		_, ps, err := Decode(data, &d, Options{FoldCase: true})
		if err != nil {
			return
		}
		for _, p := range ps {
			if p.Line < 1 || p.Col < 1 || p.Path == "" || p.Msg == "" {
				t.Fatalf("problem %+v is not placed", p)
			}
		}
	})
}
