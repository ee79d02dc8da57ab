package e2e

// The docs stay true: the commands they show run (those that can run offline, against the built
// binary; the others at least name a real subcommand, flag, make target or package), the configs
// they show validate, their relative links reach a file and heading that exist, and their prose
// names no test (docs_testnames_test.go).

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is where the documented commands run from.
const repoRoot = "../.."

// docFile is one Markdown page: its path from the repository root and its lines.
type docFile struct {
	path  string
	lines []string
}

func loadDocs(t *testing.T) []docFile {
	t.Helper()
	paths := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(more) == 0 {
		t.Fatal("no docs/*.md")
	}
	for _, p := range more {
		rel, _ := filepath.Rel(repoRoot, p)
		paths = append(paths, rel)
	}
	var docs []docFile
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(repoRoot, p))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, docFile{path: p, lines: strings.Split(string(b), "\n")})
	}
	return docs
}

// codeBlock is a fenced block: its info string (language), its first line number and its lines.
// marker is the HTML comment directly above the fence, if any (`<!-- file: PATH -->`).
type codeBlock struct {
	lang   string
	line   int
	lines  []string
	marker string
}

func fencedBlocks(d docFile) []codeBlock {
	var blocks []codeBlock
	var cur *codeBlock
	for i, l := range d.lines {
		trimmed := strings.TrimSpace(l)
		if cur == nil && strings.HasPrefix(trimmed, "```") {
			cur = &codeBlock{lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 1}
			if i > 0 {
				if m := fileMarker.FindStringSubmatch(strings.TrimSpace(d.lines[i-1])); m != nil {
					cur.marker = m[1]
				}
			}
			continue
		}
		if cur != nil && strings.HasPrefix(trimmed, "```") {
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		if cur != nil {
			cur.lines = append(cur.lines, l)
		}
	}
	return blocks
}

var fileMarker = regexp.MustCompile(`^<!--\s*file:\s*(\S+)\s*-->$`)

// proseLines returns the lines outside fenced blocks, with their line numbers.
func proseLines(d docFile) map[int]string {
	out := map[int]string{}
	in := false
	for i, l := range d.lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if !in {
			out[i+1] = l
		}
	}
	return out
}

// shellWords splits a command line as sh would for the simple lines docs show: words separated
// by blanks, single and double quotes, a comment from an unquoted `#` that starts a word.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			return words
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// docCommand is a command line shown in the docs, the output shown after it (console blocks)
// and where it was found.
type docCommand struct {
	where  string
	words  []string
	output []string
}

var envAssign = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`)

// commandsIn returns the commands of shell and console blocks (in console blocks, the lines after
// `$ `, each with the output lines that follow it) and of inline code spans in prose that start
// with `ratelimit-proxy ` or `make `.
func commandsIn(d docFile) []docCommand {
	var cmds []docCommand
	for _, b := range fencedBlocks(d) {
		switch b.lang {
		case "sh", "bash", "shell":
			for i, l := range b.lines {
				if w := shellWords(l); len(w) > 0 {
					cmds = append(cmds, docCommand{where: fmt.Sprintf("%s:%d", d.path, b.line+1+i), words: w})
				}
			}
		case "console":
			var last *docCommand
			for i, l := range b.lines {
				if rest, ok := strings.CutPrefix(l, "$ "); ok {
					cmds = append(cmds, docCommand{where: fmt.Sprintf("%s:%d", d.path, b.line+1+i), words: shellWords(rest)})
					last = &cmds[len(cmds)-1]
					continue
				}
				if last != nil {
					last.output = append(last.output, l)
				}
			}
		}
	}
	for n, l := range proseLines(d) {
		for _, m := range inlineCode.FindAllStringSubmatch(l, -1) {
			if strings.HasPrefix(m[1], "ratelimit-proxy ") || strings.HasPrefix(m[1], "make ") {
				cmds = append(cmds, docCommand{where: fmt.Sprintf("%s:%d", d.path, n), words: shellWords(m[1])})
			}
		}
	}
	return cmds
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// program returns the command's words without leading environment assignments, and the words
// after the first pipe or `&&` dropped.
func program(words []string) []string {
	for len(words) > 0 && envAssign.MatchString(words[0]) {
		words = words[1:]
	}
	for i, w := range words {
		if w == "|" || w == "&&" || w == ";" || w == ">" || w == "2>&1" {
			return words[:i]
		}
	}
	return words
}

// makeTargets returns the Makefile's targets.
func makeTargets(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9_-]*):`).FindAllStringSubmatch(string(b), -1) {
		targets = append(targets, m[1])
	}
	return targets
}

func runDocBinary(t *testing.T, args []string) (code int, stdout, stderr string) {
	t.Helper()
	return runBinary(t, func(cmd *exec.Cmd) {
		cmd.Dir = repoRoot
		// The race runtime waits a second at exit (atexit_sleep_ms) for reports of other
		// goroutines; these commands start none worth the wait, and the docs show dozens of them.
		cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}, args...)
}

// TestDocsCommands runs every `ratelimit-proxy validate --config FILE` (FILE in the repository)
// and `ratelimit-proxy --version` shown in README.md and docs/, against the built binary, and
// compares the output a console block shows with the real one. A gateway command that cannot
// run offline (serve, table create, a placeholder FILE) must still name a real subcommand and
// flags (checked with --help); `make X` must name a Makefile target; `go test ./pkg/` a package
// that exists.
func TestDocsCommands(t *testing.T) {
	targets := makeTargets(t)
	ran, checked := 0, 0
	// The same command is often shown several times; run each once.
	type result struct {
		code        int
		out, stderr string
	}
	memo := map[string]result{}
	run := func(args []string) (int, string, string) {
		k := strings.Join(args, "\x00")
		r, ok := memo[k]
		if !ok {
			r.code, r.out, r.stderr = runDocBinary(t, args)
			memo[k] = r
		}
		return r.code, r.out, r.stderr
	}
	for _, d := range loadDocs(t) {
		for _, c := range commandsIn(d) {
			w := program(c.words)
			if len(w) == 0 {
				continue
			}
			switch {
			case w[0] == "ratelimit-proxy" || strings.HasSuffix(w[0], "/ratelimit-proxy"):
				args := w[1:]
				if runnableOffline(args) {
					ran++
					code, out, errs := run(args)
					if code != 0 {
						t.Errorf("%s: ratelimit-proxy %s: exit %d\n%s%s", c.where, strings.Join(args, " "), code, out, errs)
						continue
					}
					if want := trimOutput(c.output); len(want) > 0 {
						if got := trimOutput(strings.Split(out, "\n")); !slices.Equal(got, want) {
							t.Errorf("%s: ratelimit-proxy %s printed\n%s\nthe docs show\n%s", c.where,
								strings.Join(args, " "), strings.Join(got, "\n"), strings.Join(want, "\n"))
						}
					}
					continue
				}
				checked++
				checkGatewayCommand(t, c.where, args, run)
			case w[0] == "make":
				checked++
				for _, target := range w[1:] {
					if !strings.HasPrefix(target, "-") && !strings.Contains(target, "=") && !slices.Contains(targets, target) {
						t.Errorf("%s: make %s: no such target in the Makefile (targets: %v)", c.where, target, targets)
					}
				}
			case w[0] == "go":
				checked++
				for _, a := range w[1:] {
					if strings.HasPrefix(a, "./") {
						p := strings.TrimSuffix(strings.TrimSuffix(a, "..."), "/")
						if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
							t.Errorf("%s: go ... %s: %v", c.where, a, err)
						}
					}
				}
			}
		}
	}
	// The README shows at least the example's and the minimal config's validate and the version.
	if ran < 3 {
		t.Errorf("ran %d documented commands, want at least 3: the docs lost their runnable examples or the parser broke", ran)
	}
	if checked < 5 {
		t.Errorf("checked %d documented commands that cannot run offline, want at least 5", checked)
	}
	t.Logf("ran %d documented commands, checked %d others", ran, checked)
}

// runnableOffline reports whether a gateway command can run here: --version, or validate with a
// --config that exists in the repository.
func runnableOffline(args []string) bool {
	if slices.Equal(args, []string{"--version"}) {
		return true
	}
	if len(args) != 3 || args[0] != "validate" || (args[1] != "--config" && args[1] != "-c") {
		return false
	}
	_, err := os.Stat(filepath.Join(repoRoot, args[2]))
	return err == nil && !filepath.IsAbs(args[2])
}

// checkGatewayCommand runs the command with --help: cobra rejects unknown flags before it prints
// help, and the usage line names the subcommand it found (an unknown word leaves its parent's).
// The subcommand is the leading words of lower-case letters and hyphens; the words after it
// (FILE, access.log, [LOG ...]) are arguments.
func checkGatewayCommand(t *testing.T, where string, args []string, run func([]string) (int, string, string)) {
	t.Helper()
	var sub []string
	for _, a := range args {
		if !subcommandWord.MatchString(a) {
			break
		}
		sub = append(sub, a)
	}
	code, out, errs := run(append(slices.Clone(args), "--help"))
	if code != 0 {
		t.Errorf("%s: ratelimit-proxy %s --help: exit %d\n%s%s", where, strings.Join(args, " "), code, out, errs)
		return
	}
	usage := strings.Join(append([]string{"ratelimit-proxy"}, sub...), " ")
	found := false
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == usage || strings.HasPrefix(l, usage+" ") {
			found = true
		}
	}
	if !found {
		t.Errorf("%s: ratelimit-proxy %s: no such command (no usage line starts with %q):\n%s", where, strings.Join(args, " "), usage, out)
	}
}

var subcommandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

func trimOutput(lines []string) []string {
	var out []string
	for _, l := range lines {
		out = append(out, strings.TrimRight(l, " \t"))
	}
	for len(out) > 0 && out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

// TestDocsConfigs validates every YAML block of the docs that is a whole configuration (it has
// top-level `upstream:` and `policies:`), and checks that a block marked `<!-- file: PATH -->`
// is exactly that file.
func TestDocsConfigs(t *testing.T) {
	n := 0
	for _, d := range loadDocs(t) {
		for _, b := range fencedBlocks(d) {
			text := strings.Join(b.lines, "\n") + "\n"
			where := fmt.Sprintf("%s:%d", d.path, b.line)
			if b.marker != "" {
				want, err := os.ReadFile(filepath.Join(repoRoot, b.marker))
				if err != nil {
					t.Errorf("%s: marked as %s: %v", where, b.marker, err)
				} else if string(want) != text {
					t.Errorf("%s: the block differs from %s; copy the file into the docs", where, b.marker)
				}
			}
			if b.lang != "yaml" || !hasTopLevel(b.lines, "upstream") || !hasTopLevel(b.lines, "policies") {
				continue
			}
			n++
			f := filepath.Join(t.TempDir(), "doc.yaml")
			if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if code, out, errs := runDocBinary(t, []string{"validate", "--config", f}); code != 0 {
				t.Errorf("%s: the configuration shown does not validate (exit %d):\n%s%s", where, code, out, errs)
			}
		}
	}
	if n == 0 {
		t.Error("no whole configuration in the docs: the README's minimal config is gone or the parser broke")
	}
}

func hasTopLevel(lines []string, key string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, key+":") {
			return true
		}
	}
	return false
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks checks that every relative link in README.md and docs/ reaches an existing file
// and, with a #fragment into a Markdown file, an existing heading (GitHub's anchors).
func TestDocsLinks(t *testing.T) {
	docs := loadDocs(t)
	anchorCache := map[string][]string{}
	anchors := func(path string) []string {
		if a, ok := anchorCache[path]; ok {
			return a
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			return nil
		}
		a := headingAnchors(docFile{path: path, lines: strings.Split(string(b), "\n")})
		anchorCache[path] = a
		return a
	}
	n := 0
	for _, d := range docs {
		for ln, l := range proseLines(d) {
			l = inlineCode.ReplaceAllString(l, "")
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				n++
				where := fmt.Sprintf("%s:%d", d.path, ln)
				file, frag, _ := strings.Cut(target, "#")
				path := d.path
				if file != "" {
					path = filepath.Clean(filepath.Join(filepath.Dir(d.path), file))
					if strings.HasPrefix(path, "..") {
						t.Errorf("%s: link %s leaves the repository", where, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(repoRoot, path)); err != nil {
						t.Errorf("%s: link %s: %s does not exist", where, target, path)
						continue
					}
				}
				if frag != "" {
					if !strings.HasSuffix(path, ".md") {
						t.Errorf("%s: link %s: a fragment into a file that is not Markdown", where, target)
					} else if !slices.Contains(anchors(path), frag) {
						t.Errorf("%s: link %s: %s has no heading with the anchor #%s (it has %v)", where, target, path, frag, anchors(path))
					}
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("found %d relative links, want at least 10: the parser broke", n)
	}
}

// headingAnchors returns the anchors GitHub gives a page's headings: lower case, everything but
// letters, digits, spaces, `-` and `_` dropped, spaces as `-`, a repeated anchor suffixed -1, -2.
func headingAnchors(d docFile) []string {
	var out []string
	seen := map[string]int{}
	in := false
	for _, l := range d.lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if in || !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, k))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
